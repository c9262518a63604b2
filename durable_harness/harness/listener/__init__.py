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
import logging
import signal as os_signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import uvicorn

from durable_harness.harness.listener.limits import (
    ASGIApp,
    BodyLimit,
    Limits,
    Message,
    Receive,
    Refusal,
    Scope,
    Send,
    header_deadline_protocol,
    json_refusal,
    token_matches,
)
from durable_harness.harness.listener.sync import CutStream, Exchange, SyncApp

__all__ = [
    "ASGIApp",
    "BodyLimit",
    "CutStream",
    "Exchange",
    "Limits",
    "Listener",
    "Message",
    "Receive",
    "Refusal",
    "Scope",
    "Send",
    "SyncApp",
    "json_refusal",
    "token_matches",
    "wait_until_terminated",
]

log = logging.getLogger(__name__)


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
            http=header_deadline_protocol(self.limits),
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


def wait_until_terminated() -> None:
    """Block the main thread until SIGTERM or Ctrl-C: what a foreground listener command
    (``serve``, ``ui``, ``signal-server``) runs between its server's start and stop."""
    stopping = threading.Event()

    def stop(signum: int, frame: Any) -> None:
        stopping.set()

    os_signal.signal(os_signal.SIGTERM, stop)
    try:
        while not stopping.wait(0.5):  # bounded: the main thread stays responsive to signals
            pass
    except KeyboardInterrupt:
        pass
