"""The claude-code agent: the real ``claude`` CLI behind the journaling proxy.

One turn is one or more **launches** of the CLI, each a journal step ``launch:<n>``
(kind ``agent``) whose input says how it starts and whose outcome is the reply and the
final transcript. Inside a launch:

* model calls go through :class:`~.proxy.JournalingProxy` (keyed by the canonical
  request hash, :class:`~.canonical.ClaudeCodeCanonicalizer`);
* Claude Code's own tool calls are journaled by its hooks (:class:`~.hooks.ToolHooks`),
  with :class:`~.hooks.ReplayPolicy` labels; the user's host tools are served over MCP by
  the harness (:class:`~.mcp.HostToolServer`) under their own labels;
* the CLI's transcript is saved to the World before every tool intent
  (:mod:`.claude_session`).

The CLI runs non-interactively in the turn's workspace with a fresh, private HOME, a
session id derived from the durable-harness session, a per-launch token instead of any
provider key, and under :mod:`.reaper`, so that it and every process it started die with
the worker. Which launch runs next:

* the last launch finished (the worker died after the CLI did): its reply, no CLI run;
* a transcript of this turn was saved: restore it and ``--resume`` with a message written
  from the journal (:func:`~.claude_session.resume_message`);
* otherwise the turn starts as it first did (the session's previous transcript and the
  prompt), so its first model call is answered from the journal if it was recorded.

``durable-harness replay`` runs the turn's last launch again, as recorded, with the proxy
answering only from the journal: zero upstream calls, zero tool runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from durable_harness.adapters import hook_client, reaper
from durable_harness.adapters.base import Adapter, TurnRun
from durable_harness.adapters.canonical import ClaudeCodeCanonicalizer
from durable_harness.adapters.claude_session import (
    LAUNCH_PREFIX,
    TranscriptStore,
    latest_turn_transcript,
    previous_turn_transcript,
    resume_message,
)
from durable_harness.adapters.cli_waits import WaitGate
from durable_harness.adapters.hooks import ClaudeCodeConfig, ReplayPolicy, ToolHooks
from durable_harness.adapters.mcp import SERVER_NAME, HostToolServer
from durable_harness.adapters.proxy import JournalingProxy, ProxyCallbacks, Upstream
from durable_harness.harness.errors import (
    ConfigError,
    DurableHarnessError,
    ModelError,
    ReplayDivergence,
    TurnFailed,
)
from durable_harness.harness.journal import BLOB_PREFIX, Journal, Outcome, StepResult, decode_output
from durable_harness.harness.model import is_loopback, resolve_endpoint
from durable_harness.harness.settings import Settings
from durable_harness.harness.tools import Tool, load_tools
from durable_harness.worlds.base import Step, StepStatus, World

__all__ = ["CLAUDE_CODE_VERSION", "ClaudeCodeAdapter", "find_claude", "project_dir_name"]

#: The one Claude Code version this adapter's rules were measured on (scripts/setup).
CLAUDE_CODE_VERSION = "2.1.332"
BIN_ENV = "DURABLE_HARNESS_CLAUDE_BIN"
RETRIES_ENV = "DURABLE_HARNESS_CLAUDE_MAX_RETRIES"
#: Retries the CLI makes itself on a failed model call before giving up; the worker then
#: releases the turn and a later delivery resumes it.
DEFAULT_CLI_RETRIES = "2"
_REPO_BIN = Path(__file__).resolve().parents[2] / ".tools" / "npm" / "node_modules" / ".bin"
_SESSION_NAMESPACE = uuid.UUID("5d0b8f5e-5b39-4bb5-9a55-3c1f1f4b0d2a")
_HOOK_EVENTS = ("SessionStart", "PreToolUse", "PostToolUse", "PostToolUseFailure")
_FLUSH_WAIT = 3.0  # seconds the transcript may take to show a tool call before a save
_HOOKS_WAIT = 10.0  # seconds the first model call waits for proof the hooks are live
_PASSED_ENV = ("PATH", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
_versions_seen: dict[str, str] = {}


def find_claude() -> str:
    """The ``claude`` binary: $DURABLE_HARNESS_CLAUDE_BIN, the project's pinned install
    (``.tools/npm``, made by scripts/setup), or PATH. ConfigError if none."""
    override = os.environ.get(BIN_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise ConfigError(f"{BIN_ENV}={override!r} is not an executable file")
        return override
    pinned = _REPO_BIN / "claude"
    if os.access(pinned, os.X_OK):
        return str(pinned)
    found = shutil.which("claude")
    if found is None:
        raise ConfigError(
            f"Claude Code is not installed: run scripts/setup (it installs "
            f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION} into .tools/npm), or set "
            f"{BIN_ENV} to a claude binary of that version"
        )
    return found


def check_version(binary: str) -> None:
    """ConfigError unless ``binary --version`` is exactly :data:`CLAUDE_CODE_VERSION`."""
    version = _versions_seen.get(binary)
    if version is None:
        try:
            out = subprocess.run(
                [binary, "--version"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "DISABLE_AUTOUPDATER": "1"},
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run {binary} --version: {exc}") from None
        version = (out.stdout.split() or ["(nothing)"])[0]
        _versions_seen[binary] = version
    if version != CLAUDE_CODE_VERSION:
        raise ConfigError(
            f"{binary} is Claude Code {version}, but durable-harness needs exactly "
            f"{CLAUDE_CODE_VERSION} (its request canonicalization is measured on that "
            f"version): run scripts/setup, or point {BIN_ENV} at that version"
        )


def project_dir_name(workspace: str) -> str:
    """Claude Code's folder for a workspace's transcripts: the path, non-alphanumerics as -."""
    return re.sub(r"[^a-zA-Z0-9]", "-", workspace)


def claude_session_id(session_id: str) -> str:
    """The Claude Code session id of a durable-harness session (the same on every worker)."""
    return str(uuid.uuid5(_SESSION_NAMESPACE, session_id))


def workspace_of(config: dict[str, Any]) -> Path:
    spec = str(config.get("workspace", "virtual"))
    if spec == "virtual":
        raise ConfigError(
            "the claude-code agent runs the real CLI on a host folder: give --workspace DIR "
            "(the virtual workspace cannot host it; a Docker sandbox is coming)"
        )
    path = Path(spec).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"workspace {spec!r} is a file; give a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create workspace {spec!r}: {exc}") from None
    return path.resolve()


class ClaudeCodeAdapter(Adapter):
    name = "claude-code"

    def check(self, config: dict[str, Any], settings: Settings) -> None:
        workspace_of(config)
        for spec in config.get("tools", []):
            load_tools(spec)
        ClaudeCodeConfig.parse(config.get("agent_config"), "in the turn")
        resolve_endpoint(config.get("base_url"))
        check_version(find_claude())

    def run_turn(self, run: TurnRun) -> str:
        if run.journal.replay_only:
            return _replay(run)
        journal = run.journal
        launches = _launch_steps(journal)
        last = _finished(run.world, launches)
        if last is not None and not last.get("deferred"):
            return str(last["reply"])
        launch = _Launch(run)
        plan = launch.plan(len(launches), last)
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
        if result.get("deferred"):
            # The CLI stopped at a wait (cli_waits): park the turn; the next delivery
            # resumes the CLI, whose hook then finds the wait over (or defers again).
            if launch.gate.suspended is None:
                raise TurnFailed(
                    "Claude Code deferred a tool call that durable-harness did not defer"
                )
            raise launch.gate.suspended
        return str(result["reply"])


def _finished(world: World, launches: list[Step]) -> dict[str, Any] | None:
    """The outcome of the turn's last launch, if it finished."""
    if not launches or launches[-1].status is not StepStatus.DONE:
        return None
    value: dict[str, Any] = decode_output(world, launches[-1])
    return value


