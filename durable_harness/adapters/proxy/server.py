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

One job per module: here the HTTP listener, its routing and the hook/MCP dispatch;
:mod:`.upstream` the model endpoint's client (httpx, retry, error mapping);
:mod:`.journaling` the journal glue (a model call's step, the tee); :mod:`.chunked` the
streamed answer to the CLI; :mod:`.sse` the events. :class:`Upstream` and
:func:`message_of` are re-exported here for the callers that import them from here.

An error that must stop the turn (the lease was lost, a replay diverged, a crash of our
own code) is raised in a server thread, so it is stored in :attr:`fatal` and signalled
through :attr:`fatal_event`; the adapter stops the CLI and re-raises it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.routing import Route, Router

from durable_harness.adapters.proxy.canonical import Canonicalizer
from durable_harness.adapters.proxy.chunked import ChunkedReply
from durable_harness.adapters.proxy.journaling import (
    ModelSteps,
    ProxyStats,
    message_of,
    read_json_reply,
    tee_stream,
)
from durable_harness.adapters.proxy.mcp_transport import McpTransport
from durable_harness.adapters.proxy.policy import (
    ProxyPolicy,
    Refusal,
    TurnLimits,
    check,
    forwarded,
)
from durable_harness.adapters.proxy.sse import event_bytes
from durable_harness.adapters.proxy.upstream import (
    Upstream,
    UpstreamBroke,
    UpstreamClient,
    UpstreamReply,
    UpstreamUnreachable,
)
from durable_harness.adapters.proxy.wire.anthropic import ANTHROPIC
from durable_harness.adapters.proxy.wire.base import WireFormat, error_text
from durable_harness.adapters.proxy.wire.chat import CHAT
from durable_harness.adapters.proxy.wire.responses import RESPONSES
from durable_harness.core.errors import (
    DurableHarnessError,
    ModelError,
    ReplayDivergence,
    TurnFailed,
)
from durable_harness.harness.journal import Journal, OpenStep, StepResult
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

#: The model APIs the proxy speaks, by the path of their journaled call.
WIRES: dict[str, WireFormat] = {wire.path: wire for wire in (ANTHROPIC, RESPONSES, CHAT)}
_PLAIN_PATHS = {path: wire for wire in WIRES.values() for path in wire.plain_paths}


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


class _Failed(Exception):
    """Raised inside a handler to stop it after the response was dealt with."""


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
        _Handler(self, exchange).handle()


def _refusal(scope: Scope, status: int, message: str) -> tuple[bytes, str]:
    """The listener's own refusals (413, 408), shaped as the API of the path asked."""
    path = scope.get("path", "")
    wire = WIRES.get(path) or _PLAIN_PATHS.get(path) or ANTHROPIC
    kind = "request_too_large" if status == 413 else "timeout_error"
    return json.dumps(wire.error_body(kind, f"durable-harness proxy: {message}")).encode(), (
        "application/json"
    )


class _Handler:
    """One request to the proxy, in a thread of its own (the listener's ``SyncApp``)."""

    def __init__(self, proxy: JournalingProxy, exchange: Exchange) -> None:
        self.proxy = proxy
        self.exchange = exchange
        self.headers = exchange.headers
        self.path = exchange.path
        path = urlsplit(self.path).path
        #: The API of the request being handled (shapes the proxy's own error replies).
        self.wire: WireFormat = WIRES.get(path) or _PLAIN_PATHS.get(path) or ANTHROPIC

    def handle(self) -> None:
        try:
            method = self.exchange.method
            if method == "GET":
                self.do_GET()
            elif method == "POST":
                self.do_POST()
            else:
                self._not_found()
        except _Failed:
            self.exchange.cut()

    # -- routing -----------------------------------------------------------------------
    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        # Models are listed with the key the way the client sent its own.
        self.wire = ANTHROPIC if "x-api-key" in self.headers else RESPONSES
        if path.startswith("/v1/models") and self._api_authorized():
            if self._allowed("GET", None):
                self._forward_plain("GET", b"")
        elif not path.startswith("/v1/models"):
            self._not_found()

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        body = self.exchange.body  # whole: the listener read it (capped, in time)
        if path in WIRES:
            if self._api_authorized():
                self._model_call(body)
        elif path in _PLAIN_PATHS:
            if self._api_authorized() and self._allowed("POST", _json_or_text(body)):
                self._forward_plain("POST", body)
        elif path.startswith("/_dh/"):
            self._control(path.removeprefix("/_dh/"), body)
        else:
            self._not_found()

    def _allowed(self, method: str, body: Any) -> bool:
        """Whether the policy lets this plain request through (answered if not)."""
        refusal = self.proxy.refusal(self.wire, method, self.path, dict(self.headers.items()), body)
        if refusal is not None:
            self._api_error(refusal.status, refusal.kind, refusal.message)
        return refusal is None

    def _api_authorized(self) -> bool:
        presented = self.headers.get("x-api-key")
        bearer = self.headers.get("Authorization", "")
        if presented is None and bearer.startswith("Bearer "):
            presented = bearer.removeprefix("Bearer ")
        if self.proxy.authorized(presented):
            return True
        self._api_error(401, "authentication_error", "invalid x-api-key for this proxy")
        return False

    # -- a model call ----------------------------------------------------------------------
    def _model_call(self, raw: bytes) -> None:
        proxy = self.proxy
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            self._api_error(400, "invalid_request_error", f"request body is not JSON: {exc}")
            return
        stream = body.get("stream") is True
        refusal = proxy.refusal(self.wire, "POST", self.path, dict(self.headers.items()), body)
        if refusal is not None and not proxy.steps.recorded(self.path, dict(self.headers), body):
            self._api_error(refusal.status, refusal.kind, refusal.message)
            return
        try:
            if proxy.callbacks.on_request is not None:
                proxy.callbacks.on_request(body)
            key, begun = proxy.steps.begin(self.path, dict(self.headers.items()), body)
        except ReplayDivergence as exc:
            proxy.fail(exc)
            self._api_error(400, "invalid_request_error", f"durable-harness replay: {exc}")
            return
        except BaseException as exc:
            proxy.fail(exc)
            self._api_error(500, "api_error", f"durable-harness could not journal the call: {exc}")
            return
        if isinstance(begun, StepResult):
            proxy.stats.replayed += 1
            self._replay(begun.value, stream)
            if proxy.callbacks.on_message is not None:
                proxy.callbacks.on_message(message_of(begun.value, self.wire), True)
            return
        rewritten = forwarded(self.wire, body, proxy.policy)
        if rewritten is not None:  # a provider-side tool the CLI always declares, taken out
            raw = json.dumps(rewritten).encode()
        try:
            self._forward(key, begun, raw, stream)
        finally:
            proxy.steps.finished(key)

    def _replay(self, recorded: dict[str, Any], stream: bool) -> None:
        headers = dict(recorded.get("headers") or {})
        if stream:
            events = (
                list(recorded["events"])
                if recorded.get("stream")
                else self.wire.events_for(recorded["body"])
            )
            headers["content-type"] = "text/event-stream; charset=utf-8"
            client = ChunkedReply(self.exchange)
            client.start(200, headers)
            for text in events:
                client.write(event_bytes(text))
            client.end()
        else:
            message = message_of(recorded, self.wire)
            headers["content-type"] = "application/json"
            self._send_bytes(200, json.dumps(message).encode(), headers)

    def _forward(self, key: str, step: OpenStep, raw: bytes, stream: bool) -> None:
        proxy = self.proxy
        started = time.monotonic()
        proxy.steps.count_forward(key)
        headers = dict(self.headers.items())
        try:
            reply = proxy._client.send("POST", self.path, headers, raw, self.wire, key)
        except UpstreamUnreachable as exc:
            message = f"cannot reach the model endpoint {proxy.upstream.base_url}: {exc}"
            proxy.note_upstream_error(message)
            self._api_error(502, "api_error", f"durable-harness proxy: {message}")
            return
        if reply.status != 200:
            self._pass_error(reply)
        elif reply.headers.get("content-type", "").startswith("text/event-stream"):
            self._tee_stream(step, reply, started)
        else:
            self._tee_json(step, reply, started, stream)

    def _pass_error(self, reply: UpstreamReply) -> None:
        """An error status from upstream reaches the CLI as it came (status and body)."""
        proxy = self.proxy
        try:
            data = reply.read()
        except UpstreamBroke as exc:
            problem = f"the model endpoint's HTTP {reply.status} reply broke off: {exc}"
            proxy.note_upstream_error(problem)
            self._api_error(502, "api_error", f"durable-harness proxy: {problem}")
            return
        finally:
            reply.close()
        proxy.note_upstream_error(
            f"the model endpoint answered HTTP {reply.status}: {error_text(data)}"
        )
        self._send_bytes(reply.status, data, reply.passed_headers())

    def _tee_stream(self, step: OpenStep, reply: UpstreamReply, started: float) -> None:
        proxy = self.proxy
        teed = tee_stream(reply, ChunkedReply(self.exchange), self.wire, proxy._closing)
        if teed.problem is not None:
            proxy.note_upstream_error(teed.problem)
            self.exchange.cut()  # the CLI sees the stream break, as it did upstream
            return
        self._record(step, teed.value, teed.message, started, teed.first_byte)
        teed.release()
        if proxy.callbacks.on_message is not None:
            proxy.callbacks.on_message(teed.message, False)

    def _tee_json(self, step: OpenStep, reply: UpstreamReply, started: float, stream: bool) -> None:
        proxy = self.proxy
        try:
            message = read_json_reply(reply, self.wire)
        except (UpstreamBroke, ValueError) as exc:
            problem = (
                f"the model reply broke off: {exc}"
                if isinstance(exc, UpstreamBroke)
                else f"the model endpoint sent a malformed reply ({exc})"
            )
            proxy.note_upstream_error(problem)
            self._api_error(502, "api_error", f"durable-harness proxy: {problem}")
            return
        headers = reply.passed_headers()
        value = {"status": 200, "headers": headers, "stream": False, "body": message}
        self._record(step, value, message, started, time.monotonic())
        self._replay(value, stream)
        if proxy.callbacks.on_message is not None:
            proxy.callbacks.on_message(message, False)

    def _record(
        self,
        step: OpenStep,
        value: dict[str, Any],
        message: dict[str, Any],
        started: float,
        first_byte: float | None,
    ) -> None:
        try:
            self.proxy.steps.record(step, self.wire, value, message, started, first_byte)
        except BaseException as exc:
            self.proxy.fail(exc)
            raise _Failed from exc

    # -- other upstream paths, hooks, MCP ---------------------------------------------------
    def _forward_plain(self, method: str, raw: bytes) -> None:
        proxy = self.proxy
        headers = dict(self.headers.items())
        try:
            reply = proxy._client.send(method, self.path, headers, raw, self.wire)
            try:
                data = reply.read()
            finally:
                reply.close()
        except (UpstreamUnreachable, UpstreamBroke) as exc:
            self._api_error(502, "api_error", f"durable-harness proxy: upstream failed: {exc}")
            return
        self._send_bytes(reply.status, data, reply.passed_headers())

    def _control(self, name: str, raw: bytes) -> None:
        proxy = self.proxy
        if not proxy.authorized(self.headers.get("X-Durable-Harness-Token")):
            self._send_json(401, {"error": "invalid durable-harness token"})
            return
        if proxy.callbacks.control is None:
            self._not_found()
            return
        try:
            reply = proxy.callbacks.control(name, json.loads(raw or b"{}"))
        except DurableHarnessError as exc:
            if not isinstance(exc, ModelError):
                proxy.fail(exc)
            self._send_json(500, {"error": str(exc)})
            return
        except BaseException as exc:
            proxy.fail(exc)
            self._send_json(500, {"error": f"{type(exc).__name__}: {exc}"})
            return
        self._send_json(200, reply)

    # -- plumbing ------------------------------------------------------------------------
    def _not_found(self) -> None:
        self._api_error(404, "not_found_error", f"durable-harness proxy: no route for {self.path}")

    def _api_error(self, status: int, kind: str, message: str) -> None:
        self._send_json(status, self.wire.error_body(kind, message))

    def _send_json(self, status: int, value: Any) -> None:
        self._send_bytes(status, json.dumps(value).encode(), {"content-type": "application/json"})

    def _send_bytes(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.exchange.send(status, data, headers)


def _json_or_text(raw: bytes) -> Any:
    """A request body as JSON (the policy refuses anything but an object)."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
