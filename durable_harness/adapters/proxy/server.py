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
hooks, authenticated by ``X-Durable-Harness-Token``) and ``POST /mcp`` (host tools over
MCP, ``Authorization: Bearer``) are handed to the adapter's callbacks.

An error that must stop the turn (the lease was lost, a replay diverged, a crash of our
own code) is raised in a server thread, so it is stored in :attr:`fatal` and signalled
through :attr:`fatal_event`; the adapter stops the CLI and re-raises it.
"""

from __future__ import annotations

import hmac
import http.client
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from durable_harness.adapters.proxy.canonical import Canonicalizer
from durable_harness.adapters.proxy.sse import EventSplitter, MalformedStream
from durable_harness.adapters.proxy.wire.anthropic import ANTHROPIC
from durable_harness.adapters.proxy.wire.base import WireFormat, error_text
from durable_harness.adapters.proxy.wire.chat import CHAT
from durable_harness.adapters.proxy.wire.responses import RESPONSES
from durable_harness.core.canonical import sha256_hex
from durable_harness.core.errors import DurableHarnessError, ModelError, ReplayDivergence
from durable_harness.core.keys import model_key, tool_key
from durable_harness.core.types import StepStatus
from durable_harness.harness.httpio import BodyCut, read_body
from durable_harness.harness.journal import Journal, OpenStep, Outcome, StepResult

__all__ = ["JournalingProxy", "ProxyCallbacks", "Upstream", "message_of"]

log = logging.getLogger(__name__)

#: Response headers worth passing on (and recording): the rest are hop-by-hop or noise.
_PASSED_HEADERS = ("content-type", "request-id", "retry-after", "x-should-retry")
_DROPPED_REQUEST_HEADERS = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding",
     "accept-encoding", "x-api-key", "authorization", "proxy-authorization", "te", "upgrade"}
)  # fmt: skip
KEY_HEADER = "X-Durable-Harness-Key"
#: The model APIs the proxy speaks, by the path of their journaled call.
WIRES: dict[str, WireFormat] = {wire.path: wire for wire in (ANTHROPIC, RESPONSES, CHAT)}
_PLAIN_PATHS = {path: wire for wire in WIRES.values() for path in wire.plain_paths}


@dataclass(frozen=True)
class Upstream:
    """The real model endpoint and the harness's own key for it."""

    base_url: str
    api_key: str
    #: Tell upstream the journal key in ``X-Durable-Harness-Key`` (tests count calls by it;
    #: only ever set for a loopback endpoint such as the fake model).
    send_key: bool = False
    timeout: float = 600.0


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


