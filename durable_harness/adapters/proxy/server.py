"""The journaling model proxy: the model endpoint a CLI agent is pointed at.

A CLI adapter starts one :class:`JournalingProxy` per launch of its CLI and sets the CLI's
``ANTHROPIC_BASE_URL`` to :attr:`JournalingProxy.url` and its API key to a per-turn token
that only this proxy accepts. The provider key stays in the harness (:class:`Upstream`).

For each model call (``POST /v1/messages``, ``/v1/responses``, ``/v1/chat/completions``: one
:class:`~.wire.base.WireFormat` per API says what differs; streaming SSE or JSON):

1. the request is canonicalized (a per-CLI :class:`~.proxy.canonical.Canonicalizer`) and its
   hash looked up in the turn's journal (``key = "model:<hash>"``);
2. **recorded outcome**: the recorded response is sent back exactly (same ids, same
   events, byte for byte) and upstream is not called;
3. **unseen or interrupted**: the intent is committed, the request forwarded upstream,
   and each event streamed to the CLI as it arrives while it is teed into memory; when
   the stream ends well the outcome is recorded, *then* the held-back end of the stream
   (``message_stop``, ``response.completed``, or from the Chat Completions chunk with a
   ``finish_reason`` to ``[DONE]``) is sent, so the CLI never holds a finished answer the
   journal does not;
4. **upstream errors** (an HTTP error status, an unreachable endpoint, a stream cut off or
   malformed) reach the CLI as a provider would send them (the status and body, a
   dropped connection, an in-stream error event) and leave the step an intent: a
   later identical request runs again. The last such error is kept in
   :attr:`JournalingProxy.upstream_errors` for the adapter's error message.

``POST /v1/messages/count_tokens`` and ``GET /v1/models`` are forwarded unjournaled (they
cost nothing and change nothing); other paths get a 404. Errors of the proxy's own are
shaped as the API of the path asked. ``POST /_dh/<event>`` (the CLI's
hooks, authenticated by ``X-Durable-Harness-Token``) and ``/mcp`` (host tools over MCP,
``Authorization: Bearer``; the protocol is the official SDK's, :mod:`.mcp_transport`) are
handed to the adapter's callbacks.

Before any of this, a request is held against :mod:`.policy` (the paths, models, fields,
betas and tools a CLI's model call has; the ``max_tokens`` ceiling; the turn's budget of
upstream calls): a refused one gets the API's error with the reason, and is neither
journaled nor forwarded. A request whose outcome the journal already holds is replayed
whatever the policy says: it was allowed when it was made, and answering it reaches no
upstream; a policy the operator tightened since still stops every new upstream call.

One job per module: here the proxy (its listener, the Starlette routes, the state its
requests share); :mod:`.handler` one request (routing, a model call, the hooks);
:mod:`.policy` what may be forwarded; :mod:`.upstream` the model endpoint's client
(httpx, retry, error mapping); :mod:`.journaling` the journal glue (a model call's step,
the tee); :mod:`.chunked` the streamed answer to the CLI; :mod:`.sse` the events;
:mod:`.mcp_transport` the host tools' MCP endpoint. :class:`Upstream` and
:func:`message_of` are re-exported here for the callers that import them from here.

An error that must stop the turn (the lease was lost, a replay diverged, a crash of our
own code) is raised in a server thread, so it is stored in :attr:`fatal` and signalled
through :attr:`fatal_event`; the adapter stops the CLI and re-raises it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.routing import Route, Router

from durable_harness.adapters.proxy.canonical import Canonicalizer
from durable_harness.adapters.proxy.handler import WIRES, ProxyHandler, wire_of
from durable_harness.adapters.proxy.journaling import (
    ModelSteps,
    ProxyStats,
    message_of,
)
from durable_harness.adapters.proxy.mcp_transport import McpTransport
from durable_harness.adapters.proxy.policy import (
    ProxyPolicy,
    Refusal,
    TurnLimits,
    check,
)
from durable_harness.adapters.proxy.upstream import (
    Upstream,
    UpstreamClient,
)
from durable_harness.adapters.proxy.wire.base import WireFormat
from durable_harness.core.errors import (
    TurnFailed,
)
from durable_harness.harness.journal import Journal
from durable_harness.harness.listener import (
    BodyLimit,
    Exchange,
    Limits,
    Listener,
    Scope,
    SyncApp,
    token_matches,
)

__all__ = ["JournalingProxy", "ProxyCallbacks", "ProxyStats", "Upstream", "message_of"]

log = logging.getLogger(__name__)


@dataclass
class ProxyCallbacks:
    """What the adapter plugs in; every callback runs in a server thread."""

    #: Called with each model request body before it is canonicalized.
    on_request: Callable[[dict[str, Any]], None] | None = None
    #: Called with each finished message (live or replayed).
    on_message: Callable[[dict[str, Any], bool], None] | None = None
    #: ``POST /_dh/<name>`` -> JSON reply.
    control: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
    #: ``POST /mcp`` JSON-RPC -> JSON-RPC reply, or None for a notification.
    mcp: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None


class JournalingProxy:
    """See the module docstring. Use as a context manager; ``url`` is known at once."""

    def __init__(
        self,
        journal: Journal,
        canonicalizer: Canonicalizer,
        upstream: Upstream,
        token: str,
        callbacks: ProxyCallbacks | None = None,
        host: str = "127.0.0.1",
        limits: Limits | None = None,
        *,
        models: Iterable[str] = (),
        wires: Iterable[str] = tuple(WIRES),
        policy: ProxyPolicy | None = None,
    ) -> None:
        self.steps = ModelSteps(journal, canonicalizer)
        #: The models this launch may call (the turn's, and the CLI's own), the APIs
        #: its CLI speaks and the operator's policy: what :meth:`refusal` checks.
        self.models = frozenset(models)
        self.wires = frozenset(wires)  # the journaled paths of the CLI's APIs
        self.policy = policy or ProxyPolicy()
        self.refused: list[str] = []  # the reasons of refused requests (newest last)
        self._plain_calls = 0
        self._client = UpstreamClient(upstream)  # shared by every server thread
        self.token = token
        self.callbacks = callbacks or ProxyCallbacks()
        self.upstream_errors: list[str] = []
        self.fatal: BaseException | None = None
        self.fatal_event = threading.Event()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        mcp = McpTransport(lambda: self.callbacks.mcp, self.authorized, self.fail)
        app = Router(
            routes=[Route("/mcp", mcp), Route("/{path:path}", SyncApp(self._handle))],
            redirect_slashes=False,
        )
        self._listener = Listener(
            BodyLimit(app, limits or Limits.from_settings(), _refusal),
            host,
            0,
            limits,
            name="journaling-proxy",
            lifespans=[mcp.running],
        )

    @property
    def url(self) -> str:
        return self._listener.url

    @property
    def journal(self) -> Journal:
        return self.steps.journal

    @journal.setter
    def journal(self, journal: Journal) -> None:
        self.steps.journal = journal

    @property
    def stats(self) -> ProxyStats:
        return self.steps.stats

    @property
    def upstream(self) -> Upstream:
        return self._client.upstream

    @upstream.setter
    def upstream(self, upstream: Upstream) -> None:
        old, self._client = self._client, UpstreamClient(upstream)
        old.close()

    def start(self) -> JournalingProxy:
        self._listener.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self._listener.stop()
        self._client.close()

    def __enter__(self) -> JournalingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fail(self, exc: BaseException) -> None:
        """Record an error that must stop the turn (the first one wins)."""
        with self._lock:
            if self.fatal is None:
                self.fatal = exc
        self.fatal_event.set()

    def authorized(self, presented: str | None) -> bool:
        return token_matches(presented, self.token)

    def refusal(
        self, wire: WireFormat, method: str, target: str, headers: Mapping[str, str], body: Any
    ) -> Refusal | None:
        """Why the request may not go upstream (:func:`.policy.check`), or None."""
        parts = urlsplit(target)
        journal = self.journal
        made = sum(s.attempts for s in journal.recorded.values() if s.kind == "model")
        limits = TurnLimits(
            self.models, self.wires, journal.max_model_calls, made, self._plain_calls
        )
        refusal = check(wire, method, parts.path, parts.query, headers, body, self.policy, limits)
        if refusal is not None:
            log.info("proxy refused %s %s: %s", method, parts.path, refusal.reason)
            with self._lock:
                self.refused.append(refusal.reason)
                del self.refused[:-20]
            if refusal.budget:
                self.fail(TurnFailed(refusal.reason))
        elif method == "GET" or parts.path in wire.plain_paths:
            with self._lock:
                self._plain_calls += 1
        return refusal

    def note_upstream_error(self, message: str) -> None:
        with self._lock:
            self.upstream_errors.append(message)
            del self.upstream_errors[:-20]

    def _handle(self, exchange: Exchange) -> None:
        ProxyHandler(self, exchange).handle()


def _refusal(scope: Scope, status: int, message: str) -> tuple[bytes, str]:
    """The listener's own refusals (413, 408), shaped as the API of the path asked."""
    path = scope.get("path", "")
    wire = wire_of(path)
    kind = "request_too_large" if status == 413 else "timeout_error"
    return json.dumps(wire.error_body(kind, f"durable-harness proxy: {message}")).encode(), (
        "application/json"
    )
