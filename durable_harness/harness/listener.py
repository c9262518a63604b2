"""Every HTTP listener of the harness: a Starlette app on uvicorn, with the same limits.

The journaling proxy, the signal server and the fake model all listen through
:class:`Listener`. It binds its socket at once (port 0 picks a free one, so :attr:`url`
is known before :meth:`start`), runs uvicorn on its own event loop in a daemon thread,
and applies the operator's :class:`Limits` to every connection, whoever the client is:

* **headers**: a client has ``read_timeout`` seconds from its connection (or the end of
  the previous response) to finish a request's headers, and ``max_header_bytes`` of them;
  past either it is answered 408 / 431 and the connection closed. A malformed request
  line, header or chunk size (a negative Content-Length, a ``-1`` chunk) is the HTTP
  parser's 400, before any body is read;
* **body** (:class:`BodyLimit`): a Content-Length over ``max_body`` is answered 413 before
  the body is read; a chunked body is counted as it arrives and refused with 413 the
  moment it passes the cap; the whole body must arrive within ``read_timeout`` (408).
  All of it before the app runs, so before any credential is looked at. The app then
  gets the whole body as one ``http.request`` message;
* **connections**: ``max_connections`` (uvicorn's ``limit_concurrency``: open connections
  plus requests in flight; past it a request is answered 503), the listen ``backlog``,
  and ``keep_alive`` seconds for an idle connection.

The harness's request handlers are synchronous (journal commits, World calls, scripted
delays): the :class:`SyncApp` runs one per request in a daemon thread of its own (reused once idle),
so concurrent requests never wait for each other and a stuck handler never holds the event loop or
:meth:`Listener.stop`. The handler answers through its :class:`Exchange`: a whole
response (:meth:`~Exchange.send`) or a streamed one (:meth:`~Exchange.start`,
:meth:`~Exchange.write` each piece as it is ready, :meth:`~Exchange.end`), or
:meth:`~Exchange.cut` to drop the connection mid-response, as a dying server would.
Each write is handed to the event loop without waiting; every connection is
``TCP_NODELAY``, so a small write is not held back by Nagle's algorithm.

:func:`token_matches` compares a presented credential in constant time and never raises
(a non-ASCII header is a wrong token, answered 401 like any other).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.datastructures import Headers
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from durable_harness.core.settings import ListenerSettings

__all__ = [
    "BodyLimit",
    "Exchange",
    "Limits",
    "Listener",
    "SyncApp",
    "token_matches",
]

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


def _protocol(limits: Limits) -> type[asyncio.Protocol]:
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


# -- synchronous handlers ------------------------------------------------------------------
class CutStream(Exception):
    """Raised to uvicorn to drop a connection mid-response (not an error: not logged)."""


class _QuietCuts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], CutStream))


logging.getLogger("uvicorn.error").addFilter(_QuietCuts())
# uvicorn warns of each malformed request it refuses; without this, Python's last-resort
# handler would print every one on a worker's stderr (the process's logging config still
# receives them).
logging.getLogger("uvicorn").addHandler(logging.NullHandler())


class Exchange:
    """One request and its response, for a handler running in its own thread."""

    def __init__(
        self, scope: Scope, body: bytes, put: Callable[[tuple[str, Any, Any]], None]
    ) -> None:
        self.method: str = scope["method"]
        query = scope.get("query_string", b"")
        raw_path = scope.get("raw_path") or scope["path"].encode()
        #: The request target as sent (path and query), like ``http.server``'s ``path``.
        self.path: str = (raw_path + (b"?" + query if query else b"")).decode("latin-1")
        self.headers = Headers(scope=scope)
        self.body = body
        self.started = False
        self.finished = False
        self._put = put

    def send(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        """A whole response (Content-Length set here)."""
        out = {k.lower(): v for k, v in (headers or {}).items() if k.lower() != "content-length"}
        out.setdefault("content-type", "application/json")
        out["content-length"] = str(len(body))
        self.start(status, out)
        self.write(body)
        self.end()

    def start(self, status: int, headers: Mapping[str, str]) -> None:
        """Start a response; without a Content-Length it is sent chunked."""
        self.started = True
        self._emit("start", status, [(k.encode(), str(v).encode()) for k, v in headers.items()])

    def write(self, data: bytes) -> None:
        if data and not self.finished:
            self._emit("body", data, None)

    def end(self) -> None:
        if not self.finished:
            self.finished = True
            self._emit("end", None, None)

    def cut(self) -> None:
        """Drop the connection without ending the response (the client sees it break)."""
        if not self.finished:
            self.finished = True
            self._emit("cut", None, None)

    def _emit(self, kind: str, a: Any, b: Any) -> None:
        try:
            self._put((kind, a, b))
        except RuntimeError:  # the listener stopped (its loop is closed): nobody to tell
            self.finished = True


Handler = Callable[[Exchange], None]


class _Workers:
    """Daemon threads for the handlers, kept for the next request once idle: starting a
    thread per request would add its start-up to every answer's first byte. There are
    never more than the requests in flight at once (which ``max_connections`` bounds),
    and a stuck handler never holds :meth:`Listener.stop` or the interpreter's exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = 0
        self._work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._work.put(job)
        if spawn:
            threading.Thread(target=self._serve, name="listener-request", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self._work.get()
            job()
            with self._lock:
                if self._idle >= _IDLE_WORKERS:
                    return
                self._idle += 1


#: Idle handler threads kept (per process, shared by its listeners).
_IDLE_WORKERS = 16
_WORKERS = _Workers()


class SyncApp:
    """An ASGI app running ``handler`` in a daemon thread per request (behind
    :class:`BodyLimit`, which gives it the whole body). A class, not a function, so a
    Starlette ``Route`` takes it as an ASGI app."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any, Any]] = asyncio.Queue()

        def put(item: tuple[str, Any, Any]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        exchange = Exchange(scope, message.get("body", b""), put)
        handler = self.handler

        def run() -> None:
            try:
                handler(exchange)
            except BaseException:
                log.exception("%s %s: the handler failed", exchange.method, exchange.path)
                if not exchange.started:
                    exchange.send(500, b'{"error": "internal error"}')
                else:
                    exchange.cut()
            finally:
                exchange._emit("done", None, None)

        _WORKERS.submit(run)
        while True:
            kind, a, b = await queue.get()
            if kind == "start":
                await send({"type": "http.response.start", "status": a, "headers": b})
            elif kind == "body":
                await send({"type": "http.response.body", "body": a, "more_body": True})
            elif kind == "end":
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif kind == "cut":
                raise CutStream
            else:  # done
                if not exchange.finished:
                    raise CutStream  # a handler that never answered: drop the connection
                return


# -- the listener --------------------------------------------------------------------------
class Listener:
    """One uvicorn server for ``app`` on a socket bound now; see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: Limits | None = None,
        name: str = "listener",
        lifespans: Sequence[Callable[[], AbstractAsyncContextManager[Any]]] = (),
    ) -> None:
        self.limits = limits or Limits.from_settings()
        self.name = name
        #: Entered on the listener's loop before it serves, left after (an app's task group).
        self._lifespans = tuple(lifespans)
        # OSError (the port is taken) reaches the caller, which words it.
        self._socket = socket.create_server((host, port), backlog=self.limits.backlog)
        config = uvicorn.Config(
            app,
            http=_protocol(self.limits),
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            limit_concurrency=self.limits.max_connections,
            backlog=self.limits.backlog,
            timeout_keep_alive=self.limits.keep_alive,  # type: ignore[arg-type]
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._socket.getsockname()[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    @property
    def port(self) -> int:
        return self.address[1]

    def start(self) -> Listener:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
            self._ready.wait()
            if self._failed is not None:
                raise self._failed
        return self

    def stop(self) -> None:
        """Stop accepting, let responses in flight finish for ``stop_grace``, drop the rest."""
        thread, self._thread = self._thread, None
        if thread is not None and self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
            thread.join()
        self._socket.close()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start(), or logged once serving
            if not self._ready.is_set():
                self._failed = exc
            else:
                log.exception("%s: the listener failed", self.name)
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        server = self._server
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server.config.load()
        server.lifespan = server.config.lifespan_class(server.config)
        async with contextlib.AsyncExitStack() as stack:
            for lifespan in self._lifespans:
                await stack.enter_async_context(lifespan())
            await server.startup(sockets=[self._socket])
            self._ready.set()
            await self._stop.wait()
            await self._shutdown()

    async def _shutdown(self) -> None:
        server = self._server
        # uvicorn's own shutdown waits for every connection in 0.1 s steps and without a
        # bound; a stopping harness only lets the answers in flight finish briefly.
        for listening in server.servers:
            listening.close()
        state = server.server_state
        for connection in list(state.connections):
            connection.shutdown()  # closes the idle ones, the busy ones after their answer
        deadline = time.monotonic() + self.limits.stop_grace
        while (state.connections or state.tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(state.connections):
            connection.transport.close()
        for task in list(state.tasks):
            task.cancel()
        await asyncio.sleep(0)
