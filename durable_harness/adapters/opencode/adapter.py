"""The opencode agent: the real ``opencode`` CLI (``opencode-ai`` 1.18.33) behind the
journaling proxy.

As for claude-code (:mod:`.claude_code.adapter`), one turn is one or more **launches** of the CLI,
each a journal step ``launch:<n>``. Inside a launch:

* OpenCode's provider is its bundled ``@ai-sdk/anthropic`` (or, chosen in the agent
  config, ``@ai-sdk/openai-compatible``: :mod:`.opencode.provider`) pointed at the
  :class:`~.proxy.server.JournalingProxy`, with the per-launch token as its API key (never a
  provider key); model calls are keyed by
  :class:`~.opencode.canonical.OpenCodeCanonicalizer` (or its Chat Completions form);
* its tool calls are journaled by a plugin (``plugin.js``) whose
  ``tool.execute.before`` posts Claude-Code-shaped PreToolUse payloads to
  :class:`~.hooks.ToolHooks` and blocks the tool unless the harness allows it (fail
  closed), with :class:`OpenCodeReplayPolicy` labels; the user's host tools are served
  over MCP by the harness (:mod:`.opencode.tools`) under their own labels;
* the wait tools (``wait_for_signal``, ``sleep_until``) are served over MCP with them and
  gated at their ``tool.execute.before`` by :class:`~.cli.waits.WaitGate` in stop mode
  (OpenCode has no ``defer``): a wait still pending stops the CLI and parks the turn; the
  next delivery settles the wait before resuming;
* its session database is saved to the World before every tool intent and after the
  launch (:mod:`.opencode.session`), and before a host tool's call.

OpenCode runs non-interactively (``opencode run --format json``) in the turn's workspace
with a fresh private HOME and XDG folders, no auto-update, no models.dev fetch, no
sharing, no project config (it could switch the plugin off), where a
:class:`~.cli.host.CliHost` puts it (:mod:`.cli.launches`): the session's Docker
container (``--workspace docker``, a detached job that outlives the worker) or a host
folder, the local sandbox (under :mod:`.cli.reaper`). Which launch runs next:

* the last launch finished: its reply, no CLI run;
* the last launch's CLI still runs in the container after its worker died: follow it
  again from its first output line and finish that launch;
* a database of this turn was saved: restore it and continue the session
  (``--session ses_…``) with a message written from the journal
  (:func:`~.cli.records.resume_message_from_facts`);
* otherwise the turn starts as it first did (the previous turn's database and the prompt),
  so its first model calls are answered from the journal if they were recorded.

``durable-harness replay`` runs the turn's last launch again, as recorded, with the proxy
answering only from the journal: zero upstream calls, zero tool runs.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_harness.adapters.base import Adapter, TurnRun
from durable_harness.adapters.cli.hooks import ReplayPolicy, ToolHooks, save_before_host_calls
from durable_harness.adapters.cli.host import (
    CliHost,
    CliLaunch,
    CliRun,
    HostCliHost,
    find_cli,
    progress,
    supervise,
)
from durable_harness.adapters.cli.jobs import launch_token
from durable_harness.adapters.cli.launches import (
    Workspaces,
    check_where,
    close_interrupted,
    finished_reply,
    open_cli_host,
    run_launches,
)
from durable_harness.adapters.cli.provider_api import anthropic_view
from durable_harness.adapters.cli.records import previous_turn_transcript, resume_message_from_facts
from durable_harness.adapters.cli.waits import WaitGate
from durable_harness.adapters.opencode.home import (
    DATABASE,
    OPENCODE_ENV,
    OPENCODE_VERSION,
    base_env,
    home_files,
    prepare_home,
)
from durable_harness.adapters.opencode.provider import OpenCodeConfig, opencode_canonicalizer
from durable_harness.adapters.opencode.session import (
    DatabaseStore,
    database_facts,
    latest_turn_save,
    read_snapshot,
    root_session_id,
    snapshot,
    tool_call_ids,
)
from durable_harness.adapters.opencode.tools import HOST_TOOL_PREFIX, CallIds, OpenCodeHostTools
from durable_harness.adapters.proxy.server import JournalingProxy, ProxyCallbacks, Upstream
from durable_harness.core.errors import ConfigError, DurableHarnessError, ModelError, TurnFailed
from durable_harness.core.settings import Settings
from durable_harness.core.types import Replay
from durable_harness.harness.journal import Journal
from durable_harness.harness.model import is_loopback, resolve_endpoint
from durable_harness.harness.tools import Tool, load_user_tools
from durable_harness.harness.waits import WAIT_TOOL_NAMES

__all__ = [
    "OPENCODE_VERSION",
    "OpenCodeAdapter",
    "OpenCodeReplayPolicy",
    "find_opencode",
    "prepare_home",
]

BIN_ENV = "DURABLE_HARNESS_OPENCODE_BIN"
_FLUSH_WAIT = 3.0  # seconds the database may take to show a tool call before a save
_PLUGIN_WAIT = 20.0  # seconds the first model call waits for proof the plugin is live
_versions_seen: dict[str, str] = {}


def find_opencode() -> str:
    """The ``opencode`` binary: $DURABLE_HARNESS_OPENCODE_BIN, the project's pinned install
    (``.tools/npm``, made by scripts/setup), or PATH. ConfigError if none."""
    return find_cli("opencode", BIN_ENV, "OpenCode", f"opencode-ai@{OPENCODE_VERSION}")


def check_version(binary: str, host: CliHost | None = None) -> None:
    """ConfigError unless ``binary --version`` (run where the CLI runs) is exactly
    :data:`OPENCODE_VERSION`."""
    version = _versions_seen.get(binary) if host is None or not host.durable else None
    if version is None:
        with tempfile.TemporaryDirectory(prefix="durable-harness-opencode-") as home:
            try:
                if host is None or not host.durable:
                    env = {**base_env(Path(home)), **OPENCODE_ENV}
                    version = HostCliHost(Path.cwd(), {}).version(binary, env)
                else:
                    version = host.version(binary, dict(OPENCODE_ENV))
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ConfigError(f"cannot run {binary} --version: {exc}") from None
        _versions_seen[binary] = version
    if version != OPENCODE_VERSION:
        raise ConfigError(
            f"{binary} is OpenCode {version}, but durable-harness needs exactly "
            f"{OPENCODE_VERSION} (its request canonicalization is measured on that "
            f"version): run scripts/setup, or point {BIN_ENV} at that version"
        )


#: OpenCode tools that only read (files, the web, its own todo list and skills).
SAFE_TOOLS = frozenset(
    {"read", "glob", "grep", "list", "webfetch", "websearch", "codesearch", "todowrite",
     "todoread", "skill", "lsp"}
)  # fmt: skip


class OpenCodeReplayPolicy(ReplayPolicy):
    """OpenCode's tool names under the claude-code rules: ``bash`` is ``never`` unless a
    ``safe_bash`` pattern marks the command safe; read-only tools are ``safe``; ``write``,
    ``edit``, ``patch``, ``task`` and every other tool ``never``; ``[replay] tools``
    overrides a tool's label by its OpenCode name."""

    def label(self, tool_name: str, tool_input: Any) -> Replay:
        override = self.config.replay.tools.get(tool_name)
        if override is not None:
            return override
        command = tool_input.get("command", "") if isinstance(tool_input, dict) else ""
        if tool_name == "bash" and self.safe_command(str(command).strip()):
            return "safe"
        return "safe" if tool_name in SAFE_TOOLS else "never"


