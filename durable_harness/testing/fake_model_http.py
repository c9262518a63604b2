"""The fake model's HTTP side: the request handler behind its listener.

:func:`handle` routes each request to the server's answerer (a
:class:`~durable_harness.testing.fake_model.FakeModelServer`, seen here through the
:class:`Answerer` protocol), has it logged, then sends the answer: JSON, a broken JSON
body, or an SSE stream with the script's delays and faults. The listener
(:mod:`durable_harness.harness.listener`) runs it in a thread per request and has already
read the body (capped, in time); streams go out chunked, one chunk per event.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol
from urllib.parse import urlsplit

from durable_harness.core.canonical import dumps_compact
from durable_harness.harness.listener import Exchange, Scope
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


def refusal(scope: Scope, status: int, message: str) -> tuple[bytes, str]:
    """The listener's own refusals (413, 408) in the Anthropic error shape."""
    kind = "request_too_large" if status == 413 else "timeout_error"
    return error_body(kind, f"fake model: {message}"), "application/json"


def handle(fake: Answerer, exchange: Exchange) -> None:
    """Answer one request; see the module docstring."""
    path = urlsplit(exchange.path).path
    log.debug("%s %s", exchange.method, exchange.path)
    if exchange.method == "GET":
        if path == "/_fake/stats":
            _send_json(exchange, 200, dumps_compact(fake.stats()), {})
        else:
            _not_found(fake, exchange, path)
        return
    if exchange.method != "POST":
        _not_found(fake, exchange, path)
        return
    body = exchange.body
    if path == "/v1/messages":
        answer = fake.answer_messages(body)
    elif path == "/v1/messages/count_tokens":
        answer = fake.answer_count_tokens(body)
    elif path == RESPONSES_PATH:
        answer = fake.answer_responses(body)
    elif path == CHAT_PATH:
        answer = fake.answer_chat(body)
    else:
        _not_found(fake, exchange, path)
        return
    _respond(fake, exchange, answer)


def _not_found(fake: Answerer, exchange: Exchange, path: str) -> None:
    answer = Answer(
        status=404,
        path=path,
        body=error_body("not_found_error", f"fake model: no route for {exchange.method} {path}"),
    )
    _respond(fake, exchange, answer)


def _respond(fake: Answerer, exchange: Exchange, answer: Answer) -> None:
    headers = exchange.headers
    api_key_sent = bool(headers.get("x-api-key") or headers.get("Authorization"))
    answer.request_key = headers.get("X-Durable-Harness-Key")
    fake.record(answer, api_key_sent)
    if answer.delay_s and fake.stopping_within(answer.delay_s):
        exchange.cut()
        return
    if answer.events is not None and answer.status == 200:
        _send_stream(fake, exchange, answer)
    elif answer.stream_fault is not None and answer.status == 200:
        _send_broken_json(exchange, answer)
    else:
        _send_json(exchange, answer.status, answer.body, answer.headers)


def _send_json(exchange: Exchange, status: int, body: bytes, headers: dict[str, str]) -> None:
    exchange.send(status, body, {"content-type": "application/json", **headers})


def _send_broken_json(exchange: Exchange, answer: Answer) -> None:
    """A JSON reply cut in half: malformed (the connection stays), or dropped."""
    half = answer.body[: len(answer.body) // 2]
    if answer.stream_fault != "drop":
        exchange.send(200, half, {"content-type": "application/json"})
        return
    # Promise the whole body, then hang up.
    length = str(len(answer.body))
    exchange.start(200, {"content-type": "application/json", "content-length": length})
    exchange.write(half)
    exchange.cut()


def _send_stream(fake: Answerer, exchange: Exchange, answer: Answer) -> None:
    assert answer.events is not None
    headers = {
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-cache",
        **{k.lower(): v for k, v in answer.headers.items()},
    }
    exchange.start(200, headers)
    for number, frame in enumerate(answer.events):
        if answer.stream_fault is not None and number == answer.fault_after:
            if answer.stream_fault == "drop":
                exchange.cut()  # no end of stream: a provider dying mid-way
                return
            exchange.write(b"event: content_block_delta\ndata: {not json\n\n")
            exchange.end()
            return
        if number and answer.chunk_delay_s and fake.stopping_within(answer.chunk_delay_s):
            # Shutting down: drop the connection as a dying provider would.
            exchange.cut()
            return
        exchange.write(frame)
    exchange.end()
