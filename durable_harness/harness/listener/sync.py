"""Synchronous handlers on the event loop (see the package docstring): :class:`SyncApp`
runs each request's handler in a pooled daemon thread; the handler answers through its
:class:`Exchange`."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

from starlette.datastructures import Headers

from durable_harness.harness.listener.limits import Receive, Scope, Send

log = logging.getLogger(__name__)


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