def _launch_steps(journal: Journal) -> list[Step]:
    steps = sorted(journal.recorded.values(), key=lambda s: s.seq)
    return [s for s in steps if s.key.startswith(LAUNCH_PREFIX)]


def _replay(run: TurnRun) -> str:
    """Run the turn's last finished launch again, the proxy answering from the journal."""
    done = [s for s in _launch_steps(run.journal) if s.status is StepStatus.DONE]
    if not done:
        raise ReplayDivergence(f"turn {run.turn.turn_id} has no finished launch of the CLI")
    plan = json.loads(_stored_input(run.world, done[-1]))
    result = _Launch(run).run(plan)
    return str(result["reply"])


def _stored_input(world: World, step: Step) -> str:
    text = step.input or "{}"
    if text.startswith(BLOB_PREFIX):
        return world.get_blob(text.removeprefix(BLOB_PREFIX)).decode()
    return text


@dataclass
class _Outcome:
    result: dict[str, Any] | None = None
    stderr: str = ""
    status: int | None = None
    texts: list[str] = field(default_factory=list)


class _Launch:
    """One run of the CLI for a turn (see the module docstring)."""

    def __init__(self, run: TurnRun) -> None:
        self.run_ = run
        self.world = run.world
        self.journal = run.journal
        self.turn = run.turn
        self.workspace = workspace_of(run.config)
        self.config = ClaudeCodeConfig.parse(run.config.get("agent_config"), "in the turn")
        specs = run.config.get("tools", [])
        self.tools: list[Tool] = [t for spec in specs for t in load_tools(spec)]
        self.session = claude_session_id(self.turn.session_id)
        self.store = TranscriptStore(self.world)
        self._save_lock = threading.Lock()
        secret = str(self.turn.config.get("signal_secret", ""))
        self.gate = WaitGate(self.world, self.journal, self.turn.session_id, secret)

    # -- what to run -----------------------------------------------------------------
    def plan(self, number: int, last: dict[str, Any] | None = None) -> dict[str, Any]:
        """How launch ``number`` starts: mode, prompt and the transcript to restore.

        ``last`` is the outcome of the previous launch when it finished deferred (at a
        wait): the CLI resumes with an empty prompt, which runs the deferred call.
        """
        if last is not None and last.get("deferred"):
            transcript = last["transcript"]
            return {"mode": "resume", "message": "", "transcript": transcript, "launch": number}
        turn, epoch = self.turn, self.journal.lease.epoch
        saved = latest_turn_transcript(self.world, turn.session_id, turn.turn_id, epoch)
        if saved is None:
            previous = previous_turn_transcript(self.world, turn.session_id, turn.index)
            mode = "resume" if previous is not None else "new"
            return {"mode": mode, "message": self.turn.prompt, "transcript": previous}
        self._close_interrupted()
        steps = sorted(self.journal.recorded.values(), key=lambda s: s.seq)
        message = resume_message(self.world, self.turn.prompt, steps, self.store.load(saved))
        return {"mode": "resume", "message": message, "transcript": saved, "launch": number}

    def _close_interrupted(self) -> None:
        """Finish every interrupted ``never`` tool call *possibly ran* (it will not rerun)."""
        policy = ReplayPolicy(self.config)
        host = {t.name: t for t in [*self.tools, *self.gate.tools]}
        for step in list(self.journal.recorded.values()):
            if step.kind != "tool" or step.status is not StepStatus.INTENT:
                continue
            tool_input = json.loads(_stored_input(self.world, step))
            host_tool = host.get(step.name)
            label = host_tool.replay if host_tool else policy.label(step.name, tool_input)
            if label == "never":
                self.journal.begin_keyed(
                    kind="tool", name=step.name, key=step.key, input=tool_input, replay="never"
                )

    # -- running it ----------------------------------------------------------------------
    def run(self, plan: dict[str, Any]) -> dict[str, Any]:
        binary = find_claude()
        check_version(binary)
        url, key = resolve_endpoint(self.run_.config.get("base_url"))
        token = secrets.token_urlsafe(32)
        with tempfile.TemporaryDirectory(prefix="durable-harness-claude-") as tmp:
            home = Path(tmp)
            transcript = (
                home / ".claude" / "projects" / project_dir_name(str(self.workspace))
                / f"{self.session}.jsonl"
            )  # fmt: skip
            transcript.parent.mkdir(parents=True)
            if plan.get("transcript"):
                transcript.write_bytes(self.store.load(str(plan["transcript"])))
            hooks = ToolHooks(
                self.journal,
                ReplayPolicy(self.config),
                host_tool_prefix=f"mcp__{SERVER_NAME}__",
                before_intent=None if self.journal.replay_only else self._saver(transcript),
                waits=self.gate,
            )
            tools = self.tools + self.gate.tools
            mcp = HostToolServer(self.journal, tools, self.turn.session_id, self.gate.signal_secret)
            callbacks = ProxyCallbacks(
                on_request=self._on_request(hooks), control=hooks.handle, mcp=mcp.handle
            )
            proxy = JournalingProxy(
                self.journal,
                ClaudeCodeCanonicalizer(home=str(home)),
                Upstream(url, key, send_key=is_loopback(url)),
                token,
                callbacks,
            )
            with proxy:
                command = self._command(binary, home, proxy.url, token, plan)
                outcome = self._supervise(command, self._env(home, proxy.url, token), plan, proxy)
            reply = self._reply(outcome, proxy)
            final = transcript.read_bytes() if transcript.exists() else b""
        result: dict[str, Any] = {"reply": reply, "session": self.session}
        deferred = (outcome.result or {}).get("deferred_tool_use")
        if (outcome.result or {}).get("stop_reason") == "tool_deferred" and deferred:
            result["deferred"] = str(deferred.get("id"))
        if not self.journal.replay_only:
            saved = self.store.save(final)
            epoch = self.journal.lease.epoch
            self.store.point(self.turn.session_id, self.turn.turn_id, epoch, saved)
            result["transcript"] = saved.digest
        return result

    def _saver(self, transcript: Path) -> Any:
        def before_intent(reported: str | None, tool_use_id: str) -> None:
            # Claude Code writes its transcript a little after the fact: wait (briefly)
            # until it holds this call, so a resume from this save knows the call exists.
            deadline = time.monotonic() + _FLUSH_WAIT
            data = b""
            while time.monotonic() < deadline:
                data = transcript.read_bytes() if transcript.exists() else b""
                if tool_use_id.encode() in data:
                    break
                time.sleep(0.01)
            with self._save_lock:
                saved = self.store.save(data)
                lease = self.journal.lease
                self.store.point(self.turn.session_id, self.turn.turn_id, lease.epoch, saved)

        return before_intent

    def _on_request(self, hooks: ToolHooks) -> Any:
        def on_request(body: dict[str, Any]) -> None:
            if not hooks.wait_started(_HOOKS_WAIT):
                raise ConfigError(
                    "Claude Code did not run the durable-harness hooks (no SessionStart "
                    "arrived), so its tool calls could not be journaled: the turn was "
                    "stopped before any tool ran"
                )
            hooks.close_from_request(body)

        return on_request

    def _command(
        self, binary: str, home: Path, url: str, token: str, plan: dict[str, Any]
    ) -> list[str]:
        endpoint = home / "durable-harness-endpoint.json"
        endpoint.write_text(json.dumps({"url": url, "token": token}))
        endpoint.chmod(0o600)
        client = [sys.executable, "-I", "-S", hook_client.__file__, str(endpoint)]
        settings = {
            "hooks": {
                event: [
                    {
                        "matcher": "*",
                        "hooks": [
                            {
                                "type": "command",
                                "command": shlex.join([*client, event]),
                                "timeout": 600,
                            }
                        ],
                    }
                ]
                for event in _HOOK_EVENTS
            }
        }
        settings_file = home / "durable-harness-settings.json"
        settings_file.write_text(json.dumps(settings, indent=1))
        mcp_file = home / "durable-harness-mcp.json"
        # Always served: the wait tools (cli_waits) are host tools too.
        servers = {
            SERVER_NAME: {
                "type": "http",
                "url": f"{url}/mcp",
                "headers": {"Authorization": f"Bearer {token}"},
            }
        }
        mcp_file.write_text(json.dumps({"mcpServers": servers}))
        start = "--session-id" if plan["mode"] == "new" else "--resume"
        return [
            binary,
            "-p",
            "--output-format", "stream-json",
            "--verbose",
            "--model", str(self.run_.config.get("model") or self.run_.settings.model),
            "--settings", str(settings_file),
            # Project and local settings could switch the journaling hooks off.
            "--setting-sources", "user",
            "--mcp-config", str(mcp_file),
            "--strict-mcp-config",
            "--dangerously-skip-permissions",
            start, self.session,
        ]  # fmt: skip

    def _env(self, home: Path, url: str, token: str) -> dict[str, str]:
        env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update(
            {
                "HOME": str(home),
                "SHELL": shutil.which("bash") or "/bin/sh",
                "TERM": "dumb",
                "ANTHROPIC_BASE_URL": url,
                "ANTHROPIC_API_KEY": token,  # the proxy's per-launch token, never a provider key
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "DISABLE_TELEMETRY": "1",
                "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",  # memory would live in the lost HOME
                "CLAUDE_CODE_MAX_RETRIES": os.environ.get(RETRIES_ENV, DEFAULT_CLI_RETRIES),
                "IS_SANDBOX": "1",  # lets --dangerously-skip-permissions run as root
            }
        )
        return env

    def _supervise(
        self, command: list[str], env: dict[str, str], plan: dict[str, Any], proxy: JournalingProxy
    ) -> _Outcome:
        outcome = _Outcome()
        with tempfile.TemporaryFile() as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", reaper.__file__, str(os.getpid()), "--", *command],
                cwd=self.workspace,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
            )
            try:
                assert proc.stdin is not None and proc.stdout is not None
                with contextlib.suppress(OSError):
                    proc.stdin.write(str(plan["message"]).encode())
                    proc.stdin.close()
                lines = _read_lines(proc.stdout)
                while True:
                    if proxy.fatal_event.is_set():
                        break
                    try:
                        line = lines.get(timeout=0.1)
                    except queue.Empty:
                        continue
                    if line is None:
                        break
                    self._event(line, outcome)
                outcome.status = proc.wait() if not proxy.fatal_event.is_set() else None
            finally:
                if proc.poll() is None:
                    proc.terminate()  # the reaper kills the CLI and everything it started
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            stderr.seek(0)
            outcome.stderr = stderr.read().decode("utf-8", "replace")[-2000:]
        if proxy.fatal is not None:
            raise proxy.fatal
        return outcome

    def _event(self, line: bytes, outcome: _Outcome) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if event.get("type") == "result":
            outcome.result = event
        elif event.get("type") == "assistant" and self.journal.on_step is not None:
            for block in (event.get("message") or {}).get("content") or []:
                if block.get("type") == "text" and block.get("text"):
                    _progress(f"claude: {block['text']}")
                elif block.get("type") == "tool_use":
                    _progress(f"claude: {block.get('name')} {json.dumps(block.get('input'))}")

    def _reply(self, outcome: _Outcome, proxy: JournalingProxy) -> str:
        result = outcome.result
        # The distinct model errors of this launch, oldest first (a stream that broke may be
        # followed by the CLI's non-streaming retry breaking another way).
        upstream = "; ".join(dict.fromkeys(proxy.upstream_errors[-3:])) or None
        if result is None:
            raise DurableHarnessError(
                f"Claude Code exited with status {outcome.status} without a result"
                + (f" (last model error: {upstream})" if upstream else "")
                + f": {outcome.stderr.strip()[-500:] or 'no output'}"
            )
        if result.get("is_error") or result.get("subtype") != "success":
            text = str(result.get("result") or result.get("subtype"))
            if result.get("terminal_reason") == "api_error" or upstream:
                raise ModelError(
                    f"the model call failed ({upstream or text}); the turn will be resumed"
                )
            raise TurnFailed(f"Claude Code ended the turn with an error: {text}")
        return str(result.get("result") or "")


def _read_lines(stream: IO[bytes]) -> queue.Queue[bytes | None]:
    lines: queue.Queue[bytes | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name="claude-stdout", daemon=True).start()
    return lines


def _progress(text: str) -> None:
    text = text.replace("\n", " ")
    sys.stderr.write(f"  {text[:160]}\n")
    sys.stderr.flush()
