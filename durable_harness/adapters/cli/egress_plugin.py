"""The egress proxy's policy, loaded by proxy.py in the proxy's own process (never in the
worker's: :mod:`.egress` starts ``python -m proxy --plugins`` this module's class).

proxy.py authenticates each client (``--basic-auth``: 407 without the setup's token)
before any plugin runs; :class:`RegistriesOnly` then lets a request reach only an
upstream ``host:port`` the operator listed (``DURABLE_HARNESS_SETUP_REGISTRIES``, handed
over as ``DH_EGRESS_ALLOWED``): a ``CONNECT`` tunnel (HTTPS, the bytes stay encrypted end
to end) or a plain-HTTP request with an absolute URL. Anything else is answered 403 and
named on stderr (``dh-egress refused HOST:PORT``), where the setup's error message finds
it. A request that is not a proxy request (no host: ``GET /``) is refused the same way,
so the proxy never serves itself or guesses an upstream from a ``Host`` header.

Every byte the upstreams send is counted across all connections; past
``DH_EGRESS_MAX_BYTES`` the proxy ends itself (the setup then fails with network errors
and the worker says which cap it hit): a download cap that no client can talk around.

proxy.py serves connections in acceptor processes it forks: each is made to die with
the proxy's main process (which dies with the worker), so no acceptor outlives a worker
killed mid-setup, still listening on the run folder's socket.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading

from proxy.http.exception import HttpRequestRejected
from proxy.http.parser import HttpParser
from proxy.http.proxy import HttpProxyBasePlugin

from durable_harness.adapters.cli.egress import CAPPED

__all__ = ["RegistriesOnly"]

_ALLOWED = frozenset(
    part.strip().lower() for part in os.environ.get("DH_EGRESS_ALLOWED", "").split(",") if part
)
_MAX_BYTES = int(os.environ.get("DH_EGRESS_MAX_BYTES") or 0)
_received = 0
_lock = threading.Lock()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in proxy.py's acceptors
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the line above
        os._exit(1)


# proxy.py imports its plugins in its main process, before it forks the acceptors.
os.register_at_fork(after_in_child=_die_with_parent)


def _say(line: str) -> None:
    print(f"dh-egress {line}", file=sys.stderr, flush=True)


class RegistriesOnly(HttpProxyBasePlugin):
    """Only the allowed registries, and at most the cap of bytes from them."""

    def before_upstream_connection(self, request: HttpParser) -> HttpParser | None:
        host = (request.host or b"").decode("ascii", "replace").lower()
        target = f"{host}:{request.port}"
        if not host or target not in _ALLOWED:
            _say(f"refused {target if host else '(no host)'}")
            raise HttpRequestRejected(
                status_code=403,
                reason=b"Forbidden",
                body=(
                    f"durable-harness: {target} is not a registry the operator allows "
                    "for setup (DURABLE_HARNESS_SETUP_REGISTRIES)\n"
                ).encode(),
            )
        _say(f"allowed {target}")
        return request

    def handle_client_request(self, request: HttpParser) -> HttpParser | None:
        return request

    def handle_upstream_chunk(self, chunk: memoryview) -> memoryview | None:
        global _received
        with _lock:
            _received += len(chunk)
            over = _MAX_BYTES and _received > _MAX_BYTES
        if over:
            _say(f"{CAPPED} {_MAX_BYTES} bytes received")
            # The proxy is this one setup's: ending it (all its processes) ends its network.
            os.killpg(os.getpgrp(), signal.SIGKILL)
        return chunk
