"""What the worker's servers for a container share (:class:`~.relay.UnixRelay`, the model
proxy's way in; :class:`~.egress.EgressProxy`, a setup's way out): one asyncio server on
a unix socket in the session's run folder, which the container's user may connect to,
served by one event loop in one daemon thread of the worker, so an idle connection costs
a socket, never a thread, and the server dies with the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from typing import Self

__all__ = ["UnixServer"]


class UnixServer:
    """Listen on ``path`` at once (a stale socket there, a dead worker's, is replaced);
    :meth:`start` serves it, each connection through :meth:`_handle`; :meth:`close`
    cancels every connection and removes the socket only if it is still this server's."""

    def __init__(self, path: str, thread_name: str) -> None:
        self.path = path
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(path)
            os.chmod(path, 0o666)  # the container's user (uid 1000) connects
            self._inode = os.stat(path).st_ino
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def _closing(self) -> None:
        """Called on the loop when the server stops, before the connections are cancelled."""

    def start(self) -> Self:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_unix_server(self._handle, sock=self._listener)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            self._closing()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        stop = self._stop
        if stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(stop.set)
            self._thread.join(10)
        elif not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()  # never started
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        self._listener.close()
