"""``/mcp`` on the official MCP SDK: the host tools' transport, not their logic.

The SDK's streamable-HTTP session manager (stateless, plain JSON replies: one POST, one
answer, as the CLIs' clients expect) speaks the protocol: ``initialize`` and version
negotiation, ``ping``, notifications, batches and malformed messages. What a tool list or
a tool call *means* stays the adapter's handler (``ProxyCallbacks.mcp``, the
:class:`~durable_harness.adapters.cli.mcp.HostToolServer` of the launch): each
``tools/list`` and ``tools/call`` is handed to it as the JSON-RPC message it always got,
``_meta`` (Claude Code's ``claudecode/toolUseId``) included, in a worker thread (the
journal is synchronous). The proxy's token (``Authorization: Bearer``) is checked first;
a wrong or malformed one is 401 and the SDK never sees the request.

An exception from the handler (a lost lease, a wait reached without its hook) stops the
turn: it is stored as the proxy's ``fatal`` before the SDK answers the call with an error.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio.to_thread
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from durable_harness.harness.listener import Receive, Scope, Send

__all__ = ["McpTransport"]

#: How the CLIs name these tools: ``mcp__durable-harness__<name>``.
SERVER_NAME = "durable-harness"

Rpc = Callable[[dict[str, Any]], dict[str, Any] | None]


class HandlerError(Exception):
    """The handler answered a JSON-RPC error (an unknown method, say)."""


class McpTransport:
    """An ASGI app for ``/mcp``; :meth:`running` must be entered on the listener's loop."""

    def __init__(
        self,
        handler: Callable[[], Rpc | None],
        authorized: Callable[[str | None], bool],
        fail: Callable[[BaseException], None],
    ) -> None:
        self._handler = handler
        self._authorized = authorized
        self._fail = fail
        server: Server[Any] = Server(
            SERVER_NAME, version="1", on_list_tools=self._list_tools, on_call_tool=self._call_tool
        )
        self._manager = StreamableHTTPSessionManager(server, json_response=True, stateless=True)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self._manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        bearer = headers.get(b"authorization", b"").decode("latin-1").removeprefix("Bearer ")
        if not self._authorized(bearer) or self._handler() is None:
            body = json.dumps({"error": "invalid durable-harness token"}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self._manager.handle_request(scope, receive, send)

    def _rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        handler = self._handler()
        if handler is None:
            raise HandlerError("no host tools for this launch")
        try:
            reply = handler({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        except BaseException as exc:
            self._fail(exc)
            raise
        if reply is None or "error" in reply:
            raise HandlerError(str((reply or {}).get("error")))
        result: dict[str, Any] = reply["result"]
        return result

    async def _list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        result = await anyio.to_thread.run_sync(self._rpc, "tools/list", {})
        return types.ListToolsResult.model_validate(result)

    async def _call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        raw = params.model_dump(by_alias=True, exclude_none=True, mode="json")
        # A stopping proxy does not wait for a host tool still running.
        result = await anyio.to_thread.run_sync(
            self._rpc, "tools/call", raw, abandon_on_cancel=True
        )
        return types.CallToolResult.model_validate(result)