def _config(run_config: dict[str, Any]) -> OpenCodeConfig:
    return OpenCodeConfig.parse(run_config.get("agent_config"), "in the turn")


class OpenCodeAdapter(Adapter):
    name = "opencode"

    def check(self, config: dict[str, Any], settings: Settings) -> None:
        docker = check_where(config, self.name)
        load_user_tools(config.get("tools", []), WAIT_TOOL_NAMES)
        _config(config)
        resolve_endpoint(config.get("base_url"))
        if not docker:
            check_version(find_opencode())

    def run_turn(self, run: TurnRun) -> str:
        reply = finished_reply(run)
        if reply is not None:
            return reply
        binaries = lambda: {"opencode": find_opencode()}  # noqa: E731
        with open_cli_host(run.config, run.turn.session_id, self.name, binaries) as host:
            return run_launches(run, self.name, host, _Launch(run, host))


@dataclass
class _Events:
    """What the ``--format json`` event lines told: the texts of the newest step."""

    texts: list[str] = field(default_factory=list)
    finish: str | None = None  # the newest step's finish reason
    errors: list[str] = field(default_factory=list)
    session: str | None = None


class _Launch:
    """One run of the CLI for a turn (see the module docstring)."""

    def __init__(self, run: TurnRun, host: CliHost) -> None:
        self.run_ = run
        self.host = host
        self.world = run.world
        self.journal: Journal = run.journal
        self.turn = run.turn
        self.config = _config(run.config)
        self.store = DatabaseStore(self.world)
        self._save_lock = threading.Lock()
        self.workspaces = Workspaces(run, self._save_lock)
        # OpenCode has no `defer`: the gate's stop mode (cli/waits.py) stops the CLI at a
        # pending wait; run_launches settles the wait before the next launch.
        self.gate = WaitGate.for_turn(run)
        #: The host tools served over MCP: the user's, and the wait tools.
        self.tools: list[Tool] = [
            *load_user_tools(run.config.get("tools", []), WAIT_TOOL_NAMES),
            *self.gate.tools,
        ]

    # -- what to run -----------------------------------------------------------------
    def plan(self, number: int) -> dict[str, Any]:
        """How the next launch starts: mode, message and the database to restore."""
        turn, epoch = self.turn, self.journal.lease.epoch
        saved = latest_turn_save(self.world, turn.session_id, turn.turn_id, epoch)
        if saved is None:
            previous = previous_turn_transcript(self.world, turn.session_id, turn.index)
            mode = "resume" if previous is not None else "new"
            return {"mode": mode, "message": turn.prompt, "transcript": previous}
        close_interrupted(
            self.journal,
            self.world,
            OpenCodeReplayPolicy(self.config),
            self.tools,
        )
        steps = sorted(self.journal.recorded.values(), key=lambda s: s.seq)
        facts = database_facts(self.store.load(saved), steps)
        message = resume_message_from_facts(self.world, turn.prompt, steps, facts)
        return {"mode": "resume", "message": message, "transcript": saved}

    # -- running it ----------------------------------------------------------------------
    def run(self, plan: dict[str, Any], job: str, cli: CliRun | None = None) -> dict[str, Any]:
        """Run the launch ``job`` (or follow ``cli``, the same launch started by an earlier
        worker) to its end; its reply and final database."""
        host = self.host
        binary = host.binary("opencode")
        check_version(binary, host)
        url, key = resolve_endpoint(self.run_.config.get("base_url"))
        token = launch_token(self.turn.config, job) if host.durable else secrets.token_urlsafe(32)
        home = host.home(job)
        database = f"{home}/{DATABASE}"
        restored = self.store.load(str(plan["transcript"])) if plan.get("transcript") else None
        session: str | None = None
        if restored is not None:
            session = root_session_id(restored)
            if session is None:
                raise DurableHarnessError(
                    "the saved OpenCode database holds no session to continue"
                )
        sandbox = getattr(host, "sandbox", None)
        if cli is None and sandbox is not None and not self.journal.replay_only:
            self.workspaces.restore(sandbox)  # a new container gets the workspace back
        saver = None if self.journal.replay_only else self._saver(database)
        hooks = ToolHooks(
            self.journal,
            OpenCodeReplayPolicy(self.config),
            host_tool_prefix=HOST_TOOL_PREFIX,
            before_intent=saver,
            waits=self.gate,
            outcome_meta=None if sandbox is None else self.workspaces.saver(sandbox),
            adopt=cli is not None,
        )
        if cli is not None:
            hooks.session_started.set()  # it started under the earlier worker
        call_ids = CallIds()
        mcp = OpenCodeHostTools(
            self.journal,
            self.tools,
            self.turn.session_id,
            self.gate.signal_secret,
            call_ids=call_ids,
        )
        control = save_before_host_calls(self.journal, hooks.handle, saver, HOST_TOOL_PREFIX)
        callbacks = ProxyCallbacks(
            on_request=self._on_request(hooks),
            control=call_ids.control(control),
            mcp=mcp.handle,
        )
        proxy = JournalingProxy(
            self.journal,
            opencode_canonicalizer(self.config.provider.api, home),
            Upstream(url, key, send_key=is_loopback(url)),
            token,
            callbacks,
        )
        events = _Events()
        with proxy:
            endpoint = host.endpoint(proxy.url, job)
            self.gate.stop = proxy.fail  # a pending wait stops the CLI (then parks)
            if cli is None:
                model = str(self.run_.config.get("model") or self.run_.settings.model)
                files, env = home_files(
                    home,
                    model_url=endpoint,
                    harness_url=endpoint,
                    token=token,
                    model=model,
                    mcp=True,  # the host tools and the wait tools
                    retry=host.durable,
                    api=self.config.provider.api,
                )
                if restored is not None:
                    files[DATABASE] = restored
                argv = [binary, "run", "--format", "json"]
                if session is not None:
                    argv += ["--session", session]
                argv += ["--", str(plan["message"])]
                cli = host.start(CliLaunch(job, argv, env, b"", files))
            try:
                finished = supervise(cli, proxy, lambda line: self._event(line, events))
            finally:
                self.gate.stopped.set()  # the CLI is gone: release a held wait hook
        reply = self._reply(events, finished.status, finished.stderr, proxy)
        final = self._database(database)
        result: dict[str, Any] = {"reply": reply, "session": session or events.session}
        if not self.journal.replay_only:
            saved = self.store.save(final)
            epoch = self.journal.lease.epoch
            self.store.point(self.turn.session_id, self.turn.turn_id, epoch, saved)
            result["transcript"] = saved.digest
        # The job's HOME goes once the launch is journaled (run_launches).
        return result

    def _database(self, path: str) -> bytes:
        """A consistent copy of OpenCode's database where it runs (empty if none yet)."""
        if isinstance(self.host, HostCliHost):
            return snapshot(Path(path))  # SQLite's backup API, while OpenCode writes
        return read_snapshot(self.host.read_file, path)

    def _saver(self, database: str) -> Any:
        def before_intent(reported: str | None, tool_use_id: str) -> None:
            # OpenCode writes the tool's part a little before the plugin runs: wait
            # (briefly) until the database holds this call, so a resume knows it exists.
            deadline = time.monotonic() + _FLUSH_WAIT
            data = self._database(database)
            while tool_use_id not in tool_call_ids(data) and time.monotonic() < deadline:
                time.sleep(0.05)
                data = self._database(database)
            with self._save_lock:
                saved = self.store.save(data)
                lease = self.journal.lease
                self.store.point(self.turn.session_id, self.turn.turn_id, lease.epoch, saved)

        return before_intent

    def _on_request(self, hooks: ToolHooks) -> Any:
        def on_request(body: dict[str, Any]) -> None:
            hooks.require_started(
                _PLUGIN_WAIT,
                "OpenCode did not load the durable-harness plugin (no SessionStart arrived)",
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
        events.session = events.session or event.get("sessionID")
        kind = event.get("type")
        part = _dict(event.get("part"))
        if kind == "step_start":
            events.texts, events.finish = [], None
        elif kind == "text" and part.get("text"):
            events.texts.append(str(part["text"]))
            if self.journal.on_step is not None:
                progress(f"opencode: {part['text']}")
        elif kind == "tool_use" and self.journal.on_step is not None:
            state = _dict(part.get("state"))
            progress(f"opencode: {part.get('tool')} {json.dumps(state.get('input'))}")
        elif kind == "step_finish":
            events.finish = str(part.get("reason"))
        elif kind == "error":
            error = event.get("error")
            if isinstance(error, dict):
                data = _dict(error.get("data"))
                error = data.get("message") or error.get("name") or error
            events.errors.append(str(error))

    def _reply(
        self, events: _Events, status: int | None, stderr: str, proxy: JournalingProxy
    ) -> str:
        upstream = "; ".join(dict.fromkeys(proxy.upstream_errors[-3:])) or None
        if events.errors or (upstream and events.finish in (None, "tool-calls")):
            text = "; ".join(events.errors) or "no reply"
            if upstream:
                raise ModelError(f"the model call failed ({upstream}); the turn will be resumed")
            raise TurnFailed(f"OpenCode ended the turn with an error: {text}")
        if events.finish is None or events.finish == "tool-calls" or status != 0:
            raise DurableHarnessError(
                f"OpenCode exited with status {status} without a final reply: "
                f"{stderr.strip()[-500:] or 'no output'}"
            )
        return "".join(events.texts)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
