"""The pi agent's :class:`~.cli.spec.CliSpec`: the real ``pi`` CLI
(``@mariozechner/pi-coding-agent``) behind the proxy, run by :class:`~.cli.agent.CliAdapter`.

Pi speaks the Anthropic Messages API (or, chosen in the agent config, Chat Completions or
Responses: :mod:`.pi.provider`) to a provider named in its ``models.json``; the adapter
points that provider at the journaling proxy, so every model call is a journal step keyed
by its canonical request (:class:`~.pi.canonical.PiCanonicalizer`), exactly as for Claude
Code. What is Pi's own:

* one turn is one or more **launches** (journal steps ``launch:<n>``, kind ``agent``);
* Pi's tool calls are journaled by an extension (``extension.js``) that posts
  Claude-Code-shaped hook payloads to :class:`~.hooks.ToolHooks` (fail closed: a tool
  never runs unless its intent was recorded), with :class:`PiReplayPolicy` labels; the
  user's host tools are registered as Pi tools that call the harness's MCP endpoint
  (Pi itself has no MCP client); their calls reach the hooks too, named
  ``mcp__durable-harness__<tool>``, so Pi's session file is saved before their intent;
* the wait tools (``wait_for_signal``, ``sleep_until``) are host tools gated by
  :class:`~.cli.waits.WaitGate` in stop mode (Pi has no ``defer``): a wait still pending
  stops the CLI and parks the turn; the next delivery settles the wait before resuming;
* Pi's session file (``--session <file>``, set up front) is saved to the World before
  every tool intent and after the launch, restored for a resume, and the resumed CLI is
  told from the journal what happened to each call (:func:`~.cli.records.resume_message`).

The CLI runs with a private HOME per launch holding ``~/.pi/agent/models.json`` (the
proxy's URL and a per-launch token as the API key, never a provider key) and
``settings.json``; extension, skill, prompt-template and theme discovery are off, so
nothing in the workspace can switch the journaling extension off. Where it runs is a
:class:`~.cli.host.CliHost` (:mod:`.cli.launches`): the session's Docker container
(``--workspace docker``: a detached job that outlives the worker; a new worker
re-attaches to it), or a host folder, the local sandbox (the CLI dies with the worker
and a new launch resumes the saved session file).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_harness.adapters.base import TurnRun
from durable_harness.adapters.cli.agent import find_binary
from durable_harness.adapters.cli.hooks import ReplayPolicy, ToolHooks, save_before_host_calls
from durable_harness.adapters.cli.host import CliHost, CliLaunch, Finished, json_event, progress
from durable_harness.adapters.cli.mcp import SERVER_NAME, HostToolServer
from durable_harness.adapters.cli.provider_api import anthropic_view, api_wire
from durable_harness.adapters.cli.spec import BeforeIntent, CliSpec, Control, LaunchContext, Wiring
from durable_harness.adapters.cli.transcript import TranscriptFile
from durable_harness.adapters.pi.provider import PiConfig, pi_canonicalizer, pi_provider
from durable_harness.adapters.pi.session import pi_session_facts
from durable_harness.core.errors import DurableHarnessError, ModelError, TurnFailed
from durable_harness.core.keys import tool_key
from durable_harness.core.types import Replay, StepStatus
from durable_harness.harness.endpoint import resolve_endpoint
from durable_harness.harness.journal import decode_output

__all__ = ["PI_VERSION", "SPEC", "PiReplayPolicy", "find_pi", "recorded_results"]

#: The one Pi version this adapter's rules were measured on (scripts/setup).
PI_VERSION = "0.73.1"
BIN_ENV = "DURABLE_HARNESS_PI_BIN"
RETRIES_ENV = "DURABLE_HARNESS_PI_MAX_RETRIES"
DEFAULT_CLI_RETRIES = 2
ENDPOINT_ENV = "DURABLE_HARNESS_PI_ENDPOINT"  # read by extension.js
PROVIDER = "durable-harness"
RECORD_PREFIX = "pi"  # session records pi/<turn>/<epoch>
EXTENSION = Path(__file__).with_name("extension.js")
#: Pi's built-in tools that only read; bash, edit, write (and anything else) are ``never``.
SAFE_TOOLS = frozenset({"read", "grep", "find", "ls"})
BUILTIN_TOOLS = SAFE_TOOLS | {"bash", "edit", "write"}
_FLUSH_WAIT = 3.0  # seconds the session file may take to show a tool call before a save
_AGENT_DIR = ".pi/agent"
_SESSION = f"{_AGENT_DIR}/sessions/durable-harness.jsonl"
_ENDPOINT_FILE = "durable-harness-endpoint.json"
_EXTENSION_FILE = "durable-harness-pi.js"
#: How the extension names a host tool (or a wait tool) to the hooks, as Claude Code does.
HOST_TOOL_PREFIX = f"mcp__{SERVER_NAME}__"


def find_pi() -> str:
    """The ``pi`` binary: $DURABLE_HARNESS_PI_BIN, the project's pinned install
    (``.tools/npm`` of a checkout, or ``setup-agents``'s user cache), or PATH."""
    return find_binary(SPEC)


def package_dir(binary: str, host: CliHost | None = None) -> str:
    """The folder Pi is installed in (``…/pi-coding-agent``), named in its system prompt."""
    resolved = host.realpath(binary) if host is not None else str(Path(binary).resolve())
    return str(Path(resolved).parents[1])


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


#: Pi's session file (``--session <file>``, set up front), saved as ``pi/<turn>/<epoch>``.
_SESSION_FILE = TranscriptFile(
    path=lambda ctx: _SESSION,
    facts_of=pi_session_facts,
    record_prefix=RECORD_PREFIX,
    # Pi appends the assistant message before it runs the tool_call handlers.
    flush_wait=_FLUSH_WAIT,
    poll=0.01,
)


def _launch(ctx: LaunchContext, url: str) -> CliLaunch:
    """Pi's models.json and settings.json, the extension and its endpoint file, the
    session file to continue, and the command."""
    home, token = ctx.home, ctx.token
    model = ctx.run.turn_config.model or ctx.run.settings.model
    provider = {
        **pi_provider(_config(ctx).provider.api, url),  # the proxy, in the chosen API
        "apiKey": token,  # the proxy's per-launch token, never a provider key
        "models": [{"id": model}],
    }
    retries = int(os.environ.get(RETRIES_ENV, DEFAULT_CLI_RETRIES))
    settings = {"retry": {"enabled": retries > 0, "maxRetries": retries}}
    host_tools = [
        {"name": t.name, "description": t.description, "inputSchema": t.json_schema()}
        for t in ctx.tools
    ]
    endpoint: dict[str, Any] = {
        "url": url,
        "token": token,
        "hostTools": host_tools,
        "hostToolPrefix": HOST_TOOL_PREFIX,
    }
    if ctx.host.durable:
        endpoint["retry"] = True  # the CLI outlives a dead worker: wait for the next
    files = {
        f"{_AGENT_DIR}/models.json": json.dumps({"providers": {PROVIDER: provider}}).encode(),
        f"{_AGENT_DIR}/settings.json": json.dumps(settings).encode(),
        f"{_AGENT_DIR}/{_ENDPOINT_FILE}": json.dumps(endpoint).encode(),
        _EXTENSION_FILE: EXTENSION.read_bytes(),
        **ctx.restored,
    }
    argv = [
        ctx.binary,
        "-p",
        "--mode", "json",
        "--model", f"{PROVIDER}/{model}",
        "--session", f"{home}/{_SESSION}",
        # Nothing found in the workspace or HOME may load: an extension there
        # could switch the journaling extension's hooks off.
        "--no-extensions", "-e", f"{home}/{_EXTENSION_FILE}",
        "--no-skills", "--no-prompt-templates", "--no-themes",
    ]  # fmt: skip
    env = {
        "HOME": home,
        "TERM": "dumb",
        "PI_OFFLINE": "1",  # no update checks or other startup traffic
        ENDPOINT_ENV: f"{home}/{_AGENT_DIR}/{_ENDPOINT_FILE}",
        # The extension holds the bash tool's timeout to it (Pi's own has no default).
        "DURABLE_HARNESS_MAX_TOOL_TIMEOUT": f"{ctx.run.settings.max_tool_timeout:g}",
    }
    # The message on stdin, not argv: a prompt can look like a flag or an @file.
    return CliLaunch(ctx.job, argv, env, ctx.plan.message.encode(), files)


def _config(ctx: LaunchContext) -> PiConfig:
    assert isinstance(ctx.config, PiConfig)
    return ctx.config


def recorded_results(run: TurnRun, hooks: ToolHooks) -> Control:
    """The hooks' handler, answering a PostToolUse of a call the journal already finished
    with the recorded result (``{"replace": ...}``), which the extension shows the model."""

    def control(event: str, payload: dict[str, Any]) -> dict[str, Any]:
        if event != "PostToolUse":
            return hooks.handle(event, payload)
        tool_use_id = str(payload.get("tool_use_id") or "")
        opened = tool_use_id in hooks.open
        reply = hooks.handle(event, payload)
        if "refused" in reply:
            return reply  # not a call the model made: nothing recorded, nothing replaced
        recorded = None if opened else run.journal.lookup(tool_key(tool_use_id))
        if recorded is not None and recorded.status is StepStatus.DONE:
            # Ran although the journal already had its outcome: the model must see
            # the recorded result, as every other run of this turn did.
            value = decode_output(run.world, recorded)
            response = value.get("tool_response") if isinstance(value, dict) else None
            if isinstance(response, dict):
                return {"replace": response}
        return {}

    return control


def _wiring(ctx: LaunchContext, hooks: ToolHooks, saver: BeforeIntent | None) -> Wiring:
    mcp = HostToolServer(
        ctx.run.journal, ctx.tools, ctx.run.turn.session_id, ctx.gate.signal_secret, hooks.ledger
    )
    control = save_before_host_calls(
        ctx.run.journal, recorded_results(ctx.run, hooks), saver, prefix=HOST_TOOL_PREFIX
    )
    return Wiring(control, mcp.handle)


@dataclass
class _Output:
    """What a launch's ``--mode json`` output said."""

    show: bool  # progress lines (not --quiet)
    last_assistant: dict[str, Any] | None = None  # the newest finished assistant message
    ended: bool = False  # agent_end arrived: Pi finished the turn

    def feed(self, line: bytes) -> None:
        event = json_event(line)
        if event is None:
            return
        kind = event.get("type")
        if kind == "agent_end":
            self.ended = True
            return
        message = event.get("message")
        if kind != "message_end" or not isinstance(message, dict):
            return
        if message.get("role") != "assistant":
            return
        self.last_assistant = message
        if not self.show:
            return
        for block in message.get("content") or []:
            if block.get("type") == "text" and block.get("text"):
                progress(f"pi: {block['text']}")
            elif block.get("type") == "toolCall":
                progress(f"pi: {block.get('name')} {json.dumps(block.get('arguments'))}")

    def reply(self, finished: Finished, upstream_errors: list[str]) -> str:
        message = self.last_assistant
        upstream = "; ".join(dict.fromkeys(upstream_errors[-3:])) or None
        if message is None or not self.ended:
            raise DurableHarnessError(
                f"Pi exited with status {finished.status} without finishing the turn"
                + (f" (last model error: {upstream})" if upstream else "")
                + f": {finished.stderr.strip()[-500:] or 'no output'}"
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

    def fields(self) -> dict[str, Any]:
        return {}


SPEC = CliSpec(
    name="pi",
    binary="pi",
    product="Pi",
    version=PI_VERSION,
    package=f"@mariozechner/pi-coding-agent@{PI_VERSION}",
    bin_env=BIN_ENV,
    # Pi prints its version on stderr.
    read_version=lambda host, binary: host.version(binary, {"PI_OFFLINE": "1"}),
    docker_only=False,
    parse_config=lambda data: PiConfig.parse(data, "in the turn"),
    replay_policy=PiReplayPolicy,
    upstream=resolve_endpoint,
    canonicalizer=lambda ctx: pi_canonicalizer(
        _config(ctx).provider.api, package_dir(ctx.binary, ctx.host)
    ),
    record=_SESSION_FILE,
    launch=_launch,
    output=lambda ctx: _Output(show=ctx.run.journal.on_step is not None),
    wiring=_wiring,
    host_tool_prefix=HOST_TOOL_PREFIX,  # how the extension names a host tool
    waits="stop",  # Pi has no `defer`
    hooks_wait=10.0,
    hooks_missing="Pi did not load the durable-harness extension (no session_start arrived)",
    close_from_request=lambda hooks, body: hooks.close_from_request(anthropic_view(body)),
    # A host tool may not take the name of one of Pi's built-in tools.
    reserved_tools=BUILTIN_TOOLS,
    wires=lambda ctx: (api_wire(_config(ctx).provider.api),),
)
