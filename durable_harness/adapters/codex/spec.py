"""The codex agent's :class:`~.cli.spec.CliSpec`: the real ``codex`` CLI (OpenAI Codex
0.171.0) behind the journaling proxy, run by :class:`~.cli.agent.CliAdapter`
(:mod:`.cli.agent`). What is Codex's own:

* model calls: Codex speaks the OpenAI Responses API; its ``config.toml`` names one model
  provider whose ``base_url`` is the proxy (``/v1/responses``, :mod:`.proxy.wire.responses`)
  and whose key variable holds the per-launch token, never a provider key. Requests are
  keyed by :class:`~.codex.canonical.CodexCanonicalizer`;
* tool calls: ``$CODEX_HOME/hooks.json`` has Claude Code's hook shape (``PreToolUse``
  with ``tool_name``, ``tool_input``, ``tool_use_id`` = the call id; deny and exit 2 block
  the tool), so :class:`~.hooks.ToolHooks` journals them; the shell tool (``exec_command``)
  is reported as ``Bash`` with ``{"command": …}`` and labelled like Claude Code's Bash
  (``never`` unless a ``safe_bash`` pattern marks the command safe);
* host tools and the wait tools: served over MCP by the proxy (:mod:`.codex.tools`, the
  call id from ``_meta.callId``); a wait still pending stops the CLI and parks the turn
  (:class:`~.cli.waits.WaitGate` stop mode, Codex has no ``defer``), and the next
  delivery settles the wait before resuming;
* the session record is the thread's rollout file (:mod:`.codex.session`), read where the
  CLI runs and saved before every tool intent, restored into a fresh ``CODEX_HOME`` for
  ``codex exec resume``;
* a resumed launch gets the same journal-written message as Claude Code
  (:func:`~.cli.records.compose_resume_message`), on stdin (``-``: Codex appends piped
  stdin to a prompt given as an argument, measured).

Where it runs is a :class:`~.cli.host.CliHost` (:func:`~.cli.where.open_cli_host`): the
session's Docker container, as a detached job a new worker re-attaches to after the old
one died (the only place by default), or a host folder under the developer opt-in.
Which launch runs next is decided as for Claude Code: the last launch finished → its
reply; its CLI still runs in the container (or ended well) → follow it again from its
first output line; a rollout of this turn was saved → ``resume`` it; otherwise start as
the turn first did.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from durable_harness.adapters.base import TurnRun
from durable_harness.adapters.cli.agent import find_binary, wait_for_record
from durable_harness.adapters.cli.hooks import (
    AgentConfig,
    ReplayPolicy,
    ToolHooks,
    same_call,
    save_before_host_calls,
)
from durable_harness.adapters.cli.host import CliHost, CliLaunch, Finished
from durable_harness.adapters.cli.ledger import ToolUse
from durable_harness.adapters.cli.mcp import SERVER_NAME
from durable_harness.adapters.cli.records import TranscriptStore, compose_resume_message
from durable_harness.adapters.cli.spec import BeforeIntent, CliSpec, LaunchContext, Wiring
from durable_harness.adapters.codex.canonical import CodexCanonicalizer
from durable_harness.adapters.codex.output import CodexOutput
from durable_harness.adapters.codex.session import (
    Rollout,
    latest_turn_rollout,
    lost_reply,
    point,
    previous_turn_rollout,
    rollout_facts,
)
from durable_harness.adapters.codex.setup import (
    BIN_ENV,
    CODEX_VERSION,
    codex_model,
    resolve_openai_endpoint,
)
from durable_harness.adapters.codex.tools import HOST_TOOL_PREFIX, CodexHostTools
from durable_harness.adapters.proxy.wire.responses import RESPONSES
from durable_harness.core.errors import DurableHarnessError
from durable_harness.core.types import Replay, Step

__all__ = ["CODEX_VERSION", "SPEC", "CodexReplayPolicy", "codex_model", "find_codex"]

RETRIES_ENV = "DURABLE_HARNESS_CODEX_MAX_RETRIES"
DEFAULT_CLI_RETRIES = "2"
TOKEN_ENV = "DURABLE_HARNESS_CODEX_TOKEN"  # the variable Codex reads its "API key" from
PROVIDER = "durable-harness"
_HOOK_EVENTS = ("SessionStart", "PreToolUse", "PostToolUse")
_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")
_FLUSH_WAIT = 3.0  # seconds the rollout may take to show a tool call before a save
_THREAD_IN_NAME = re.compile(
    r"-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$"
)


def find_codex() -> str:
    """The ``codex`` binary: $DURABLE_HARNESS_CODEX_BIN, the pinned install, or PATH."""
    return find_binary(SPEC)


def _read_version(host: CliHost, binary: str) -> str:
    # ``codex --version`` prints ``codex-cli 0.171.0``: the version is its last word.
    return (host.version_text(binary).split() or ["(nothing)"])[-1]


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


def _same_call(use: ToolUse, name: str, tool_input: Any) -> bool:
    """Codex reports ``exec_command`` ``{"cmd": …}`` to its hooks as ``Bash``
    ``{"command": …}``: that call is the model's when the command is the same."""
    if name == "Bash" and use.name == "exec_command":
        given = tool_input.get("command") if isinstance(tool_input, dict) else None
        asked = use.input.get("cmd") if isinstance(use.input, dict) else None
        return isinstance(asked, str) and given == asked
    return same_call(use, name, tool_input)


