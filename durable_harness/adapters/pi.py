"""The pi agent: the real ``pi`` CLI (``@mariozechner/pi-coding-agent``) behind the proxy.

Pi speaks the Anthropic Messages API to a provider named in its ``models.json``; the
adapter points that provider at the journaling proxy, so every model call is a journal
step keyed by its canonical request (:class:`~.canonical_pi.PiCanonicalizer`), exactly as
for Claude Code. The rest mirrors :mod:`.claude_code`:

* one turn is one or more **launches** (journal steps ``launch:<n>``, kind ``agent``);
* Pi's tool calls are journaled by an extension (``pi_extension.js``) that posts
  Claude-Code-shaped hook payloads to :class:`~.hooks.ToolHooks` (fail closed: a tool
  never runs unless its intent was recorded), with :class:`PiReplayPolicy` labels; the
  user's host tools are registered as Pi tools that call the harness's MCP endpoint
  (Pi itself has no MCP client);
* Pi's session file (``--session <file>``, set up front) is saved to the World before
  every tool intent and after the launch, restored for a resume, and the resumed CLI is
  told from the journal what happened to each call (:func:`~.claude_session.resume_message`).

The CLI runs with a private HOME per launch holding ``~/.pi/agent/models.json`` (the
proxy's URL and a per-launch token as the API key, never a provider key) and
``settings.json``; extension, skill, prompt-template and theme discovery are off, so
nothing in the workspace can switch the journaling extension off. How the process is
started and supervised is :mod:`.cli_process` (the seam a Docker launcher replaces).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_harness.adapters.base import Adapter, TurnRun
from durable_harness.adapters.claude_session import (
    LAUNCH_PREFIX,
    TranscriptStore,
    latest_turn_transcript,
    previous_turn_transcript,
    resume_message,
)
from durable_harness.adapters.cli_process import (
    host_workspace,
    launch_steps,
    progress,
    run_supervised,
    stored_input,
)
from durable_harness.adapters.hooks import ReplayPolicy, ToolHooks
from durable_harness.adapters.mcp import HostToolServer
from durable_harness.adapters.pi_session import pi_session_facts
from durable_harness.adapters.provider_api import (
    PiConfig,
    anthropic_view,
    pi_canonicalizer,
    pi_provider,
)
from durable_harness.adapters.proxy import JournalingProxy, ProxyCallbacks, Upstream
from durable_harness.harness.errors import (
    ConfigError,
    DurableHarnessError,
    ModelError,
    ReplayDivergence,
    TurnFailed,
)
from durable_harness.harness.journal import Outcome, StepResult, decode_output
from durable_harness.harness.model import is_loopback, resolve_endpoint
from durable_harness.harness.settings import Settings
from durable_harness.harness.tools import Replay, Tool, load_tools
from durable_harness.worlds.base import StepStatus

__all__ = ["PI_VERSION", "PiAdapter", "PiReplayPolicy", "find_pi"]

#: The one Pi version this adapter's rules were measured on (scripts/setup).
PI_VERSION = "0.73.1"
BIN_ENV = "DURABLE_HARNESS_PI_BIN"
RETRIES_ENV = "DURABLE_HARNESS_PI_MAX_RETRIES"
DEFAULT_CLI_RETRIES = 2
ENDPOINT_ENV = "DURABLE_HARNESS_PI_ENDPOINT"  # read by pi_extension.js
PROVIDER = "durable-harness"
RECORD_PREFIX = "pi"  # session records pi/<turn>/<epoch>
EXTENSION = Path(__file__).with_name("pi_extension.js")
#: Pi's built-in tools that only read; bash, edit, write (and anything else) are ``never``.
SAFE_TOOLS = frozenset({"read", "grep", "find", "ls"})
BUILTIN_TOOLS = SAFE_TOOLS | {"bash", "edit", "write"}
_REPO_BIN = Path(__file__).resolve().parents[2] / ".tools" / "npm" / "node_modules" / ".bin"
_FLUSH_WAIT = 3.0  # seconds the session file may take to show a tool call before a save
_HOOKS_WAIT = 10.0  # seconds the first model call waits for proof the extension is live
_PASSED_ENV = ("PATH", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
_versions_seen: dict[str, str] = {}


def find_pi() -> str:
    """The ``pi`` binary: $DURABLE_HARNESS_PI_BIN, the project's pinned install
    (``.tools/npm``, made by scripts/setup), or PATH. ConfigError if none."""
    override = os.environ.get(BIN_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise ConfigError(f"{BIN_ENV}={override!r} is not an executable file")
        return override
    pinned = _REPO_BIN / "pi"
    if os.access(pinned, os.X_OK):
        return str(pinned)
    found = shutil.which("pi")
    if found is None:
        raise ConfigError(
            f"Pi is not installed: run scripts/setup (it installs "
            f"@mariozechner/pi-coding-agent@{PI_VERSION} into .tools/npm), or set "
            f"{BIN_ENV} to a pi binary of that version"
        )
    return found


def check_version(binary: str) -> None:
    """ConfigError unless ``binary --version`` is exactly :data:`PI_VERSION`."""
    version = _versions_seen.get(binary)
    if version is None:
        try:
            out = subprocess.run(
                [binary, "--version"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "PI_OFFLINE": "1"},
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run {binary} --version: {exc}") from None
        # Pi prints its version on stderr.
        version = ((out.stdout + out.stderr).split() or ["(nothing)"])[0]
        _versions_seen[binary] = version
    if version != PI_VERSION:
        raise ConfigError(
            f"{binary} is Pi {version}, but durable-harness needs exactly {PI_VERSION} "
            f"(its request canonicalization is measured on that version): run "
            f"scripts/setup, or point {BIN_ENV} at that version"
        )


def package_dir(binary: str) -> str:
    """The folder Pi is installed in (``…/pi-coding-agent``), named in its system prompt."""
    return str(Path(binary).resolve().parents[1])


class PiReplayPolicy(ReplayPolicy):
    """Replay labels of Pi's tools: ``read``/``grep``/``find``/``ls`` are safe; ``bash`` is
    safe only for a command the agent config's ``safe_bash`` patterns match; the rest
    ``never``. ``[replay] tools`` overrides any of them by name."""

    def label(self, tool_name: str, tool_input: Any) -> Replay:
        override = self.config.replay.tools.get(tool_name)
        if override is not None:
            return override
        if (
            tool_name == "bash"
            and isinstance(tool_input, dict)
            and self.safe_command(str(tool_input.get("command", "")).strip())
        ):
            return "safe"
        return "safe" if tool_name in SAFE_TOOLS else "never"


class PiAdapter(Adapter):
    name = "pi"

    def check(self, config: dict[str, Any], settings: Settings) -> None:
        host_workspace(config, self.name)
        for spec in config.get("tools", []):
            for tool in load_tools(spec):
                if tool.name in BUILTIN_TOOLS:
                    raise ConfigError(
                        f"host tool {tool.name!r} has the name of a Pi built-in tool; rename it"
                    )
        PiConfig.parse(config.get("agent_config"), "in the turn")
        resolve_endpoint(config.get("base_url"))
        check_version(find_pi())

    def run_turn(self, run: TurnRun) -> str:
        journal = run.journal
        if journal.replay_only:
            return _replay(run)
        launches = launch_steps(journal)
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


def _replay(run: TurnRun) -> str:
    """Run the turn's last finished launch again, the proxy answering from the journal."""
    done = [s for s in launch_steps(run.journal) if s.status is StepStatus.DONE]
    if not done:
        raise ReplayDivergence(f"turn {run.turn.turn_id} has no finished launch of the CLI")
    plan = json.loads(stored_input(run.world, done[-1]))
    return str(_Launch(run).run(plan)["reply"])


