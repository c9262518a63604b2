"""The user's host tools, served to a CLI agent over MCP by the harness itself.

The journaling proxy answers ``POST /mcp`` (MCP's streamable HTTP transport, with plain
JSON replies) through :class:`HostToolServer`. ``tools/call`` is a journal step keyed by
the model's ``tool_use_id`` (Claude Code sends it in ``_meta["claudecode/toolUseId"]``)
and follows the tool's own replay label, exactly as in the built-in agent:

* outcome recorded: the recorded result is returned, the tool does not run;
* intent without outcome: a ``safe`` tool runs again, a ``never`` tool returns the
  *possibly ran* message as an error result;
* nothing recorded: intent, run (with the step's idempotency key), outcome.
"""

from __future__ import annotations

from typing import Any

from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import TurnSuspended
from durable_harness.core.keys import tool_key
from durable_harness.core.types import StepStatus
from durable_harness.harness.journal import Journal, Outcome, StepResult
from durable_harness.harness.tools import Tool, ToolContext, ToolInputError

__all__ = ["SERVER_NAME", "HostToolServer"]

SERVER_NAME = "durable-harness"
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
TOOL_USE_META = "claudecode/toolUseId"


class HostToolServer:
    """JSON-RPC handler for one launch: ``handle(message) -> reply | None``."""

    def __init__(
        self, journal: Journal, tools: list[Tool], session_id: str, signal_secret: str = ""
    ) -> None:
        self.journal = journal
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
        begun = self.journal.begin_keyed(
            kind="tool",
            name=name,
            key=tool_key(tool_use_id),
            input=arguments,
            replay=tool.replay,
            store_input=True,
        )
        if isinstance(begun, StepResult):
            if begun.status is StepStatus.POSSIBLY_RAN:
                return _result(str(begun.value), True)
            return _result(str(begun.value.get("content", "")), bool(begun.value.get("is_error")))
        ctx = ToolContext(self.journal.turn_id, self.session_id, begun.step.seq, self.signal_secret)
        try:
            out = tool.invoke(arguments, ctx)
            value = {"content": out if isinstance(out, str) else _jsonish(out), "is_error": False}
        except TurnSuspended:
            # A wait reached without its PreToolUse hook (which defers it): stop the launch
            # (the proxy stores this as fatal) and park the turn; nothing is recorded.
            raise
        except ToolInputError as exc:
            value = {"content": str(exc), "is_error": True}
        except Exception as exc:  # a host tool's failure is its result
            value = {"content": f"{type(exc).__name__}: {exc}", "is_error": True}
        self.journal.end(begun, Outcome(value, {"source": "mcp"}))
        return _result(str(value["content"]), bool(value["is_error"]))


def _result(text: str, is_error: bool) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def _jsonish(value: Any) -> str:
    try:
        return canonical_json(value)
    except TypeError:
        return str(value)
