"""The journaling proxy's client of the real model endpoint, on httpx (``httpx2``).

One :class:`UpstreamClient` per proxy holds one ``httpx2.Client``: a pool of HTTP/1.1
keep-alive connections shared by the proxy's server threads, so a model call after the
first one skips the TCP (and TLS) handshake. A response is streamed: its headers come back
from :meth:`UpstreamClient.send`, its body as the bytes arrive (:meth:`UpstreamReply.chunks`,
``iter_raw``: no decoding, no re-chunking), so the proxy tees each event on at once.

Contract (the same as the ``http.client`` connection it replaces):

* the request goes out with the CLI's headers less the hop-by-hop ones and the CLI's own
  credentials, plus the harness's key (:meth:`~.wire.base.WireFormat.auth_headers`) and
  ``Accept-Encoding: identity`` (the proxy reads the events it tees); nothing of the
  client's own is added (no cookies kept between calls, no environment proxy, no
  redirects followed, no ``User-Agent`` of its own);
* **retry**: once, and only when a kept-alive connection was reused and the request broke
  before any response (upstream closed that idle socket meanwhile). A new connection that
  fails is not retried;
* errors are mapped at this boundary: :class:`UpstreamUnreachable` when no response came
  (the proxy answers 502), :class:`UpstreamBroke` when a response body broke off. A
  response with an error status is not an error here: its status and body are passed on.

``httpx2`` is the maintained continuation of httpx (same API) and the HTTP client the
``anthropic`` SDK depends on, so it costs the package no new dependency tree.
"""

from __future__ import annotations

import http.cookiejar
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx2

from durable_harness.adapters.proxy.wire.base import WireFormat
from durable_harness.core.errors import ModelError

__all__ = [
    "KEY_HEADER",
    "PASSED_HEADERS",
    "Upstream",
    "UpstreamBroke",
    "UpstreamClient",
    "UpstreamReply",
    "UpstreamUnreachable",
]

#: Response headers worth passing on (and recording): the rest are hop-by-hop or noise.
PASSED_HEADERS = ("content-type", "request-id", "retry-after", "x-should-retry")
_DROPPED_REQUEST_HEADERS = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding",
     "accept-encoding", "x-api-key", "authorization", "proxy-authorization", "te", "upgrade"}
)  # fmt: skip
#: The client's default headers that the CLI's request does not get unless it sent them.
_CLIENT_DEFAULTS = ("accept", "user-agent")
KEY_HEADER = "X-Durable-Harness-Key"
#: Errors of a request on a reused idle connection that upstream had closed meanwhile.
_STALE = (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError)


@dataclass(frozen=True)
class Upstream:
    """The real model endpoint and the harness's own key for it."""

    base_url: str
    api_key: str
    #: Tell upstream the journal key in ``X-Durable-Harness-Key`` (tests count calls by it;
    #: only ever set for a loopback endpoint such as the fake model).
    send_key: bool = False
    timeout: float = 600.0


class UpstreamUnreachable(ModelError):
    """The model endpoint gave no response (refused, reset, timed out, not HTTP)."""


class UpstreamBroke(ModelError):
    """A response of the model endpoint broke off before its end."""


class UpstreamReply:
    """A response whose body has not been read yet; close it (or read it to the end)."""

    def __init__(self, response: httpx2.Response) -> None:
        self._response = response
        self.status = response.status_code
        #: Lower-cased names; the last of repeated headers wins.
        self.headers = {k.lower(): v for k, v in response.headers.multi_items()}

    def passed_headers(self) -> dict[str, str]:
        return {k: v for k, v in self.headers.items() if k in PASSED_HEADERS}

    def chunks(self) -> Iterator[bytes]:
        """The body's bytes as they arrive (raw: no content decoding)."""
        try:
            yield from self._response.iter_raw()
        except (httpx2.HTTPError, httpx2.StreamError) as exc:
            raise UpstreamBroke(repr(exc)) from exc

    def read(self) -> bytes:
        """The whole body (its connection goes back to the pool)."""
        return b"".join(self.chunks())

    def close(self) -> None:
        """Done with the response; a connection with unread body bytes is not reused."""
        self._response.close()


def _tls_context(scheme: str) -> ssl.SSLContext:
    if scheme == "https":
        # The trust of ``http.client``: the system's store, OpenSSL's SSL_CERT_FILE/_DIR.
        return ssl.create_default_context()
    # A plain-HTTP endpoint (the fake model) never starts TLS on this pool: a verifying
    # context that trusts nothing fails closed, and spares loading the system's store
    # (tens of milliseconds) at every start of a proxy.
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class UpstreamClient:
    """See the module docstring. Thread-safe; ``close()`` ends its connections."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        parts = urlsplit(upstream.base_url)
        self._origin = f"{parts.scheme}://{parts.netloc}"
        self._base_path = parts.path.rstrip("/")
        # Idle connections stay until upstream closes them (the pool notices a closed one
        # before reusing it; the rare race is the one retry in ``send``).
        limits = httpx2.Limits(max_connections=None, keepalive_expiry=None)
        transport = httpx2.HTTPTransport(
            verify=_tls_context(parts.scheme),
            limits=limits,
            trust_env=False,
            # The request goes out as two writes (headers, then body): with Nagle's
            # algorithm the body's last segment would wait for upstream's ACK.
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )
        self._client = httpx2.Client(
            transport=transport,
            timeout=upstream.timeout,
            cookies=http.cookiejar.CookieJar(
                policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[])
            ),
            trust_env=False,
            follow_redirects=False,
        )
        for name in _CLIENT_DEFAULTS:
            del self._client.headers[name]

    def send(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        wire: WireFormat,
        key: str | None = None,
    ) -> UpstreamReply:
        """Forward a request with the harness's key; the reply's body is not read yet."""
        out = {k: v for k, v in headers.items() if k.lower() not in _DROPPED_REQUEST_HEADERS}
        out.update(wire.auth_headers(self.upstream.api_key))
        out["Accept-Encoding"] = "identity"
        if key is not None and self.upstream.send_key:
            out[KEY_HEADER] = key
        url = self._origin + self._base_path + path
        for attempt in (1, 2):
            connected: list[str] = []

            def trace(event: str, info: dict[str, Any], seen: list[str] = connected) -> None:
                if event.startswith("connection.connect_tcp."):
                    seen.append(event)

            try:
                request = self._client.build_request(
                    method, url, content=body, headers=out, extensions={"trace": trace}
                )
                return UpstreamReply(self._client.send(request, stream=True))
            except _STALE as exc:
                if attempt == 2 or connected:
                    raise UpstreamUnreachable(str(exc) or repr(exc)) from exc
            except (httpx2.HTTPError, httpx2.InvalidURL) as exc:
                raise UpstreamUnreachable(str(exc) or repr(exc)) from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._client.close()
