"""The egress proxy of a setup phase (``run --setup``, :mod:`.setup`): the one way out of a
session's container, for as long as its setup command runs, to the package registries the
operator allows.

It is a ``CONNECT``-only tunnel in the worker's process (one event loop in one thread, a
:class:`~.unix_server.UnixServer` as :class:`~.relay.UnixRelay` is), on a unix socket in
the session's run folder, which the container has mounted read-only at
``/run/durable-harness``; ``dh-bridge.js`` serves that
socket on the container's loopback and the setup command gets ``HTTP(S)_PROXY`` pointing
there. Registries are HTTPS, so the tunnel never reads what passes through it: TLS stays
end to end between the client and the registry. The request is parsed by h11 (the HTTP/1.1
parser under uvicorn and httpx). What holds, whoever connects:

* **bounded before anything else**: at most :data:`MAX_CONNECTIONS` at once (one past it
  is closed unread), :data:`MAX_HEADER_BYTES` of request head, within the operator's
  listener read timeout (408), and a tunnel idle for :data:`IDLE_TIMEOUT_S` is closed;
* **authenticated**: ``Proxy-Authorization: Basic`` with a random token per setup,
  compared in constant time; 407 without it. The token exists only in this process and in
  the setup command's environment; the tunnel ends with the setup (or with the worker: it
  is a thread of it), so the token is worth nothing afterwards;
* **only ``CONNECT`` to an allowed upstream**: any other method is 405 (no plain HTTP:
  nothing is fetched or parsed on the client's behalf), a target that is not exactly one
  of the operator's ``host:port`` is 403, and kept (escaped) for the error message;
* **capped**: every byte from the upstreams counts against ``max_bytes``; past it every
  tunnel is closed and no new one opened.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import h11

from durable_harness.adapters.cli.unix_server import UnixServer
from durable_harness.core.errors import SandboxUnavailable
from durable_harness.core.settings import ListenerSettings

__all__ = ["EgressProxy"]

MAX_CONNECTIONS = 64
MAX_HEADER_BYTES = 16 * 1024
IDLE_TIMEOUT_S = 300.0
_CONNECT_TIMEOUT_S = 15.0
_CHUNK = 65536
_USER = "dh"
_TARGET = re.compile(r"([a-z0-9.-]{1,253}):([0-9]{1,5})")
_MAX_KEPT = 20  # refused targets kept for the error message


@dataclass
class EgressStats:
    """What the proxy did: targets refused (escaped, in order, each once), targets
    connected to, bytes received from upstreams, and whether the cap cut it."""

    refused: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)
    received: int = 0
    capped: bool = False
    active: int = 0


class EgressProxy(UnixServer):
    """The tunnel on ``socket_path`` (see the module docstring; the socket's lifecycle:
    :class:`~.unix_server.UnixServer`); a context manager. SandboxUnavailable when it
    cannot listen."""

    def __init__(self, socket_path: str, registries: Sequence[str], max_bytes: int) -> None:
        self.registries = frozenset(r.strip().lower() for r in registries if r.strip())
        self.max_bytes = max_bytes
        self.token = secrets.token_urlsafe(24)
        self._expected = base64.b64encode(f"{_USER}:{self.token}".encode())
        self.read_timeout = ListenerSettings.load().listener_read_timeout_s
        self.stats = EgressStats()
        self._writers: set[asyncio.StreamWriter] = set()
        try:
            super().__init__(socket_path, "setup-egress")
        except OSError as exc:
            raise SandboxUnavailable(f"the setup's egress proxy could not listen: {exc}") from exc

    def proxy_url(self, port: int) -> str:
        """The URL a client in the container uses (the bridge's port on its loopback)."""
        return f"http://{_USER}:{self.token}@127.0.0.1:{port}"

    def _closing(self) -> None:
        for writer in list(self._writers):
            writer.close()

    def __enter__(self) -> EgressProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one client ------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stats = self.stats
        if stats.active >= MAX_CONNECTIONS or stats.capped:
            writer.close()
            return
        stats.active += 1
        self._writers.add(writer)
        try:
            request = await asyncio.wait_for(self._request(reader, writer), self.read_timeout)
            if request is not None:
                await self._tunnel(request, reader, writer)
        except TimeoutError:
            _answer(writer, 408, "Request Timeout", "the request took too long\n")
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # close(): this task is the top of its connection
        finally:
            stats.active -= 1
            self._writers.discard(writer)
            writer.close()

    async def _request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[str, int, bytes] | None:
        """The allowed, authenticated CONNECT's (host, port, bytes already read past its
        head); None once the client was answered with an error."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                status = 431 if "too long" in str(exc).lower() else 400
                _answer(writer, status, "Bad Request", "not an HTTP/1.1 request head\n")
                return None
            if event is h11.NEED_DATA:
                data = await reader.read(4096)
                if not data:
                    return None
                conn.receive_data(data)
                continue
            break
        if not isinstance(event, h11.Request):
            return None
        if event.method != b"CONNECT":
            _answer(writer, 405, "Method Not Allowed", "only CONNECT (HTTPS) is proxied\n")
            return None
        if not self._authorized(event):
            _answer(
                writer, 407, "Proxy Authentication Required", "the setup's token is needed\n",
                extra=b'Proxy-Authenticate: Basic realm="durable-harness setup"\r\n',
            )  # fmt: skip
            return None
        raw = event.target.decode("ascii", "replace")
        match = _TARGET.fullmatch(raw)
        if match is None or raw not in self.registries:
            self._note(self.stats.refused, raw)
            _answer(
                writer, 403, "Forbidden",
                f"durable-harness: {_escaped(raw)} is not a registry the operator allows for "
                "setup (DURABLE_HARNESS_SETUP_REGISTRIES)\n",
            )  # fmt: skip
            return None
        trailing, _closed = conn.trailing_data
        return match.group(1), int(match.group(2)), bytes(trailing)

    def _authorized(self, request: h11.Request) -> bool:
        for name, value in request.headers:
            if name == b"proxy-authorization":
                scheme, _, credentials = bytes(value).partition(b" ")
                if scheme.lower() != b"basic":
                    return False
                with contextlib.suppress(binascii.Error, ValueError):
                    presented = base64.b64encode(base64.b64decode(credentials.strip()))
                    return hmac.compare_digest(presented, self._expected)
                return False
        return False

    async def _tunnel(
        self, request: tuple[str, int, bytes], reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:  # fmt: skip
        host, port, early = request
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), _CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            _answer(writer, 502, "Bad Gateway", f"{host}:{port} did not answer: {exc}\n")
            return
        self._writers.add(up_writer)
        self._note(self.stats.allowed, f"{host}:{port}")
        try:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if early:
                up_writer.write(early)
            up = asyncio.ensure_future(self._pipe(reader, up_writer, count=False))
            down = asyncio.ensure_future(self._pipe(up_reader, writer, count=True))
            try:
                await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
            finally:
                up.cancel()
                down.cancel()
        finally:
            self._writers.discard(up_writer)
            up_writer.close()

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, count: bool
    ) -> None:
        while True:
            data = await asyncio.wait_for(source.read(_CHUNK), IDLE_TIMEOUT_S)
            if not data:
                return
            if count:
                self.stats.received += len(data)
                if self.stats.received > self.max_bytes:
                    self.stats.capped = True
                    for each in list(self._writers):  # every tunnel: the cap is the setup's
                        each.close()
                    return
            sink.write(data)
            await sink.drain()

    def _note(self, into: list[str], target: str) -> None:
        shown = _escaped(target)
        if shown not in into and len(into) < _MAX_KEPT:
            into.append(shown)

    # -- what the setup's error message says --------------------------------------------

    def refused(self) -> list[str]:
        """The targets refused so far (escaped), in order, each once."""
        return list(self.stats.refused)

    def allowed(self) -> list[str]:
        """The ``host:port`` targets connected to so far, each once."""
        return list(self.stats.allowed)

    def capped(self) -> bool:
        """True when the download cap cut the setup's network."""
        return self.stats.capped


def _escaped(text: str) -> str:
    """A client's text as it may be shown: printable, at most 100 characters."""
    shown = text.encode("unicode_escape").decode("ascii")
    return shown if len(shown) <= 100 else shown[:100] + "…"


def _answer(
    writer: asyncio.StreamWriter, status: int, reason: str, body: str, extra: bytes = b""
) -> None:
    data = body.encode()
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(data)}\r\nConnection: close\r\n"
    writer.write(head.encode() + extra + b"\r\n" + data)
