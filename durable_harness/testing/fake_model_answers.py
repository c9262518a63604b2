"""What the fake model answers with, and the table of the APIs it speaks.

:class:`Answer` is everything the HTTP handler needs to log a request and then send its
response; :class:`Api` is what differs between the Anthropic Messages, OpenAI Responses
and OpenAI Chat Completions APIs (:data:`MESSAGES`, :data:`RESPONSES`, :data:`CHAT`),
which all answer from the same script rules.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from durable_harness.adapters.proxy.sse import sse_frame, stream_events
from durable_harness.adapters.proxy.wire.chat import DONE_FRAME, chat_frame, completion_chunks
from durable_harness.adapters.proxy.wire.responses import response_events
from durable_harness.testing.fake_model_chat import (
    CHAT_PATH,
    build_completion,
    chat_request_hash,
    chat_view,
)
from durable_harness.testing.fake_model_responses import (
    RESPONSES_PATH,
    build_response,
    response_error_body,
    responses_request_hash,
    responses_view,
)
from durable_harness.testing.fake_model_script import (
    RequestView,
    Rule,
    build_message,
    error_body,
    request_hash,
)

#: The paths a provider would bill: ``requests`` counts these.
BILLED_PATHS = ("/v1/messages", RESPONSES_PATH, CHAT_PATH)


@dataclass
class Answer:
    """Everything the handler needs to log a request and then send its response."""

    status: int
    path: str
    body: bytes = b""  # JSON body, when not streaming
    events: list[bytes] | None = None  # SSE frames, when streaming
    stream: bool = False
    rule: str | None = None
    request_hash: str | None = None
    last_user_text: str = ""
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    stream_fault: str | None = None
    fault_after: int = 0
    request_key: str | None = None  # the X-Durable-Harness-Key header of a journaling proxy
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Api:
    """What differs between the APIs the fake model speaks; the rules are shared."""

    path: str
    required: str  # the request field that must be there ("messages" or "input")
    view: Callable[[dict[str, Any]], RequestView]
    request_hash: Callable[[dict[str, Any]], str]
    id_header: str
    error_body: Callable[[str, str], bytes]
    build: Callable[[dict[str, Any], Rule, str], dict[str, Any]]
    frames: Callable[[dict[str, Any], dict[str, Any]], list[bytes]]


def _chat_frames(completion: dict[str, Any], request: dict[str, Any]) -> list[bytes]:
    options = request.get("stream_options")
    usage = isinstance(options, dict) and options.get("include_usage") is True
    return [chat_frame(chunk) for chunk in completion_chunks(completion, usage)] + [DONE_FRAME]


MESSAGES = Api(
    path="/v1/messages",
    required="messages",
    view=RequestView.of,
    request_hash=request_hash,
    id_header="request-id",
    error_body=error_body,
    build=lambda request, rule, _digest: build_message(request, rule),
    frames=lambda message, _request: [sse_frame(e, d) for e, d in stream_events(message)],
)
RESPONSES = Api(
    path=RESPONSES_PATH,
    required="input",
    view=responses_view,
    request_hash=responses_request_hash,
    id_header="x-request-id",
    error_body=response_error_body,
    build=build_response,
    frames=lambda response, _request: [sse_frame(e, d) for e, d in response_events(response)],
)
CHAT = Api(
    path=CHAT_PATH,
    required="messages",
    view=chat_view,
    request_hash=chat_request_hash,
    id_header="x-request-id",
    error_body=response_error_body,
    build=build_completion,
    frames=_chat_frames,
)


def parse_request(body: bytes, required: str = "messages") -> dict[str, Any] | Answer:
    """The request as a dict, or a 400 answer saying what is wrong with it."""
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        problem = f"request body is not valid JSON: {exc}"
    else:
        if not isinstance(request, dict):
            problem = "request body must be a JSON object"
        elif required == "messages" and not isinstance(request.get("messages"), list):
            problem = "messages: Field required (a list of messages)"
        elif required == "input" and not isinstance(request.get("input"), list | str):
            problem = "input: Field required (a string or a list of items)"
        else:
            return request
    return Answer(status=400, path="", body=error_body("invalid_request_error", problem))


def error_message(answer: Answer) -> str:
    return str(json.loads(answer.body)["error"]["message"])
