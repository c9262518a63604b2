"""The harness's side of the ACP connection: the library's ``Client`` callbacks.

Every request of the agent is answered here: ``session/request_permission`` by the
pre-tool hook (:mod:`.acp.tools`), ``fs/*`` and ``terminal/*`` by the journaled sandbox
requests (:mod:`.acp.requests`), each in a worker thread (the journal and the sandbox
block) so the connection keeps reading. ``session/update`` feeds the reply's text, the
tool outcomes and the progress lines. A method the client did not offer (an extension,
an elicitation) is refused and ends the turn with one error (:attr:`HarnessClient.unoffered`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from acp import RequestError
from pydantic import BaseModel

from durable_harness.adapters.acp.requests import Refused, SandboxRequests
from durable_harness.adapters.acp.tools import PermissionHook
from durable_harness.adapters.cli.host import progress

__all__ = ["HarnessClient"]


def _dump(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value


class HarnessClient:
    """One launch's ``acp.Client`` (see the module docstring)."""

    def __init__(
        self,
        requests: SandboxRequests,
        permissions: PermissionHook,
        *,
        show: bool,
        on_text: Callable[[str], None] | None = None,
    ) -> None:
        self.requests = requests
        self.permissions = permissions
        self.show = show
        self.on_text = on_text
        #: The text of the agent's newest message (a new message, or a tool call, starts
        #: it again): the reply is the last thing the agent said.
        self.texts: list[str] = []
        self._message: object = None
        #: Set when the agent asked for something the client did not offer.
        self.unoffered: str | None = None
        self.unoffered_event = asyncio.Event()

    # -- the agent's requests -------------------------------------------------------

    async def request_permission(
        self, options: Any, session_id: str, tool_call: Any, **kwargs: Any
    ) -> Any:
        call, offered = _dump(tool_call), _dump(options)
        return await asyncio.to_thread(self.permissions.request, call, offered)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        data = _dump(update)
        kind = data.get("sessionUpdate")
        if kind == "agent_message_chunk":
            content = data.get("content") or {}
            if content.get("type") == "text" and content.get("text"):
                message_id = data.get("messageId")
                if message_id != self._message:
                    self._message = message_id
                    self.texts.clear()
                self.texts.append(str(content["text"]))
                if self.on_text is not None:
                    self.on_text(str(content["text"]))
        elif kind in ("tool_call", "tool_call_update"):
            if kind == "tool_call":
                self.texts.clear()
                self._message = None
            if self.show and kind == "tool_call":
                progress(f"acp: {data.get('title')} {json.dumps(data.get('rawInput'))}")
            await asyncio.to_thread(self.permissions.update, data)

    async def read_text_file(
        self, session_id: str, path: str, line: int | None = None, limit: int | None = None,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        params = {"path": path, "line": line, "limit": limit}
        return await self._serve(
            self.requests.read, {k: v for k, v in params.items() if v is not None}
        )

    async def write_text_file(self, session_id: str, path: str, content: str, **kwargs: Any) -> Any:
        return await self._serve(self.requests.write, {"path": path, "content": content})

    async def create_terminal(
        self, session_id: str, command: str, args: list[str] | None = None, env: Any = None,
        cwd: str | None = None, output_byte_limit: int | None = None, **kwargs: Any,
    ) -> Any:  # fmt: skip
        params: dict[str, Any] = {"command": command, "args": args or [], "env": _dump(env or [])}
        if cwd is not None:
            params["cwd"] = cwd
        if output_byte_limit is not None:
            params["outputByteLimit"] = output_byte_limit
        return await self._serve(self.requests.create_terminal, params)

    async def terminal_output(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        return await self._serve(self.requests.terminal_output, {"terminalId": terminal_id})

    async def wait_for_terminal_exit(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        return await self._serve(self.requests.wait_for_exit, {"terminalId": terminal_id})

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        return await self._serve(self.requests.kill, {"terminalId": terminal_id})

    async def release_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        return await self._serve(self.requests.release, {"terminalId": terminal_id})

    # -- what the client did not offer ----------------------------------------------

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> Any:
        raise self._refuse("elicitation/create")

    async def complete_elicitation(self, elicitation_id: str, **kwargs: Any) -> None:
        return None

    async def ext_method(self, method: str, params: dict[str, Any]) -> Any:
        raise self._refuse(f"_{method}")

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None  # a notification asks nothing: ignored, as ACP allows

    def _refuse(self, method: str) -> RequestError:
        self.note_unoffered(method)
        return RequestError.method_not_found(method)

    def note_unoffered(self, method: str) -> None:
        """The agent asked for ``method``, which was not offered: the turn ends."""
        if self.unoffered is not None:
            return
        self.unoffered = (
            f"the agent asked for {method!r}, which durable-harness did not offer "
            "(it offers fs/read_text_file, fs/write_text_file, terminal/* and "
            "session/request_permission)"
        )
        self.unoffered_event.set()

    async def _serve(self, call: Callable[[dict[str, Any]], Any], params: dict[str, Any]) -> Any:
        try:
            return await asyncio.to_thread(call, params)
        except Refused as exc:
            raise RequestError(-32603, str(exc)) from None
