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
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from durable_harness.adapters.cli.unix_server import UnixServer
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


class UnixRelay(UnixServer):
    """Serve a TCP endpoint (the proxy) on a unix socket at ``path``, bounded as the module
    docstring says (the socket's lifecycle: :class:`~.unix_server.UnixServer`)."""

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
        settings = ListenerSettings.load()
        self.max_connections = max_connections or settings.listener_max_connections
        self.read_timeout = read_timeout or settings.listener_read_timeout_s
        self.stats = RelayStats()
        super().__init__(path, "unix-relay")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
