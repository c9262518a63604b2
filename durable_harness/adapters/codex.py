"""The codex agent: the real ``codex`` CLI (OpenAI Codex 0.171.0) behind the journaling proxy.

Built like the claude-code agent (:mod:`.claude_code`); what is Codex's own:

* model calls: Codex speaks the OpenAI Responses API; its ``config.toml`` names one model
  provider whose ``base_url`` is the proxy (``/v1/responses``, :mod:`.wire_responses`)
  and whose key variable holds the per-launch token, never a provider key. Requests are
  keyed by :class:`~.canonical_codex.CodexCanonicalizer`;
* tool calls: ``$CODEX_HOME/hooks.json`` has Claude Code's hook shape (``PreToolUse``
  with ``tool_name``, ``tool_input``, ``tool_use_id`` = the call id; deny and exit 2 block
  the tool), so :class:`~.hooks.ToolHooks` journals them; the shell tool (``exec_command``)
  is reported as ``Bash`` with ``{"command": …}`` and labelled like Claude Code's Bash
  (``never`` unless a ``safe_bash`` pattern marks the command safe);
* the session record is the thread's rollout file (:mod:`.codex_session`), saved before
  every tool intent and restored into a fresh ``CODEX_HOME`` for ``codex exec resume``;
* a resumed launch gets the same journal-written message as Claude Code
  (:func:`~.claude_session.compose_resume_message`).

Codex is meant to run only inside Docker; until that launcher exists it runs on a host
folder under :mod:`.host_launch`, and only with the developer opt-in.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_harness.adapters import hook_client
from durable_harness.adapters.base import Adapter, TurnRun
from durable_harness.adapters.canonical_codex import CodexCanonicalizer
from durable_harness.adapters.claude_code import workspace_of
from durable_harness.adapters.claude_session import (
    LAUNCH_PREFIX,
    TranscriptStore,
    compose_resume_message,
)
from durable_harness.adapters.codex_session import (
    Rollout,
    latest_turn_rollout,
    lost_reply,
    point,
    previous_turn_rollout,
    rollout_facts,
)
from durable_harness.adapters.hooks import ClaudeCodeConfig, ReplayPolicy, ToolHooks
from durable_harness.adapters.host_launch import require_host_opt_in, run_on_host
from durable_harness.adapters.proxy import JournalingProxy, ProxyCallbacks, Upstream
from durable_harness.harness.errors import (
    ConfigError,
    DurableHarnessError,
    ModelError,
    ReplayDivergence,
    TurnFailed,
)
from durable_harness.harness.journal import BLOB_PREFIX, Journal, Outcome, StepResult, decode_output
from durable_harness.harness.model import LOOPBACK_KEY, is_loopback
from durable_harness.harness.settings import Settings
from durable_harness.harness.tools import Replay
from durable_harness.worlds.base import Step, StepStatus, World

__all__ = ["CODEX_VERSION", "CodexAdapter", "find_codex"]

#: The one Codex version this adapter's rules were measured on (scripts/setup).
CODEX_VERSION = "0.171.0"
BIN_ENV = "DURABLE_HARNESS_CODEX_BIN"
RETRIES_ENV = "DURABLE_HARNESS_CODEX_MAX_RETRIES"
DEFAULT_CLI_RETRIES = "2"
TOKEN_ENV = "DURABLE_HARNESS_CODEX_TOKEN"  # the variable Codex reads its "API key" from
PROVIDER = "durable-harness"
DEFAULT_BASE_URL = "https://api.openai.com"
#: The model a turn asks for when it names none but the harness-wide default (a Claude
#: model, which no OpenAI-compatible endpoint serves).
DEFAULT_MODEL = "gpt-5-codex"
_REPO_BIN = Path(__file__).resolve().parents[2] / ".tools" / "npm" / "node_modules" / ".bin"
_HOOK_EVENTS = ("SessionStart", "PreToolUse", "PostToolUse")
_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")
_FLUSH_WAIT = 3.0  # seconds the rollout may take to show a tool call before a save
_HOOKS_WAIT = 10.0  # seconds the first model call waits for proof the hooks are live
_PASSED_ENV = ("PATH", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
_THREAD_IN_NAME = re.compile(
    r"-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$"
)
_versions_seen: dict[str, str] = {}


def find_codex() -> str:
    """The ``codex`` binary: $DURABLE_HARNESS_CODEX_BIN, the pinned install, or PATH."""
    override = os.environ.get(BIN_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise ConfigError(f"{BIN_ENV}={override!r} is not an executable file")
        return override
    pinned = _REPO_BIN / "codex"
    if os.access(pinned, os.X_OK):
        return str(pinned)
    found = shutil.which("codex")
    if found is None:
        raise ConfigError(
            f"Codex is not installed: run scripts/setup (it installs @openai/codex@"
            f"{CODEX_VERSION} into .tools/npm), or set {BIN_ENV} to a codex binary of that version"
        )
    return found


def check_version(binary: str) -> None:
    """ConfigError unless ``binary --version`` is exactly :data:`CODEX_VERSION`."""
    version = _versions_seen.get(binary)
    if version is None:
        try:
            out = subprocess.run(
                [binary, "--version"], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run {binary} --version: {exc}") from None
        version = (out.stdout.split() or ["(nothing)"])[-1]
        _versions_seen[binary] = version
    if version != CODEX_VERSION:
        raise ConfigError(
            f"{binary} is Codex {version}, but durable-harness needs exactly {CODEX_VERSION} "
            f"(its request canonicalization is measured on that version): run scripts/setup, "
            f"or point {BIN_ENV} at that version"
        )


def resolve_openai_endpoint(base_url: str | None) -> tuple[str, str]:
    """``(base_url, api_key)`` of the OpenAI-compatible upstream (the harness's own key)."""
    url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    key = os.environ.get("OPENAI_API_KEY", "")
    if not key:
        if not is_loopback(url):
            raise ConfigError(
                f"no API key for {url}: set OPENAI_API_KEY, or point OPENAI_BASE_URL at a "
                "local endpoint (e.g. `durable-harness fake-model`)"
            )
        key = LOOPBACK_KEY
    return url.rstrip("/").removesuffix("/v1"), key


def codex_model(config: dict[str, Any]) -> str:
    """The turn's model; the harness-wide default (a Claude model) means Codex's default."""
    model = str(config.get("model") or "")
    return DEFAULT_MODEL if model in ("", Settings.model_fields["model"].default) else model


def host_workspace(config: dict[str, Any]) -> Path:
    """The host folder Codex runs in (developer opt-in only; see :mod:`.host_launch`)."""
    if str(config.get("workspace", "virtual")) == "docker":
        raise ConfigError(
            "the Docker workspace cannot host the codex agent in this version yet; it is "
            "the only supported place for it (issue #6)"
        )
    require_host_opt_in("codex")
    return workspace_of(config)


class CodexAdapter(Adapter):
    name = "codex"

    def check(self, config: dict[str, Any], settings: Any) -> None:
        host_workspace(config)
        if config.get("tools"):
            raise ConfigError(
                "the codex agent cannot serve --tools host tools yet; run it without them"
            )
        ClaudeCodeConfig.parse(config.get("agent_config"), "in the turn")
        resolve_openai_endpoint(config.get("base_url"))
        check_version(find_codex())

    def run_turn(self, run: TurnRun) -> str:
        host_workspace(run.config)
        if run.journal.replay_only:
            return _replay(run)
        journal = run.journal
        launches = _launch_steps(journal)
        if launches and launches[-1].status is StepStatus.DONE:
            return str(decode_output(run.world, launches[-1])["reply"])
        launch = _Launch(run)
        plan = launch.plan(len(launches))
        begun = journal.begin_keyed(
            kind="agent",
            name=self.name,
            key=f"{LAUNCH_PREFIX}{len(launches)}",
            input=plan,
            replay="safe",
            store_input=True,
        )
        if isinstance(begun, StepResult):  # cannot happen: the key is new
            return str(begun.value["reply"])
        result = launch.run(plan)
        journal.end(begun, Outcome(result, {"source": "cli"}))
        return str(result["reply"])


def _launch_steps(journal: Journal) -> list[Step]:
    steps = sorted(journal.recorded.values(), key=lambda s: s.seq)
    return [s for s in steps if s.key.startswith(LAUNCH_PREFIX)]


def _replay(run: TurnRun) -> str:
    """Run the turn's last finished launch again, the proxy answering from the journal."""
    done = [s for s in _launch_steps(run.journal) if s.status is StepStatus.DONE]
    if not done:
        raise ReplayDivergence(f"turn {run.turn.turn_id} has no finished launch of the CLI")
    plan = json.loads(_stored_input(run.world, done[-1]))
    return str(_Launch(run).run(plan)["reply"])


def _stored_input(world: World, step: Step) -> str:
    text = step.input or "{}"
    if text.startswith(BLOB_PREFIX):
        return world.get_blob(text.removeprefix(BLOB_PREFIX)).decode()
    return text


@dataclass
class _Output:
    thread: str | None = None
    replies: list[str] = field(default_factory=list)
    completed: bool = False
    failure: str | None = None


class _Launch:
    """One run of the CLI for a turn."""

    def __init__(self, run: TurnRun) -> None:
        self.run_ = run
        self.world = run.world
        self.journal = run.journal
        self.turn = run.turn
        self.workspace = host_workspace(run.config)
        self.config = ClaudeCodeConfig.parse(run.config.get("agent_config"), "in the turn")
        self.store = TranscriptStore(self.world)
        self._save_lock = threading.Lock()

    # -- what to run -----------------------------------------------------------------
    def plan(self, number: int) -> dict[str, Any]:
        """How launch ``number`` starts: mode, message and the rollout to restore."""
        turn, epoch = self.turn, self.journal.lease.epoch
        saved = latest_turn_rollout(self.world, turn.session_id, turn.turn_id, epoch)
        if saved is None:
            previous = previous_turn_rollout(self.world, turn.session_id, turn.index)
            return {
                "mode": "resume" if previous is not None else "new",
                "message": turn.prompt,
                "rollout": previous.as_json() if previous is not None else None,
            }
        self._close_interrupted()
        steps = sorted(self.journal.recorded.values(), key=lambda s: s.seq)
        facts = rollout_facts(self.world, steps, self.store.load(saved.transcript))
        message = compose_resume_message(self.world, turn.prompt, steps, facts, lost_reply)
        return {"mode": "resume", "message": message, "rollout": saved.as_json(), "launch": number}

    def _close_interrupted(self) -> None:
        """Finish every interrupted ``never`` tool call *possibly ran* (it will not rerun)."""
        policy = CodexReplayPolicy(self.config)
        for step in list(self.journal.recorded.values()):
            if step.kind != "tool" or step.status is not StepStatus.INTENT:
                continue
            tool_input = json.loads(_stored_input(self.world, step))
            if policy.label(step.name, tool_input) == "never":
                self.journal.begin_keyed(
                    kind="tool", name=step.name, key=step.key, input=tool_input, replay="never"
                )

    # -- running it ----------------------------------------------------------------------
    def run(self, plan: dict[str, Any]) -> dict[str, Any]:
        binary = find_codex()
        check_version(binary)
        url, key = resolve_openai_endpoint(self.run_.config.get("base_url"))
        token = secrets.token_urlsafe(32)
        restored = Rollout.of(plan.get("rollout"))
        with tempfile.TemporaryDirectory(prefix="durable-harness-codex-") as tmp:
            home = Path(tmp)
            codex_home = home / ".codex"
            codex_home.mkdir()
            if restored is not None:
                target = codex_home / restored.path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(self.store.load(restored.transcript))
            hooks = ToolHooks(
                self.journal,
                CodexReplayPolicy(self.config),
                host_tool_prefix="mcp__durable-harness__",
                before_intent=None if self.journal.replay_only else self._saver(codex_home),
            )
            callbacks = ProxyCallbacks(on_request=self._on_request(hooks), control=hooks.handle)
            proxy = JournalingProxy(
                self.journal,
                CodexCanonicalizer(home=str(home)),
                Upstream(url, key, send_key=is_loopback(url)),
                token,
                callbacks,
            )
            output = _Output(thread=restored.thread if restored else None)
            with proxy:
                self._write_config(codex_home, proxy.url, token)
                exited = run_on_host(
                    self._command(binary, plan, output.thread),
                    cwd=self.workspace,
                    env=self._env(home, codex_home, token),
                    on_line=lambda line: self._event(line, output),
                    stop=proxy.fatal_event,
                )
            if proxy.fatal is not None:
                raise proxy.fatal
            reply = self._reply(output, exited.status, exited.stderr, proxy)
            final = self._final_rollout(codex_home, output.thread)
        result: dict[str, Any] = {"reply": reply, "thread": output.thread}
        if not self.journal.replay_only and final is not None:
            path, data = final
            saved = self.store.save(data)
            rollout = Rollout(str(output.thread), path, saved.digest)
            result["rollout"] = rollout.as_json()
        return result

    def _saver(self, codex_home: Path) -> Any:
        def before_intent(reported: str | None, tool_use_id: str) -> None:
            if not reported:
                raise DurableHarnessError("Codex's hook named no rollout file to save")
            rollout = Path(reported)
            match = _THREAD_IN_NAME.search(rollout.name)
            if match is None or not rollout.is_relative_to(codex_home):
                raise DurableHarnessError(f"Codex's rollout file is not where expected: {reported}")
            # Wait (briefly) until the rollout holds this call, so a resume from this save
            # knows the call exists.
            deadline = time.monotonic() + _FLUSH_WAIT
            data = b""
            while time.monotonic() < deadline:
                data = rollout.read_bytes() if rollout.exists() else b""
                if tool_use_id.encode() in data:
                    break
                time.sleep(0.01)
            with self._save_lock:
                saved = self.store.save(data)
                relative = str(rollout.relative_to(codex_home))
                turn, epoch = self.turn, self.journal.lease.epoch
                point(
                    self.world,
                    turn.session_id,
                    turn.turn_id,
                    epoch,
                    Rollout(match.group(1), relative, saved.digest),
                )

        return before_intent

    def _on_request(self, hooks: ToolHooks) -> Any:
        def on_request(body: dict[str, Any]) -> None:
            if not hooks.wait_started(_HOOKS_WAIT):
                raise ConfigError(
                    "Codex did not run the durable-harness hooks (no SessionStart arrived), "
                    "so its tool calls could not be journaled: the turn was stopped before "
                    "any tool ran"
                )
            _close_from_request(hooks, body)

        return on_request

    def _write_config(self, codex_home: Path, url: str, token: str) -> None:
        endpoint = codex_home / "durable-harness-endpoint.json"
        endpoint.write_text(json.dumps({"url": url, "token": token}))
        endpoint.chmod(0o600)
        client = [sys.executable, "-I", "-S", hook_client.__file__, str(endpoint)]
        hooks = {
            event: [
                {
                    "matcher": "*",
                    "hooks": [
                        {"type": "command", "command": shlex.join([*client, event]), "timeout": 600}
                    ],
                }
            ]
            for event in _HOOK_EVENTS
        }
        (codex_home / "hooks.json").write_text(json.dumps({"hooks": hooks}, indent=1))
        model = codex_model(self.run_.config)
        retries = int(os.environ.get(RETRIES_ENV, DEFAULT_CLI_RETRIES))
        config = (
            f"model = {json.dumps(model)}\n"
            f'model_provider = "{PROVIDER}"\n'
            'approval_policy = "never"\n'
            'sandbox_mode = "danger-full-access"\n'
            f'\n[model_providers."{PROVIDER}"]\n'
            f'name = "{PROVIDER}"\n'
            f"base_url = {json.dumps(url + '/v1')}\n"
            'wire_api = "responses"\n'
            f'env_key = "{TOKEN_ENV}"\n'
            f"request_max_retries = {retries}\n"
            f"stream_max_retries = {retries}\n"
        )
        (codex_home / "config.toml").write_text(config)

    def _command(self, binary: str, plan: dict[str, Any], thread: str | None) -> list[str]:
        command = [
            binary,
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--dangerously-bypass-hook-trust",  # hooks.json is ours, written per launch
        ]
        if plan["mode"] == "resume":
            if thread is None:
                raise DurableHarnessError("a resumed Codex launch has no thread to resume")
            command += ["resume", thread]
        return [*command, "--", str(plan["message"])]

    def _env(self, home: Path, codex_home: Path, token: str) -> dict[str, str]:
        env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update(
            {
                "HOME": str(home),
                "CODEX_HOME": str(codex_home),
                "SHELL": shutil.which("bash") or "/bin/sh",
                "TERM": "dumb",
                TOKEN_ENV: token,  # the proxy's per-launch token, never a provider key
            }
        )
        return env

    def _event(self, line: bytes, output: _Output) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        item: dict[str, Any] = event["item"] if isinstance(event.get("item"), dict) else {}
        if kind == "thread.started" and isinstance(event.get("thread_id"), str):
            output.thread = event["thread_id"]
        elif kind == "turn.completed":
            output.completed = True
        elif kind == "turn.failed":
            error = event.get("error") or {}
            output.failure = str(error.get("message") if isinstance(error, dict) else error)
        elif kind == "item.completed" and item.get("type") == "agent_message":
            output.replies.append(str(item.get("text") or ""))
            self._progress(f"codex: {item.get('text')}")
        elif kind == "item.started" and item.get("type") == "command_execution":
            self._progress(f"codex: $ {item.get('command')}")

    def _progress(self, text: str) -> None:
        if self.journal.on_step is not None:  # not --quiet
            text = text.replace("\n", " ")
            sys.stderr.write(f"  {text[:160]}\n")
            sys.stderr.flush()

    def _reply(
        self, output: _Output, status: int | None, stderr: str, proxy: JournalingProxy
    ) -> str:
        upstream = "; ".join(dict.fromkeys(proxy.upstream_errors[-3:])) or None
        if output.completed:
            return output.replies[-1] if output.replies else ""
        if output.failure is not None or upstream:
            if upstream:
                raise ModelError(f"the model call failed ({upstream}); the turn will be resumed")
            raise TurnFailed(f"Codex ended the turn with an error: {output.failure}")
        raise DurableHarnessError(
            f"Codex exited with status {status} without finishing the turn: "
            f"{stderr.strip()[-500:] or 'no output'}"
        )

    def _final_rollout(self, codex_home: Path, thread: str | None) -> tuple[str, bytes] | None:
        if thread is None:
            return None
        found = sorted((codex_home / "sessions").glob(f"**/rollout-*-{thread}.jsonl"))
        if not found:
            return None
        return str(found[-1].relative_to(codex_home)), found[-1].read_bytes()


def _close_from_request(hooks: ToolHooks, body: dict[str, Any]) -> None:
    """Record, from a model request, the output of a call whose PostToolUse never came."""
    items = body.get("input")
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("type") in _OUTPUT_ITEMS:
            value = {"tool_output": item.get("output")}
            hooks.close_open(str(item.get("call_id")), value, "proxy")


class CodexReplayPolicy(ReplayPolicy):
    """Claude Code's labels, with Codex's tool names: Codex reports its shell tool
    ``exec_command`` to the hooks as ``Bash``, so a label given to either name applies."""

    ALIASES = {"Bash": "exec_command"}

    def label(self, tool_name: str, tool_input: Any) -> Replay:
        overrides = self.config.replay.tools
        alias = self.ALIASES.get(tool_name)
        if alias is not None and tool_name not in overrides and alias in overrides:
            return overrides[alias]
        return super().label(tool_name, tool_input)