@dataclass
class _Events:
    """What a launch's ``--mode json`` output said."""

    last_assistant: dict[str, Any] | None = None  # the newest finished assistant message
    ended: bool = False  # agent_end arrived: Pi finished the turn


class _Launch:
    """One run of the CLI for a turn (see the module docstring)."""

    def __init__(self, run: TurnRun) -> None:
        self.run_ = run
        self.world = run.world
        self.journal = run.journal
        self.turn = run.turn
        self.workspace = host_workspace(run.config, "pi")
        self.config = PiConfig.parse(run.config.get("agent_config"), "in the turn")
        specs = run.config.get("tools", [])
        self.tools: list[Tool] = [t for spec in specs for t in load_tools(spec)]
        self.store = TranscriptStore(self.world, record_prefix=RECORD_PREFIX)
        self._save_lock = threading.Lock()

    # -- what to run -----------------------------------------------------------------
    def plan(self, number: int) -> dict[str, Any]:
        """How launch ``number`` starts: the message and the session file to restore."""
        turn, epoch = self.turn, self.journal.lease.epoch
        saved = latest_turn_transcript(
            self.world, turn.session_id, turn.turn_id, epoch, record_prefix=RECORD_PREFIX
        )
        if saved is None:
            previous = previous_turn_transcript(self.world, turn.session_id, turn.index)
            mode = "resume" if previous is not None else "new"
            return {"mode": mode, "message": turn.prompt, "transcript": previous}
        self._close_interrupted()
        steps = sorted(self.journal.recorded.values(), key=lambda s: s.seq)
        message = resume_message(
            self.world, turn.prompt, steps, self.store.load(saved), facts_of=pi_session_facts
        )
        return {"mode": "resume", "message": message, "transcript": saved, "launch": number}

    def _close_interrupted(self) -> None:
        """Finish every interrupted ``never`` tool call *possibly ran* (it will not rerun)."""
        policy = PiReplayPolicy(self.config)
        host = {t.name: t for t in self.tools}
        for step in list(self.journal.recorded.values()):
            if step.kind != "tool" or step.status is not StepStatus.INTENT:
                continue
            tool_input = json.loads(stored_input(self.world, step))
            host_tool = host.get(step.name)
            label = host_tool.replay if host_tool else policy.label(step.name, tool_input)
            if label == "never":
                self.journal.begin_keyed(
                    kind="tool", name=step.name, key=step.key, input=tool_input, replay="never"
                )

    # -- running it ----------------------------------------------------------------------
    def run(self, plan: dict[str, Any]) -> dict[str, Any]:
        binary = find_pi()
        check_version(binary)
        url, key = resolve_endpoint(self.run_.config.get("base_url"))
        token = secrets.token_urlsafe(32)
        model = str(self.run_.config.get("model") or self.run_.settings.model)
        events = _Events()
        with tempfile.TemporaryDirectory(prefix="durable-harness-pi-") as tmp:
            home = Path(tmp)
            agent_dir = home / ".pi" / "agent"
            agent_dir.mkdir(parents=True)
            session = agent_dir / "sessions" / "durable-harness.jsonl"
            session.parent.mkdir()
            if plan.get("transcript"):
                session.write_bytes(self.store.load(str(plan["transcript"])))
            hooks = ToolHooks(
                self.journal,
                PiReplayPolicy(self.config),
                host_tool_prefix="\0",  # host tools never reach the hooks (the extension)
                before_intent=None if self.journal.replay_only else self._saver(session),
            )
            mcp = HostToolServer(self.journal, self.tools, self.turn.session_id)
            callbacks = ProxyCallbacks(
                on_request=self._on_request(hooks), control=self._control(hooks), mcp=mcp.handle
            )
            proxy = JournalingProxy(
                self.journal,
                pi_canonicalizer(self.config.provider.api, package_dir(binary)),
                Upstream(url, key, send_key=is_loopback(url)),
                token,
                callbacks,
            )
            with proxy:
                endpoint = self._configure(agent_dir, proxy.url, token, model)
                command = [
                    binary,
                    "-p",
                    "--mode", "json",
                    "--model", f"{PROVIDER}/{model}",
                    "--session", str(session),
                    # Nothing found in the workspace or HOME may load: an extension there
                    # could switch the journaling extension's hooks off.
                    "--no-extensions", "-e", str(EXTENSION),
                    "--no-skills", "--no-prompt-templates", "--no-themes",
                ]  # fmt: skip
                finished = run_supervised(
                    command,
                    cwd=self.workspace,
                    env=self._env(home, endpoint),
                    proxy=proxy,
                    on_line=lambda line: self._event(line, events),
                    # On stdin, not argv: a prompt can look like a flag or an @file.
                    stdin=str(plan["message"]).encode(),
                )
            reply = self._reply(events, finished.status, finished.stderr, proxy)
            final = session.read_bytes() if session.exists() else b""
        result: dict[str, Any] = {"reply": reply}
        if not self.journal.replay_only:
            saved = self.store.save(final)
            epoch = self.journal.lease.epoch
            self.store.point(self.turn.session_id, self.turn.turn_id, epoch, saved)
            result["transcript"] = saved.digest
        return result

    def _configure(self, agent_dir: Path, url: str, token: str, model: str) -> Path:
        """Write Pi's models.json and settings.json, and the extension's endpoint file."""
        provider = {
            **pi_provider(self.config.provider.api, url),  # the proxy, in the chosen API
            "apiKey": token,  # the proxy's per-launch token, never a provider key
            "models": [{"id": model}],
        }
        (agent_dir / "models.json").write_text(json.dumps({"providers": {PROVIDER: provider}}))
        retries = int(os.environ.get(RETRIES_ENV, DEFAULT_CLI_RETRIES))
        settings = {"retry": {"enabled": retries > 0, "maxRetries": retries}}
        (agent_dir / "settings.json").write_text(json.dumps(settings))
        host_tools = [
            {"name": t.name, "description": t.description, "inputSchema": t.json_schema()}
            for t in self.tools
        ]
        endpoint = agent_dir / "durable-harness-endpoint.json"
        endpoint.write_text(json.dumps({"url": url, "token": token, "hostTools": host_tools}))
        for path in (agent_dir / "models.json", endpoint):
            path.chmod(0o600)
        return endpoint

    def _env(self, home: Path, endpoint: Path) -> dict[str, str]:
        env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update(
            {
                "HOME": str(home),
                "SHELL": shutil.which("bash") or "/bin/sh",
                "TERM": "dumb",
                "PI_OFFLINE": "1",  # no update checks or other startup traffic
                ENDPOINT_ENV: str(endpoint),
            }
        )
        return env

    def _saver(self, session: Path) -> Any:
        def before_intent(reported: str | None, tool_use_id: str) -> None:
            # Pi appends the assistant message before it runs the tool_call handlers; wait
            # (briefly) until the file holds this call, so a resume knows the call exists.
            deadline = time.monotonic() + _FLUSH_WAIT
            data = b""
            while time.monotonic() < deadline:
                data = session.read_bytes() if session.exists() else b""
                if tool_use_id.encode() in data:
                    break
                time.sleep(0.01)
            with self._save_lock:
                saved = self.store.save(data)
                lease = self.journal.lease
                self.store.point(self.turn.session_id, self.turn.turn_id, lease.epoch, saved)

        return before_intent

    def _control(self, hooks: ToolHooks) -> Any:
        def control(event: str, payload: dict[str, Any]) -> dict[str, Any]:
            if event != "PostToolUse":
                return hooks.handle(event, payload)
            tool_use_id = str(payload.get("tool_use_id") or "")
            opened = tool_use_id in hooks.open
            hooks.handle(event, payload)
            recorded = None if opened else self.journal.lookup(f"tool:{tool_use_id}")
            if recorded is not None and recorded.status is StepStatus.DONE:
                # Ran although the journal already had its outcome: the model must see
                # the recorded result, as every other run of this turn did.
                value = decode_output(self.world, recorded)
                response = value.get("tool_response") if isinstance(value, dict) else None
                if isinstance(response, dict):
                    return {"replace": response}
            return {}

        return control

    def _on_request(self, hooks: ToolHooks) -> Any:
        def on_request(body: dict[str, Any]) -> None:
            if not hooks.wait_started(_HOOKS_WAIT):
                raise ConfigError(
                    "Pi did not load the durable-harness extension (no session_start "
                    "arrived), so its tool calls could not be journaled: the turn was "
                    "stopped before any tool ran"
                )
            hooks.close_from_request(anthropic_view(body))

        return on_request

    def _event(self, line: bytes, events: _Events) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "agent_end":
            events.ended = True
            return
        message = event.get("message")
        if kind != "message_end" or not isinstance(message, dict):
            return
        if message.get("role") != "assistant":
            return
        events.last_assistant = message
        if self.journal.on_step is None:
            return
        for block in message.get("content") or []:
            if block.get("type") == "text" and block.get("text"):
                progress(f"pi: {block['text']}")
            elif block.get("type") == "toolCall":
                progress(f"pi: {block.get('name')} {json.dumps(block.get('arguments'))}")

    def _reply(
        self, events: _Events, status: int | None, stderr: str, proxy: JournalingProxy
    ) -> str:
        message = events.last_assistant
        upstream = "; ".join(dict.fromkeys(proxy.upstream_errors[-3:])) or None
        if message is None or not events.ended:
            raise DurableHarnessError(
                f"Pi exited with status {status} without finishing the turn"
                + (f" (last model error: {upstream})" if upstream else "")
                + f": {stderr.strip()[-500:] or 'no output'}"
            )
        if message.get("stopReason") in ("error", "aborted"):
            text = str(message.get("errorMessage") or message.get("stopReason"))
            if upstream or message.get("stopReason") == "error":
                raise ModelError(
                    f"the model call failed ({upstream or text}); the turn will be resumed"
                )
            raise TurnFailed(f"Pi ended the turn with an error: {text}")
        texts = [
            str(b.get("text") or "")
            for b in message.get("content") or []
            if isinstance(b, dict) and b.get("type") == "text"
        ]
        return "".join(texts)
