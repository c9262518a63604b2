"""The limits every listener applies, before its app runs (see the package docstring):
the operator's :class:`Limits`, the header deadline in the HTTP protocol, the body cap
and deadline in :class:`BodyLimit`, and :func:`token_matches`."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from durable_harness.core.settings import ListenerSettings

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: Shapes a refusal of the listener's own (413, 408) the way the path's clients expect:
#: ``(scope, status, message) -> (body, content type)``.
Refusal = Callable[[Scope, int, str], tuple[bytes, str]]


@dataclass(frozen=True)
class Limits:
    """See the module docstring; :meth:`from_settings` reads the operator's."""

    max_body: int = 64 * 1024 * 1024
    read_timeout: float = 30.0
    keep_alive: float = 5.0
    max_connections: int = 1024
    backlog: int = 128
    max_header_bytes: int = 64 * 1024
    #: How long :meth:`Listener.stop` lets responses in flight finish before it drops them.
    stop_grace: float = 0.5

    @classmethod
    def from_settings(cls, **overrides: Any) -> Limits:
        settings = ListenerSettings.load()
        values: dict[str, Any] = {
            "max_body": settings.listener_max_body_bytes,
            "read_timeout": settings.listener_read_timeout_s,
            "keep_alive": settings.listener_keep_alive_s,
            "max_connections": settings.listener_max_connections,
        }
        values.update(overrides)
        return cls(**values)


def token_matches(presented: str | None, expected: str) -> bool:
    """Constant-time comparison that never raises: any header text is a (wrong) token."""
    if presented is None or not expected:
        return False
    return hmac.compare_digest(
        presented.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


def json_refusal(scope: Scope, status: int, message: str) -> tuple[bytes, str]:
    return json.dumps({"error": message}).encode(), "application/json"


# -- the body ------------------------------------------------------------------------------
class BodyLimit:
    """ASGI middleware: the whole request body, capped and in time, before the app runs."""

    def __init__(self, app: ASGIApp, limits: Limits, refusal: Refusal = json_refusal) -> None:
        self.app = app
        self.limits = limits
        self.refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.limits.max_body
        length = Headers(scope=scope).get("content-length")
        # The parser already refused a Content-Length that is not digits.
        try:
            declared = int(length) if length is not None else 0
        except ValueError:
            declared = -1
        if declared < 0:
            await self._refuse(scope, send, 400, "invalid Content-Length")
            return
        if declared > cap:
            await self._refuse(scope, send, 413, f"request body over {cap} bytes")
            return
        chunks: list[bytes] = []
        total = 0
        deadline = time.monotonic() + self.limits.read_timeout
        while True:
            try:
                async with asyncio.timeout_at(_loop_deadline(deadline)):
                    message = await receive()
            except TimeoutError:
                await self._refuse(scope, send, 408, "request body not received in time")
                return
            if message["type"] == "http.disconnect":
                # The client went away mid-send: half a request is never taken for one.
                return
            piece = message.get("body", b"")
            total += len(piece)
            if total > cap:
                await self._refuse(scope, send, 413, f"request body over {cap} bytes")
                return
            chunks.append(piece)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def whole() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # only a disconnect is left

        await self.app(scope, whole, send)

    async def _refuse(self, scope: Scope, send: Send, status: int, message: str) -> None:
        body, content_type = self.refusal(scope, status, message)
        # The rest of the body is never read: the connection cannot be reused.
        headers = [
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _loop_deadline(monotonic_deadline: float) -> float:
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_deadline - time.monotonic())


# -- the headers ---------------------------------------------------------------------------
_TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_TOO_BIG_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-length: 0\r\nconnection: close\r\n\r\n"
)


def header_deadline_protocol(limits: Limits) -> type[asyncio.Protocol]:
    class Protocol(HttpToolsProtocol):
        """uvicorn's httptools protocol with a deadline and a size cap on the headers.

        uvicorn times out only an idle keep-alive connection; a client that sends a byte
        now and then would hold a connection (and a slot of ``limit_concurrency``) forever.
        """

        _deadline: asyncio.TimerHandle | None = None
        _waiting: object = None  # the cycle before the request whose headers are awaited
        _header_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # asyncio sets TCP_NODELAY only on sockets made with proto=IPPROTO_TCP, which an
            # accepted one is not: without it each small write (an SSE event after the
            # headers) waits for the client's delayed ACK, 40 ms on Linux.
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._await_headers()

        def _await_headers(self) -> None:
            self._cancel_deadline()
            self._waiting = self.cycle
            self._header_bytes = 0
            self._deadline = self.loop.call_later(limits.read_timeout, self._too_slow)

        def _cancel_deadline(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                if self._header_bytes:
                    self.transport.write(_TIMEOUT_408)
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            waiting = self._deadline is not None
            if waiting:
                self._header_bytes += len(data)
            super().data_received(data)
            if waiting and self.cycle is not self._waiting:
                self._cancel_deadline()  # the headers are whole; the body has its own clock
            elif waiting and self._header_bytes > limits.max_header_bytes:
                self._cancel_deadline()
                if not self.transport.is_closing():
                    self.transport.write(_TOO_BIG_431)
                    self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self.pipeline:
                self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_deadline()
            super().connection_lost(exc)

    return Protocol