@dataclass
class ProxyStats:
    upstream_calls: int = 0  # model calls forwarded upstream
    replayed: int = 0  # answered from the journal
    by_key: dict[str, int] = field(default_factory=dict)  # forwards per journal key


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
    ) -> None:
        self.journal = journal
        self.canonicalizer = canonicalizer
        self.upstream = upstream
        self.token = token
        self.callbacks = callbacks or ProxyCallbacks()
        self.stats = ProxyStats()
        self.upstream_errors: list[str] = []
        self.fatal: BaseException | None = None
        self.fatal_event = threading.Event()
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self._closing = threading.Event()
        self._local = threading.local()
        self._server = _Server((host, 0), _Handler)
        self._server.proxy = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> JournalingProxy:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="journaling-proxy",
                daemon=True,
            )
            self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

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
        return presented is not None and hmac.compare_digest(presented, self.token)

    def tool_outcome(self, tool_use_id: str) -> str | None:
        """Digest of the recorded outcome of CLI tool call ``tool_use_id`` (canonical form)."""
        step = self.journal.lookup(tool_key(tool_use_id))
        if step is None or step.status is not StepStatus.DONE:
            return None
        return step.output_blob or sha256_hex((step.output or "").encode())

    # -- the model call --------------------------------------------------------------
    def begin(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[str, Any]:
        """Find or open the journal step of a request; waits out an identical one in flight.

        Returns ``(key, StepResult | OpenStep)``.
        """
        if self.callbacks.on_request is not None:
            self.callbacks.on_request(body)
        digest = self.canonicalizer.key(path, headers, body, self.tool_outcome)
        key = model_key(digest)
        model = str(body.get("model") or "model")
        while True:
            with self._lock:
                running = self._inflight.get(key)
                if running is None:
                    self._inflight[key] = threading.Event()
            if running is None:
                break
            running.wait()  # a retry of a request still streaming: answer it from its outcome
        try:
            begun = self.journal.begin_keyed(
                kind="model",
                name=model,
                key=key,
                input={"canonical_sha256": digest},
                replay="safe",
                store_input=False,
            )
        except BaseException:
            self.finished(key)
            raise
        if isinstance(begun, StepResult):
            self.finished(key)
        return key, begun

    def finished(self, key: str) -> None:
        with self._lock:
            event = self._inflight.pop(key, None)
        if event is not None:
            event.set()

    def connection(self) -> http.client.HTTPConnection:
        """This thread's keep-alive connection to upstream (made on first use)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            parts = urlsplit(self.upstream.base_url)
            https = parts.scheme == "https"
            cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
            conn = cls(parts.hostname or "127.0.0.1", parts.port, timeout=self.upstream.timeout)
            self._local.conn = conn
        return conn

    def drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def send_upstream(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        key: str | None,
        wire: WireFormat = ANTHROPIC,
    ) -> http.client.HTTPResponse:
        """Forward a request with the harness's key; one retry on a stale kept-alive socket."""
        base_path = urlsplit(self.upstream.base_url).path.rstrip("/")
        out = {k: v for k, v in headers.items() if k.lower() not in _DROPPED_REQUEST_HEADERS}
        out.update(wire.auth_headers(self.upstream.api_key))
        out["Accept-Encoding"] = "identity"  # the proxy reads the events it tees
        if key is not None and self.upstream.send_key:
            out[KEY_HEADER] = key
        for attempt in (1, 2):
            reused = getattr(self._local, "conn", None) is not None
            conn = self.connection()
            try:
                conn.request(method, base_path + path, body=body, headers=out)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.drop_connection()
                if attempt == 2 or not reused:
                    raise
            except OSError:
                self.drop_connection()
                raise
        raise AssertionError("unreachable")

    def note_upstream_error(self, message: str) -> None:
        with self._lock:
            self.upstream_errors.append(message)
            del self.upstream_errors[:-20]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: JournalingProxy


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "durable-harness-proxy"
    # Events go out as small writes, one after another: with Nagle's algorithm each would
    # wait for the client's delayed ACK (40 ms on Linux).
    disable_nagle_algorithm = True

    @property
    def proxy(self) -> JournalingProxy:
        server = self.server
        assert isinstance(server, _Server)
        return server.proxy

    #: The API of the request being handled (shapes the proxy's own error replies).
    wire: WireFormat = ANTHROPIC

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("proxy: " + format, *args)

    # -- routing -----------------------------------------------------------------------
    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        # Models are listed with the key the way the client sent its own.
        self.wire = ANTHROPIC if "x-api-key" in self.headers else RESPONSES
        if path.startswith("/v1/models") and self._api_authorized():
            self._forward_plain("GET", b"")
        elif path == "/mcp":
            self._send_json(405, {"error": "this MCP endpoint answers POST only"})
        else:
            self._not_found()

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        self.wire = WIRES.get(path) or _PLAIN_PATHS.get(path) or ANTHROPIC
        try:
            body = self._read_body()
        except BodyCut as exc:
            # The CLI died mid-send: half a request is never journaled nor forwarded.
            log.debug("%s: %s", path, exc)
            return
        if body is None:
            self._api_error(413, "request_too_large", "request body is too large")
        elif path in WIRES:
            if self._api_authorized():
                self._model_call(body)
        elif path in _PLAIN_PATHS:
            if self._api_authorized():
                self._forward_plain("POST", body)
        elif path.startswith("/_dh/"):
            self._control(path.removeprefix("/_dh/"), body)
        elif path == "/mcp":
            self._mcp(body)
        else:
            self._not_found()

    def do_DELETE(self) -> None:
        try:
            self._read_body()
        except BodyCut:
            return
        self._not_found()

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
        try:
            key, begun = proxy.begin(self.path, dict(self.headers.items()), body)
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
        try:
            self._forward(key, begun, raw, stream)
        finally:
            proxy.finished(key)

    def _replay(self, recorded: dict[str, Any], stream: bool) -> None:
        headers = dict(recorded.get("headers") or {})
        if stream:
            events = (
                list(recorded["events"])
                if recorded.get("stream")
                else self.wire.events_for(recorded["body"])
            )
            headers["content-type"] = "text/event-stream; charset=utf-8"
            self._start_chunked(200, headers)
            for text in events:
                self._write_chunk(text.encode())
            self._end_chunked()
        else:
            message = message_of(recorded, self.wire)
            headers["content-type"] = "application/json"
            self._send_bytes(200, json.dumps(message).encode(), headers)

    def _forward(self, key: str, step: OpenStep, raw: bytes, stream: bool) -> None:
        proxy = self.proxy
        started = time.monotonic()
        with proxy._lock:
            proxy.stats.upstream_calls += 1
            proxy.stats.by_key[key] = proxy.stats.by_key.get(key, 0) + 1
        try:
            response = proxy.send_upstream(
                "POST", self.path, dict(self.headers.items()), raw, key, self.wire
            )
        except (OSError, http.client.HTTPException) as exc:
            message = f"cannot reach the model endpoint {proxy.upstream.base_url}: {exc}"
            proxy.note_upstream_error(message)
            self._api_error(502, "api_error", f"durable-harness proxy: {message}")
            return
        headers = {k.lower(): v for k, v in response.getheaders()}
        passed = {k: v for k, v in headers.items() if k in _PASSED_HEADERS}
        if response.status != 200:
            data = response.read()
            proxy.note_upstream_error(
                f"the model endpoint answered HTTP {response.status}: {error_text(data)}"
            )
            self._send_bytes(response.status, data, passed)
            return
        if headers.get("content-type", "").startswith("text/event-stream"):
            self._tee_stream(step, response, passed, started)
        else:
            self._tee_json(step, response, passed, started, stream)

    def _tee_stream(
        self,
        step: OpenStep,
        response: http.client.HTTPResponse,
        headers: dict[str, str],
        started: float,
    ) -> None:
        proxy = self.proxy
        wire = self.wire
        splitter = EventSplitter()
        kept: list[str] = []
        parsed: list[dict[str, Any]] = []
        first_byte: float | None = None
        self._start_chunked(200, headers)
        problem: str | None = None
        stopped = False
        held: int | None = None  # kept[held:] wait until the outcome is recorded
        try:
            while not stopped and problem is None and not proxy._closing.is_set():
                chunk = response.read1(65536)
                if not chunk:
                    break
                first_byte = first_byte or time.monotonic()
                for text in splitter.feed(chunk):
                    event = wire.parse_event(text)
                    if event is None:  # a keep-alive comment
                        self._write_chunk(text.encode())
                        continue
                    kept.append(text)
                    parsed.append(event.data)
                    if held is None and wire.holds_back(event):
                        held = len(kept) - 1
                    if event.type == wire.final_event:
                        stopped = True
                        break
                    if held is None or event.type in wire.error_events:
                        self._write_chunk(text.encode())
                    if event.type in wire.error_events:
                        problem = f"the model endpoint failed mid-stream: {error_text(text)}"
                        self._end_chunked()
                        break
            if stopped:
                response.read()  # the chunked terminator, so the connection can be reused
        except MalformedStream as exc:
            problem = f"the model endpoint sent a malformed stream ({exc})"
            injected = wire.error_event("api_error", f"durable-harness proxy: {problem}")
            self._write_chunk(injected.encode())
            self._end_chunked()
        except (OSError, http.client.HTTPException) as exc:
            problem = f"the model stream broke off: {exc!r}"
        if problem is None and not stopped:
            problem = f"the model stream ended before {wire.final_event}"
        if problem is not None:
            proxy.drop_connection()
            proxy.note_upstream_error(problem)
            self.close_connection = True  # the CLI sees the stream break, as it did upstream
            return
        value = {"status": 200, "headers": headers, "stream": True, "events": kept}
        message = wire.assemble(parsed)
        self._record(step, value, message, started, first_byte)
        for text in kept[held if held is not None else -1 :]:
            self._write_chunk(text.encode())
        self._end_chunked()
        if proxy.callbacks.on_message is not None:
            proxy.callbacks.on_message(message, False)

    def _tee_json(
        self,
        step: OpenStep,
        response: http.client.HTTPResponse,
        headers: dict[str, str],
        started: float,
        stream: bool,
    ) -> None:
        proxy = self.proxy
        try:
            data = response.read()
            message = json.loads(data)
            if not self.wire.is_response(message):
                raise ValueError(f"not a {self.wire.name} response")
        except (OSError, http.client.HTTPException) as exc:
            problem = f"the model reply broke off: {exc!r}"
            proxy.drop_connection()
            proxy.note_upstream_error(problem)
            self._api_error(502, "api_error", f"durable-harness proxy: {problem}")
            return
        except ValueError as exc:
            problem = f"the model endpoint sent a malformed reply ({exc})"
            proxy.note_upstream_error(problem)
            self._api_error(502, "api_error", f"durable-harness proxy: {problem}")
            return
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
        meta = self.wire.meta(message)
        if first_byte is not None:
            meta["first_byte_ms"] = round((first_byte - started) * 1000, 1)
        try:
            self.proxy.journal.end(step, Outcome(value, meta))
        except BaseException as exc:
            self.proxy.fail(exc)
            self.close_connection = True
            raise _Failed from exc

    # -- other upstream paths, hooks, MCP ---------------------------------------------------
    def _forward_plain(self, method: str, raw: bytes) -> None:
        proxy = self.proxy
        try:
            headers = dict(self.headers.items())
            response = proxy.send_upstream(method, self.path, headers, raw, None, self.wire)
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self._api_error(502, "api_error", f"durable-harness proxy: upstream failed: {exc}")
            return
        passed = {k.lower(): v for k, v in response.getheaders() if k.lower() in _PASSED_HEADERS}
        self._send_bytes(response.status, data, passed)

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

    def _mcp(self, raw: bytes) -> None:
        proxy = self.proxy
        bearer = self.headers.get("Authorization", "").removeprefix("Bearer ")
        if not proxy.authorized(bearer) or proxy.callbacks.mcp is None:
            self._send_json(401, {"error": "invalid durable-harness token"})
            return
        try:
            reply = proxy.callbacks.mcp(json.loads(raw or b"{}"))
        except BaseException as exc:
            proxy.fail(exc)
            self._send_json(500, {"error": f"{type(exc).__name__}: {exc}"})
            return
        if reply is None:
            self._send_bytes(202, b"", {})
        else:
            self._send_json(200, reply)

    # -- plumbing ------------------------------------------------------------------------
    def _read_body(self) -> bytes | None:
        return read_body(self)

    def _not_found(self) -> None:
        self._api_error(404, "not_found_error", f"durable-harness proxy: no route for {self.path}")

    def _api_error(self, status: int, kind: str, message: str) -> None:
        self._send_json(status, self.wire.error_body(kind, message))

    def _send_json(self, status: int, value: Any) -> None:
        self._send_bytes(status, json.dumps(value).encode(), {"content-type": "application/json"})

    def _send_bytes(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if "content-type" not in {k.lower() for k in headers}:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def _start_chunked(self, status: int, headers: dict[str, str]) -> None:
        self._client_gone = False
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
        except OSError:
            self._client_gone = True

    def _write_chunk(self, data: bytes) -> None:
        # A client that went away (killed mid-stream) does not stop the tee: the answer is
        # paid for, so it is still read to the end and recorded.
        if getattr(self, "_client_gone", False) or not data:
            return
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        except OSError:
            self._client_gone = True
            self.close_connection = True

    def _end_chunked(self) -> None:
        if getattr(self, "_client_gone", False):
            return
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except _Failed:
            self.close_connection = True


def message_of(recorded: dict[str, Any], wire: WireFormat = ANTHROPIC) -> dict[str, Any]:
    """The JSON response of a recorded outcome, whichever way it was received."""
    if not recorded.get("stream"):
        body: dict[str, Any] = recorded["body"]
        return body
    events = (wire.parse_event(text) for text in recorded["events"])
    parsed = [e.data for e in events if e is not None]
    return wire.assemble(parsed)