def _codex_home(ctx: LaunchContext) -> str:
    return f"{ctx.home}/.codex"


class _RolloutFile:
    """The thread's rollout file (:mod:`.codex.session`); the plan holds a
    :class:`~.codex.session.Rollout` as JSON under ``rollout``."""

    key = "rollout"

    def latest(self, run: TurnRun) -> dict[str, str] | None:
        turn, epoch = run.turn, run.journal.lease.epoch
        saved = latest_turn_rollout(run.world, turn.session_id, turn.turn_id, epoch)
        return None if saved is None else saved.as_json()

    def previous(self, run: TurnRun) -> dict[str, str] | None:
        previous = previous_turn_rollout(run.world, run.turn.session_id, run.turn.index)
        return None if previous is None else previous.as_json()

    def resume_message(self, run: TurnRun, steps: list[Step], saved: Any) -> str:
        rollout = Rollout.of(saved)
        assert rollout is not None  # latest() gave it
        data = TranscriptStore(run.world).load(rollout.transcript)
        facts = rollout_facts(run.world, steps, data)
        return compose_resume_message(run.world, run.turn.prompt, steps, facts, lost_reply)

    def prepare(self, ctx: LaunchContext) -> None:
        restored = Rollout.of(ctx.plan.record)
        if restored is not None:
            ctx.session = restored.thread
            data = TranscriptStore(ctx.run.world).load(restored.transcript)
            ctx.restored[f".codex/{restored.path}"] = data

    def saver(self, ctx: LaunchContext, lock: Any) -> BeforeIntent:
        codex_home = _codex_home(ctx)

        def before_intent(reported: str | None, tool_use_id: str) -> None:
            if not reported:
                raise DurableHarnessError("Codex's hook named no rollout file to save")
            rollout = PurePosixPath(reported)
            match = _THREAD_IN_NAME.search(rollout.name)
            if match is None or not rollout.is_relative_to(codex_home):
                raise DurableHarnessError(f"Codex's rollout file is not where expected: {reported}")
            data = wait_for_record(
                lambda: ctx.host.read_file(reported) or b"",
                lambda data: tool_use_id.encode() in data,
                _FLUSH_WAIT,
                0.02,
            )
            with lock:
                saved = TranscriptStore(ctx.run.world).save(data)
                relative = str(rollout.relative_to(codex_home))
                turn, epoch = ctx.run.turn, ctx.run.journal.lease.epoch
                kept = Rollout(match.group(1), relative, saved.digest)
                point(ctx.run.world, turn.session_id, turn.turn_id, epoch, kept)

        return before_intent

    def final(self, ctx: LaunchContext, outcome: dict[str, Any]) -> dict[str, Any]:
        thread = outcome.get("thread")
        if thread is None:
            return {}
        codex_home = _codex_home(ctx)
        found = ctx.host.find_files(f"{codex_home}/sessions", f"rollout-*-{thread}.jsonl")
        data = ctx.host.read_file(found[-1]) if found else None
        if data is None:
            return {}
        path = str(PurePosixPath(found[-1]).relative_to(codex_home))
        saved = TranscriptStore(ctx.run.world).save(data)
        return {"rollout": Rollout(str(thread), path, saved.digest).as_json()}


def _launch(ctx: LaunchContext, url: str) -> CliLaunch:
    home, token = ctx.home, ctx.token
    # The hook client finds the proxy through this file (in HOME, beside the Docker
    # host's node hook client).
    endpoint = f"{home}/durable-harness-endpoint.json"
    hook = {
        event: [
            {
                "matcher": "*",
                "hooks": [
                    {
                        "type": "command",
                        "command": shlex.join(ctx.host.hook_command(endpoint, event)),
                        "timeout": 600,
                    }
                ],
            }
        ]
        for event in _HOOK_EVENTS
    }
    files = {
        "durable-harness-endpoint.json": json.dumps({"url": url, "token": token}).encode(),
        ".codex/hooks.json": json.dumps({"hooks": hook}, indent=1).encode(),
        ".codex/config.toml": _config_toml(ctx, url).encode(),
        **ctx.restored,
    }
    command = [
        ctx.binary,
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--dangerously-bypass-hook-trust",  # hooks.json is ours, written per launch
    ]
    if ctx.plan.mode == "resume":
        if ctx.session is None:
            raise DurableHarnessError("a resumed Codex launch has no thread to resume")
        command += ["resume", ctx.session]
    env = {
        "HOME": home,
        "CODEX_HOME": f"{home}/.codex",
        "TERM": "dumb",
        TOKEN_ENV: token,  # the proxy's per-launch token, never a provider key
    }
    # "-": the message on stdin (piped stdin would be appended to an argument prompt).
    return CliLaunch(ctx.job, [*command, "-"], env, ctx.plan.message.encode(), files)


