"""The opencode agent's :class:`~.cli.spec.CliSpec`: the real ``opencode`` CLI
(``opencode-ai`` 1.18.33) behind the journaling proxy, run by :class:`~.cli.agent.CliAdapter`.

As for every CLI agent (:mod:`.cli.agent`), one turn is one or more **launches** of the CLI,
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_harness.adapters.base import TurnRun
from durable_harness.adapters.cli.agent import find_binary, wait_for_record
from durable_harness.adapters.cli.hooks import ReplayPolicy, ToolHooks, save_before_host_calls
from durable_harness.adapters.cli.host import (
    CliHost,
    CliLaunch,
    Finished,
    HostCliHost,
    json_event,
    progress,
)
from durable_harness.adapters.cli.provider_api import anthropic_view, api_wire
from durable_harness.adapters.cli.records import previous_turn_transcript, resume_message_from_facts
from durable_harness.adapters.cli.spec import BeforeIntent, CliSpec, LaunchContext, Wiring
from durable_harness.adapters.opencode.home import (
    DATABASE,
    ENDPOINT_FILE,
    OPENCODE_ENV,
    OPENCODE_VERSION,
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
from durable_harness.core.errors import DurableHarnessError, ModelError, TurnFailed
from durable_harness.core.types import Replay, Step
from durable_harness.harness.endpoint import resolve_endpoint

__all__ = [
    "OPENCODE_VERSION",
    "SPEC",
    "OpenCodeReplayPolicy",
    "find_opencode",
    "prepare_home",
]

BIN_ENV = "DURABLE_HARNESS_OPENCODE_BIN"
_FLUSH_WAIT = 3.0  # seconds the database may take to show a tool call before a save


def find_opencode() -> str:
    """The ``opencode`` binary: $DURABLE_HARNESS_OPENCODE_BIN, the project's pinned install
    (``.tools/npm`` of a checkout, or ``setup-agents``'s user cache), or PATH."""
    return find_binary(SPEC)


def _read_version(host: CliHost, binary: str) -> str:
    # On a host folder as the agent user, with a throwaway HOME (HostCliHost.version), so
    # the CLI reads no user config.
    return host.version(binary, dict(OPENCODE_ENV))


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


def _config(ctx: LaunchContext) -> OpenCodeConfig:
    assert isinstance(ctx.config, OpenCodeConfig)
    return ctx.config


class _Database:
    """OpenCode's session database (:mod:`.opencode.session`)."""

    key = "transcript"

    def latest(self, run: TurnRun) -> str | None:
        turn, epoch = run.turn, run.journal.lease.epoch
        return latest_turn_save(run.world, turn.session_id, turn.turn_id, epoch)

    def previous(self, run: TurnRun) -> str | None:
        return previous_turn_transcript(
            run.world, run.turn.session_id, run.turn.index, latest_turn_save
        )

    def resume_message(self, run: TurnRun, steps: list[Step], saved: Any) -> str:
        facts = database_facts(DatabaseStore(run.world).load(str(saved)), steps)
        return resume_message_from_facts(run.world, run.turn.prompt, steps, facts)

    def prepare(self, ctx: LaunchContext) -> None:
        if not ctx.plan.record:
            return
        restored = DatabaseStore(ctx.run.world).load(str(ctx.plan.record))
        ctx.session = root_session_id(restored)
        if ctx.session is None:
            raise DurableHarnessError("the saved OpenCode database holds no session to continue")
        ctx.restored[DATABASE] = restored

    def saver(self, ctx: LaunchContext, lock: Any) -> BeforeIntent:
        def before_intent(reported: str | None, tool_use_id: str) -> None:
            # OpenCode writes the tool's part a little before the plugin runs.
            data = wait_for_record(
                lambda: _read(ctx),
                lambda data: tool_use_id in tool_call_ids(data),
                _FLUSH_WAIT,
                0.05,
            )
            with lock:
                _keep(ctx, data)

        return before_intent

    def final(self, ctx: LaunchContext, outcome: dict[str, Any]) -> dict[str, Any]:
        return {"transcript": _keep(ctx, _read(ctx))}


def _read(ctx: LaunchContext) -> bytes:
    """A consistent copy of OpenCode's database where it runs (empty if none yet)."""
    path = f"{ctx.home}/{DATABASE}"
    if isinstance(ctx.host, HostCliHost) and ctx.host.user is None:
        return snapshot(Path(path))  # SQLite's backup API, while OpenCode writes
    # Whole files through read_file: in a container, and where the files are the agent
    # user's (the worker, root, must not open them through a symlink the agent made).
    return read_snapshot(ctx.host.read_file, path)


def _keep(ctx: LaunchContext, data: bytes) -> str:
    store, turn = DatabaseStore(ctx.run.world), ctx.run.turn
    saved = store.save(data)
    store.point(turn.session_id, turn.turn_id, ctx.run.journal.lease.epoch, saved)
    return saved.digest


def _launch(ctx: LaunchContext, endpoint: str) -> CliLaunch:
    model = ctx.run.turn_config.model or ctx.run.settings.model
    files, env = home_files(
        ctx.home,
        model_url=endpoint,
        harness_url=endpoint,
        token=ctx.token,
        model=model,
        mcp=True,  # the host tools and the wait tools
        retry=ctx.host.durable,
        api=_config(ctx).provider.api,
        mcp_command=ctx.host.mcp_command(f"{ctx.home}/{ENDPOINT_FILE}"),
    )
    files.update(ctx.restored)
    argv = [ctx.binary, "run", "--format", "json"]
    if ctx.session is not None:
        argv += ["--session", ctx.session]
    argv += ["--", ctx.plan.message]
    # The plugin holds the bash tool's timeout to it (read from the CLI's environment,
    # which nothing in the sandbox can change, unlike the files of its HOME).
    env["DURABLE_HARNESS_MAX_TOOL_TIMEOUT"] = f"{ctx.run.settings.max_tool_timeout:g}"
    return CliLaunch(ctx.job, argv, env, b"", files)


def _wiring(ctx: LaunchContext, hooks: ToolHooks, saver: BeforeIntent | None) -> Wiring:
    run, call_ids = ctx.run, CallIds()
    mcp = OpenCodeHostTools(
        run.journal,
        ctx.tools,
        run.turn.session_id,
        ctx.gate.signal_secret,
        hooks.ledger,
        call_ids=call_ids,
    )
    control = save_before_host_calls(run.journal, hooks.handle, saver, HOST_TOOL_PREFIX)
    return Wiring(call_ids.control(control), mcp.handle)


@dataclass
class _Output:
    """What the ``--format json`` event lines told: the texts of the newest step."""

    show: bool  # progress lines (not --quiet)
    session: str | None = None  # the session continued, or the one the CLI names
    texts: list[str] = field(default_factory=list)
    finish: str | None = None  # the newest step's finish reason
    errors: list[str] = field(default_factory=list)

    def feed(self, line: bytes) -> None:
        event = json_event(line)
        if event is None:
            return
        self.session = self.session or event.get("sessionID")
        kind = event.get("type")
        part = _dict(event.get("part"))
        if kind == "step_start":
            self.texts, self.finish = [], None
        elif kind == "text" and part.get("text"):
            self.texts.append(str(part["text"]))
            if self.show:
                progress(f"opencode: {part['text']}")
        elif kind == "tool_use" and self.show:
            state = _dict(part.get("state"))
            progress(f"opencode: {part.get('tool')} {json.dumps(state.get('input'))}")
        elif kind == "step_finish":
            self.finish = str(part.get("reason"))
        elif kind == "error":
            error = event.get("error")
            if isinstance(error, dict):
                data = _dict(error.get("data"))
                error = data.get("message") or error.get("name") or error
            self.errors.append(str(error))

    def reply(self, finished: Finished, upstream_errors: list[str]) -> str:
        upstream = "; ".join(dict.fromkeys(upstream_errors[-3:])) or None
        if self.errors or (upstream and self.finish in (None, "tool-calls")):
            text = "; ".join(self.errors) or "no reply"
            if upstream:
                raise ModelError(f"the model call failed ({upstream}); the turn will be resumed")
            raise TurnFailed(f"OpenCode ended the turn with an error: {text}")
        if self.finish is None or self.finish == "tool-calls" or finished.status != 0:
            raise DurableHarnessError(
                f"OpenCode exited with status {finished.status} without a final reply: "
                f"{finished.stderr.strip()[-500:] or 'no output'}"
            )
        return "".join(self.texts)

    def fields(self) -> dict[str, Any]:
        return {"session": self.session}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


SPEC = CliSpec(
    name="opencode",
    binary="opencode",
    product="OpenCode",
    version=OPENCODE_VERSION,
    package=f"opencode-ai@{OPENCODE_VERSION}",
    bin_env=BIN_ENV,
    read_version=_read_version,
    docker_only=False,
    parse_config=lambda data: OpenCodeConfig.parse(data, "in the turn"),
    replay_policy=OpenCodeReplayPolicy,
    upstream=resolve_endpoint,
    canonicalizer=lambda ctx: opencode_canonicalizer(_config(ctx).provider.api, ctx.home),
    record=_Database(),
    launch=_launch,
    output=lambda ctx: _Output(show=ctx.run.journal.on_step is not None, session=ctx.session),
    wiring=_wiring,
    host_tool_prefix=HOST_TOOL_PREFIX,
    waits="stop",  # OpenCode has no `defer`
    hooks_wait=20.0,  # the plugin loads later than a hook runs
    hooks_missing="OpenCode did not load the durable-harness plugin (no SessionStart arrived)",
    close_from_request=lambda hooks, body: hooks.close_from_request(anthropic_view(body)),
    numbered_resumes=False,
    wires=lambda ctx: (api_wire(_config(ctx).provider.api),),
)
