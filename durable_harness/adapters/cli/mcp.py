"""The user's host tools, served to a CLI agent over MCP by the harness itself.

The journaling proxy answers ``POST /mcp`` (MCP's streamable HTTP transport, with plain
JSON replies) through :class:`HostToolServer`. ``tools/call`` is a journal step keyed by
the model's ``tool_use_id`` (Claude Code sends it in ``_meta["claudecode/toolUseId"]``)
and follows the tool's own replay label, exactly as in the built-in agent:

* outcome recorded: the recorded result is returned, the tool does not run;
* intent without outcome: a ``safe`` tool runs again, a ``never`` tool returns the
  *possibly ran* message as an error result;
* nothing recorded: intent, run (with the step's idempotency key), outcome.

With a :class:`~.cli.ledger.ToolLedger` (every CLI launch has one), a call is served only
for a tool use the model made this turn, with the same tool and arguments, and runs at
most once per id: anything else is refused with an error result (the token that reaches
the sandbox is no licence to run a host tool).

A host tool declared with ``approval`` is not run for a call that needs a decision: CLI
agents do not park on approval steps yet, so such a call is refused (an error result the
model sees, nothing journaled) rather than run ungated.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import TurnSuspended
from durable_harness.core.keys import tool_key
from durable_harness.core.types import StepStatus
from durable_harness.harness.approval import needs_approval
from durable_harness.harness.journal import Journal, OpenStep, Outcome, StepResult, decode_output
from durable_harness.harness.tools import Checked, Tool, ToolContext, ToolInputError

if TYPE_CHECKING:
    from durable_harness.adapters.cli.ledger import ToolLedger

__all__ = ["HOST_PREFIXES", "SERVER_NAME", "HostToolServer", "begin_host_tool", "host_names"]

SERVER_NAME = "durable-harness"
#: How the CLIs name a host tool to the model or to their hooks: Claude Code's (and Pi's
#: hooks') ``mcp__durable-harness__``, Codex's ``mcp__durable_harness__`` (its Responses
#: namespace joined by ``__``), OpenCode's ``durable-harness_``; Pi's model sees it bare.
HOST_PREFIXES = (
    f"mcp__{SERVER_NAME}__",
    f"mcp__{SERVER_NAME.replace('-', '_')}__",
    f"{SERVER_NAME}_",
)
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
TOOL_USE_META = "claudecode/toolUseId"
APPROVAL_REFUSED = (
    "durable-harness refused: this call of {name} needs a human's approval, which the "
    "harness takes for the built-in agent only; it was not run"
)


def begin_host_tool(
    journal: Journal,
    tool: Tool,
    name: str,
    tool_use_id: str,
    tool_input: Any,
    ctx: ToolContext | None = None,
) -> OpenStep | StepResult:
    """Begin the step of a host tool the CLI called (keyed by its tool_use_id, so a
    relaunch's call finds it): an open step to run, or the recorded result. A ``never``
    tool with a check (``ctx``: the context it is asked with, any seq) that finds its
    interrupted call done is finished with the check's result; absent, under a key the
    tool's downstream honours, the step comes back open to run again; else *possibly ran*."""
    settle = None
    if tool.check is not None and ctx is not None:

        def settle(seq: int) -> Checked:
            checked = tool.settle(tool_input, replace(ctx, seq=seq))
            if checked.state != "done":
                return checked
            return replace(checked, result=host_value(checked.result))

    return journal.begin_keyed(
        kind="tool",
        name=name,
        key=tool_key(tool_use_id),
        input=tool_input,
        replay=tool.replay,
        store_input=True,
        settle=settle,
        rerun_if_absent=tool.idempotent,
    )


def host_value(out: Any) -> dict[str, Any]:
    """A host tool's return value as the step's outcome (and the CLI's tool result)."""
    return {"content": out if isinstance(out, str) else _jsonish(out), "is_error": False}


def invoke_host(tool: Tool, arguments: Any, ctx: ToolContext) -> dict[str, Any]:
    """Run a host tool for a CLI: its value, or its failure as an error result (a turn
    that parks at a wait is not a failure: TurnSuspended goes up)."""
    try:
        return host_value(tool.invoke(arguments, ctx))
    except TurnSuspended:
        # A wait reached without its PreToolUse hook (which defers it): stop the launch
        # (the proxy stores this as fatal) and park the turn; nothing is recorded.
        raise
    except ToolInputError as exc:
        return {"content": str(exc), "is_error": True}
    except Exception as exc:  # a host tool's failure is its result
        return {"content": f"{type(exc).__name__}: {exc}", "is_error": True}


class HostToolServer:
    """JSON-RPC handler for one launch: ``handle(message) -> reply | None``."""

    def __init__(
        self,
        journal: Journal,
        tools: list[Tool],
        session_id: str,
        signal_secret: str = "",
        ledger: ToolLedger | None = None,
    ) -> None:
        self.journal = journal
        self.ledger = ledger
        self.tools = {t.name: t for t in tools}
        self.session_id = session_id
        self.signal_secret = signal_secret

    @property
    def prefix(self) -> str:
        """How the CLI names these tools: ``mcp__durable-harness__<name>``."""
        return f"mcp__{SERVER_NAME}__"

    def handle(self, message: Any) -> Any:
        if isinstance(message, list):  # a JSON-RPC batch
            replies = [r for r in (self.handle(m) for m in message) if r is not None]
            return replies or None
        if not isinstance(message, dict) or "id" not in message:
            return None  # a notification (initialized, cancelled, …) needs no reply
        method = message.get("method")
        params = message.get("params") or {}
        if method == "initialize":
            asked = params.get("protocolVersion")
            result: dict[str, Any] = {
                "protocolVersion": asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0],
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": SERVER_NAME, "version": "1"},
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {
                "tools": [
                    {"name": t.name, "description": t.description, "inputSchema": t.json_schema()}
                    for t in self.tools.values()
                ]
            }
        elif method == "tools/call":
            result = self.call(params)
        else:
            error = {"code": -32601, "message": f"method not found: {method}"}
            return {"jsonrpc": "2.0", "id": message["id"], "error": error}
        return {"jsonrpc": "2.0", "id": message["id"], "result": result}

    def call(self, params: dict[str, Any]) -> dict[str, Any]:
        name = str(params.get("name") or "")
        arguments = params.get("arguments") or {}
        tool_use_id = (params.get("_meta") or {}).get(TOOL_USE_META)
        tool = self.tools.get(name)
        if tool is None:
            return _result(f"unknown tool {name!r}", True)
        if not isinstance(tool_use_id, str) or not tool_use_id:
            return _result("durable-harness: the call has no tool_use_id to journal it by", True)
        if needs_approval(tool, arguments):
            return _result(APPROVAL_REFUSED.format(name=name), True)
        if self.ledger is not None:
            refused = self.ledger.refusal(tool_use_id, host_names(name), arguments)
            if refused is not None:
                return _result(refused, True)
            if not self.ledger.claim(tool_use_id):
                return self._again(tool_use_id)
            for other in sorted(self.ledger.same_call(tool_use_id) - {tool_use_id}):
                if self.journal.lookup(tool_key(other)) is not None:
                    return self._again(other)  # journaled (maybe by another worker) as that
        ctx = ToolContext(self.journal.turn_id, self.session_id, 0, self.signal_secret)
        begun = begin_host_tool(self.journal, tool, name, tool_use_id, arguments, ctx)
        if isinstance(begun, StepResult):
            if begun.status is StepStatus.POSSIBLY_RAN:
                return _result(str(begun.value), True)
            return _result(str(begun.value.get("content", "")), bool(begun.value.get("is_error")))
        value = invoke_host(tool, arguments, replace(ctx, seq=begun.step.seq))
        self.journal.end(begun, Outcome(value, {"source": "mcp"}))
        return _result(str(value["content"]), bool(value["is_error"]))

    def _again(self, tool_use_id: str) -> dict[str, Any]:
        """A second call with an id this worker already served: the recorded outcome if
        there is one, else a refusal; never a second run."""
        recorded = self.journal.lookup(tool_key(tool_use_id))
        if recorded is not None and recorded.status is StepStatus.DONE:
            value = decode_output(self.journal.world, recorded)
            if isinstance(value, dict):
                return _result(str(value.get("content", "")), bool(value.get("is_error")))
        return _result("durable-harness refused: this tool use was already called", True)


def host_names(bare: str) -> set[str]:
    """Every name under which a model may have asked for the host tool ``bare``."""
    return {bare, *(prefix + bare for prefix in HOST_PREFIXES)}


def _result(text: str, is_error: bool) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def _jsonish(value: Any) -> str:
    try:
        return canonical_json(value)
    except TypeError:
        return str(value)