def _config_toml(ctx: LaunchContext, url: str) -> str:
    model = codex_model(ctx.run.config)
    retries = int(os.environ.get(RETRIES_ENV, DEFAULT_CLI_RETRIES))
    return (
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
        f'\n[mcp_servers."{SERVER_NAME}"]\n'
        f"{_mcp_server(ctx, url)}"
        # Measured: without `required`, Codex starts its first model request after ~2 s
        # whether or not the server listed its tools, so the request's tools (and its
        # journal key) would depend on timing; `required` makes it wait (or fail).
        "required = true\n"
        "startup_timeout_sec = 60\n"
    )


def _mcp_server(ctx: LaunchContext, url: str) -> str:
    """How Codex reaches the harness's own MCP server, the host tools: in Docker the stdio
    relay (its own client gave the model a call the worker's death cut off as "error
    sending request"; the relay posts it again to the next worker, which answers an
    interrupted ``never`` tool "possibly ran"); else streamable HTTP, the proxy's
    per-launch token as bearer, read from the same variable as the model key."""
    relay = ctx.host.mcp_command(f"{ctx.home}/durable-harness-endpoint.json")
    if relay is not None:
        return f"command = {json.dumps(relay[0])}\nargs = {json.dumps(relay[1:])}\n"
    return f'url = {json.dumps(url + "/mcp")}\nbearer_token_env_var = "{TOKEN_ENV}"\n'


def _wiring(ctx: LaunchContext, hooks: ToolHooks, saver: BeforeIntent | None) -> Wiring:
    run = ctx.run
    mcp = CodexHostTools(
        run.journal, ctx.tools, run.turn.session_id, ctx.gate.signal_secret, hooks.ledger
    )
    control = save_before_host_calls(run.journal, hooks.handle, saver, HOST_TOOL_PREFIX)
    return Wiring(control, mcp.handle)


def _close_from_request(hooks: ToolHooks, body: dict[str, Any]) -> None:
    """Record, from a model request, the output of a call whose PostToolUse never came."""
    items = body.get("input")
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("type") in _OUTPUT_ITEMS:
            value = {"tool_output": item.get("output")}
            hooks.close_open(str(item.get("call_id")), value, "proxy")


@dataclass
class _Output:
    """The ``--json`` events (:class:`~.codex.output.CodexOutput`)."""

    show: bool  # progress lines (not --quiet)
    events: CodexOutput

    def feed(self, line: bytes) -> None:
        self.events.feed(line, show_progress=self.show)

    def reply(self, finished: Finished, upstream_errors: list[str]) -> str:
        return self.events.reply(finished.status, finished.stderr, upstream_errors)

    def fields(self) -> dict[str, Any]:
        return {"thread": self.events.thread}


SPEC = CliSpec(
    name="codex",
    binary="codex",
    product="Codex",
    version=CODEX_VERSION,
    package=f"@openai/codex@{CODEX_VERSION}",
    bin_env=BIN_ENV,
    read_version=_read_version,
    docker_only=True,
    parse_config=lambda data: AgentConfig.parse(data, "in the turn"),
    replay_policy=CodexReplayPolicy,
    upstream=resolve_openai_endpoint,
    canonicalizer=lambda ctx: CodexCanonicalizer(home=ctx.home),
    record=_RolloutFile(),
    launch=_launch,
    output=lambda ctx: _Output(
        show=ctx.run.journal.on_step is not None, events=CodexOutput(thread=ctx.session)
    ),
    wiring=_wiring,
    host_tool_prefix=HOST_TOOL_PREFIX,
    # Codex has no `defer` hook decision: the gate stops the CLI at a pending wait.
    waits="stop",
    hooks_wait=10.0,
    hooks_missing="Codex did not run the durable-harness hooks (no SessionStart arrived)",
    close_from_request=_close_from_request,
    same_call=_same_call,
    models=lambda ctx: (codex_model(ctx.run.config),),
    wires=lambda ctx: (RESPONSES.path,),
)
