"""The worker's end of the way out of a Docker container: :class:`UnixRelay` serves the
model proxy's TCP endpoint on a unix socket in the session's run folder, which every
process in the container can connect to (see :mod:`.docker_host`).

Everything in the container is untrusted, so the relay is bounded the way the listeners
behind it are (``harness/listener/``), with the operator's ``ListenerSettings``:

* one event loop in one thread serves every connection: an idle connection costs a
  socket and a few hundred bytes, never a thread;
* at most ``DURABLE_HARNESS_LISTENER_MAX_CONNECTIONS`` are relayed at once; one past
  it is closed at once, unread;
* a connection must send its first bytes within ``DURABLE_HARNESS_LISTENER_READ_TIMEOUT_S``
  or it is closed without ever reaching the proxy. From then on the proxy's own limits
  hold it (the header and body deadlines, the keep-alive timeout): when the proxy closes
  its side the relay closes the client's. No idle timeout cuts a connection the proxy
  keeps, so a model answer that is slow to come is never cut here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

from durable_harness.core.settings import ListenerSettings

__all__ = ["RelayStats", "UnixRelay"]

_CHUNK = 65536
_CONNECT_TIMEOUT = 10.0


@dataclass
class RelayStats:
    """What the relay did, for tests and logs: connections relayed now and the most at
    once, those closed for the cap, and those closed for sending nothing in time."""

    active: int = 0
    peak: int = 0
    over_cap: int = 0
    silent: int = 0


class UnixRelay:
    """Serve a TCP endpoint (the proxy) on a unix socket at ``path``, bounded as the module
    docstring says. A stale socket at ``path`` (a dead worker's) is replaced;
    :meth:`close` removes the socket only if it is still this relay's."""

    def __init__(
        self,
        path: str,
        target_url: str,
        *,
        max_connections: int | None = None,
        read_timeout: float | None = None,
    ) -> None:
        parts = urlsplit(target_url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.path = path
        settings = ListenerSettings.load()
        self.max_connections = max_connections or settings.listener_max_connections
        self.read_timeout = read_timeout or settings.listener_read_timeout_s
        self.stats = RelayStats()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        os.chmod(path, 0o666)  # the container's user (uid 1000) connects
        self._inode = os.stat(path).st_ino
        self._listener.listen(128)
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="unix-relay", daemon=True)

    def start(self) -> UnixRelay:
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
        server = await asyncio.start_unix_server(self._relay, sock=self._listener)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stats = self.stats
        if stats.active >= self.max_connections:
            stats.over_cap += 1
            writer.close()
            return
        stats.active += 1
        stats.peak = max(stats.peak, stats.active)
        writers = [writer]
        try:
            try:
                first = await asyncio.wait_for(reader.read(_CHUNK), self.read_timeout)
            except TimeoutError:
                stats.silent += 1
                return
            if not first:
                return
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.target), _CONNECT_TIMEOUT
            )
            writers.append(up_writer)
            sock = up_writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up_writer.write(first)
            to_up = asyncio.ensure_future(_pipe(reader, up_writer))
            to_client = asyncio.ensure_future(_pipe(up_reader, writer))
            try:
                await asyncio.wait([to_up, to_client], return_when=asyncio.FIRST_COMPLETED)
                if to_up.done() and not to_up.result() and not to_client.done():
                    # The proxy stopped reading (it refused a body half-way): what it
                    # answered still reaches the client.
                    await asyncio.wait([to_client], timeout=self.read_timeout)
            finally:
                # Otherwise either side ending ends both, as a dropped connection would.
                to_up.cancel()
                to_client.cancel()
        except (OSError, TimeoutError):
            pass
        except asyncio.CancelledError:
            # close(): this task is the top of its connection, and asyncio's server logs
            # a cancelled handler's "exception" as a traceback.
            pass
        finally:
            stats.active -= 1
            for each in writers:
                each.close()

    def close(self) -> None:
        stop = self._stop
        if stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(stop.set)
            self._thread.join(5)
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        self._listener.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> bool:
    """Copy until ``source`` ends (True) or ``sink`` stops taking bytes (False)."""
    while True:
        try:
            data = await source.read(_CHUNK)
        except OSError:
            return True
        if not data:
            return True
        try:
            sink.write(data)
            await sink.drain()
        except OSError:
            return False
