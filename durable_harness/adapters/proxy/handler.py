"""One request to the journaling proxy (:mod:`.server`), in a thread of its own: the
routing, a model call (journal lookup, replay, or forward and tee), the plain upstream
calls, the hooks; the policy's refusals and the proxy's own errors shaped per API."""

from __future__ import annotations

import json
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from durable_harness.adapters.proxy.chunked import ChunkedReply
from durable_harness.adapters.proxy.journaling import (
    message_of,
    read_json_reply,
    tee_stream,
)
from durable_harness.adapters.proxy.policy import (
    forwarded,
)
from durable_harness.adapters.proxy.sse import event_bytes
from durable_harness.adapters.proxy.upstream import (
    UpstreamBroke,
    UpstreamReply,
    UpstreamUnreachable,
)
from durable_harness.adapters.proxy.wire.anthropic import ANTHROPIC
from durable_harness.adapters.proxy.wire.base import WireFormat, error_text
from durable_harness.adapters.proxy.wire.chat import CHAT
from durable_harness.adapters.proxy.wire.responses import RESPONSES
from durable_harness.core.canonical import parse_json
from durable_harness.core.errors import (
    BudgetExceeded,
    DurableHarnessError,
    ModelError,
    ReplayDivergence,
)
from durable_harness.harness.journal import OpenStep, StepResult
from durable_harness.harness.listener import (
    Exchange,
)

if TYPE_CHECKING:
    from durable_harness.adapters.proxy.server import JournalingProxy

__all__ = ["PLAIN_PATHS", "WIRES", "ProxyHandler", "wire_of"]

log = logging.getLogger(__name__)

#: The model APIs the proxy speaks, by the path of their journaled call.
WIRES: dict[str, WireFormat] = {wire.path: wire for wire in (ANTHROPIC, RESPONSES, CHAT)}
PLAIN_PATHS = {path: wire for wire in WIRES.values() for path in wire.plain_paths}


def wire_of(path: str) -> WireFormat:
    """The API a request path belongs to (it shapes the proxy's own error replies)."""
    return WIRES.get(path) or PLAIN_PATHS.get(path) or ANTHROPIC


class _Failed(Exception):
    """Raised inside a handler to stop it after the response was dealt with."""


class ProxyHandler:
    """One request to the proxy, in a thread of its own (the listener's ``SyncApp``)."""

    def __init__(self, proxy: JournalingProxy, exchange: Exchange) -> None:
        self.proxy = proxy
        self.exchange = exchange
        self.headers = exchange.headers
        self.path = exchange.path
        path = urlsplit(self.path).path
        #: The API of the request being handled (shapes the proxy's own error replies).
        self.wire: WireFormat = wire_of(path)

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
        elif path in PLAIN_PATHS:
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
            body = parse_json(raw)
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
        except BudgetExceeded as exc:  # the journal's check (harness/budget.py): no call
            proxy.fail(exc)
            self._api_error(429, "rate_limit_error", f"durable-harness: {exc}")
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
        events = proxy.steps.journal.events
        on_text = None if events is None else partial(events.text, step.step.seq)
        teed = tee_stream(
            reply, ChunkedReply(self.exchange), self.wire, proxy._closing, on_text=on_text
        )
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
            reply = proxy.callbacks.control(name, parse_json(raw or b"{}"))
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
        return parse_json(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
