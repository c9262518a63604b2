"""The fake model's HTTP side: the request handler and its threading server.

The handler routes each request to the server's answerer (a
:class:`~durable_harness.testing.fake_model.FakeModelServer`, seen here through the
:class:`Answerer` protocol), has it logged, then sends the answer: JSON, a broken JSON
body, or an SSE stream with the script's delays and faults.
"""

from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

from durable_harness.core.canonical import dumps_compact
from durable_harness.harness.httpio import BodyCut, read_body
from durable_harness.testing.fake_model_answers import Answer
from durable_harness.testing.fake_model_chat import CHAT_PATH
from durable_harness.testing.fake_model_responses import RESPONSES_PATH
from durable_harness.testing.fake_model_script import error_body

log = logging.getLogger("durable_harness.testing.fake_model")


class Answerer(Protocol):
    """What the handler asks of the server behind it."""

    def stats(self) -> dict[str, Any]: ...
    def answer_messages(self, body: bytes) -> Answer: ...
    def answer_responses(self, body: bytes) -> Answer: ...
    def answer_chat(self, body: bytes) -> Answer: ...
    def answer_count_tokens(self, body: bytes) -> Answer: ...
    def record(self, answer: Answer, api_key_sent: bool) -> None: ...
    def stopping_within(self, seconds: float) -> bool: ...


class FakeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    fake: Answerer


class FakeModelHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 so clients keep connections alive and streams use chunked encoding, as
    # Anthropic's do; every response therefore sets Content-Length or is chunked.
    protocol_version = "HTTP/1.1"
    server_version = "durable-harness-fake-model"
    # Each event is its own small write, as a provider streams it; with Nagle's algorithm
    # on, a write could wait for the client's delayed ACK (40 ms on Linux).
    disable_nagle_algorithm = True

    @property
    def fake(self) -> Answerer:
        server = self.server
        assert isinstance(server, FakeHTTPServer)
        return server.fake

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/_fake/stats":
            self._send_json(200, dumps_compact(self.fake.stats()), {})
        else:
            self._not_found(path)

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        try:
            body = self._read_body()
        except BodyCut as exc:
            # Half a request from a client that is gone: not a request, so not logged.
            log.debug("%s: %s", path, exc)
            return
        if body is None:
            answer = Answer(
                status=413,
                path=path,
                body=error_body("request_too_large", "request body is too large"),
            )
        elif path == "/v1/messages":
            answer = self.fake.answer_messages(body)
        elif path == "/v1/messages/count_tokens":
            answer = self.fake.answer_count_tokens(body)
        elif path == RESPONSES_PATH:
            answer = self.fake.answer_responses(body)
        elif path == CHAT_PATH:
            answer = self.fake.answer_chat(body)
        else:
            self._not_found(path)
            return
        self._respond(answer)

    def do_PUT(self) -> None:
        # Read the body anyway: the connection stays alive for the client's next request.
        try:
            if self._read_body() is None:
                self.close_connection = True
        except BodyCut:
            return
        self._not_found(urlsplit(self.path).path)

    do_DELETE = do_PATCH = do_PUT

    def _not_found(self, path: str) -> None:
        answer = Answer(
            status=404,
            path=path,
            body=error_body("not_found_error", f"fake model: no route for {self.command} {path}"),
        )
        self._respond(answer)

    def _read_body(self) -> bytes | None:
        return read_body(self)

    def _respond(self, answer: Answer) -> None:
        api_key_sent = bool(self.headers.get("x-api-key") or self.headers.get("Authorization"))
        answer.request_key = self.headers.get("X-Durable-Harness-Key")
        self.fake.record(answer, api_key_sent)
        if answer.delay_s and self.fake.stopping_within(answer.delay_s):
            self.close_connection = True
            return
        try:
            if answer.events is not None and answer.status == 200:
                self._send_stream(answer)
            elif answer.stream_fault is not None and answer.status == 200:
                self._send_broken_json(answer)
            else:
                self._send_json(answer.status, answer.body, answer.headers)
        except (BrokenPipeError, ConnectionResetError):
            # The client went away (a test killing it mid-stream): nothing left to do.
            self.close_connection = True

    def _send_json(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_broken_json(self, answer: Answer) -> None:
        """A JSON reply cut in half: malformed (the connection stays), or dropped."""
        half = answer.body[: len(answer.body) // 2]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        full = answer.stream_fault == "drop"  # promise the whole body, then hang up
        self.send_header("Content-Length", str(len(answer.body) if full else len(half)))
        self.end_headers()
        self.wfile.write(half)
        self.wfile.flush()
        if full:
            self.close_connection = True

    def _send_stream(self, answer: Answer) -> None:
        assert answer.events is not None
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.end_headers()
        for number, frame in enumerate(answer.events):
            if answer.stream_fault is not None and number == answer.fault_after:
                if answer.stream_fault == "drop":
                    self.close_connection = True  # no end of stream: a provider dying mid-way
                    return
                frame = b"event: content_block_delta\ndata: {not json\n\n"
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(frame), frame))
                self.wfile.flush()
                return
            if number and answer.chunk_delay_s and self.fake.stopping_within(answer.chunk_delay_s):
                # Shutting down: drop the connection as a dying provider would.
                self.close_connection = True
                return
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
