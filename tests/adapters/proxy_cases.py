"""The journaling proxy's test rig, and the three wire formats it speaks as test cases.

A :class:`Rig` is a local World with one claimed turn, the scripted fake model (every wire
format from one script) and a :class:`JournalingProxy` in front of it, over real sockets.
A :class:`WireCase` says how a CLI of one API talks to the proxy (path, auth header, a
request body, a variant of it that differs only in fields the canonicalizer strips) and
how to read what comes back (events, the assembled message). ``test_proxy_contract.py``
runs the proxy's promises against every case in :data:`WIRES`; what only one API does is
tested in ``test_proxy.py`` (Anthropic Messages), ``test_proxy_chat.py`` and
``test_wire_chat.py`` (Chat Completions).
"""

from __future__ import annotations

import contextlib
import copy
import http.client
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from durable_harness.adapters.claude_code.canonical import ClaudeCodeCanonicalizer
from durable_harness.adapters.proxy.canonical import Canonicalizer
from durable_harness.adapters.proxy.canonical_chat import ChatCanonicalizer
from durable_harness.adapters.proxy.canonical_responses import ResponsesCanonicalizer
from durable_harness.adapters.proxy.server import JournalingProxy, Upstream
from durable_harness.adapters.proxy.wire.anthropic import ANTHROPIC
from durable_harness.adapters.proxy.wire.base import WireFormat
from durable_harness.adapters.proxy.wire.chat import CHAT
from durable_harness.adapters.proxy.wire.responses import RESPONSES
from durable_harness.core.world import World
from durable_harness.harness.events import TurnEvents
from durable_harness.harness.journal import Journal
from durable_harness.testing.fake_model import FakeModelServer, parse_script
from durable_harness.worlds import open_world

TOKEN = "per-turn-token"
PROVIDER_KEY = "provider-key"
SCRIPT = """
[[rule]]
name = "slow"
when.last_user_text = "slow"
reply.text = "one two three four five six seven eight"
reply.chunk_delay_ms = 150

[[rule]]
name = "overloaded"
when.last_user_text = "overloaded"
reply.error = { type = "overloaded_error", message = "Overloaded" }

[[rule]]
name = "malformed"
when.last_user_text = "malformed"
reply.text = "never whole"
reply.stream_fault = "malformed"

[[rule]]
name = "drop"
when.last_user_text = "drop"
reply.text = "never whole"
reply.stream_fault = "drop"

[[rule]]
name = "tool"
when.last_user_text = "use a tool"
reply.tool_use = [ { name = "%(tool)s", input = %(tool_input)s } ]

[[rule]]
name = "hello"
reply.text = "Hello there."
"""


def data_lines(body: bytes) -> list[Any]:
    """The payload of every ``data:`` line (``"[DONE]"`` as the string)."""
    return [
        "[DONE]" if line == "data: [DONE]" else json.loads(line.removeprefix("data: "))
        for line in body.decode().splitlines()
        if line.startswith("data: ")
    ]


@dataclass(frozen=True)
class WireCase:
    """One model API as a CLI speaks it through the proxy."""

    name: str
    wire: WireFormat
    #: The path the CLI posts to (Claude Code adds ``?beta=true``).
    path: str
    agent: str
    canonicalizer: Callable[[], Canonicalizer]
    auth: Callable[[str], dict[str, str]]
    #: A request asking ``text`` (``stream``, extra top-level fields).
    request: Callable[..., dict[str, Any]]
    #: The same request with the fields a CLI changes between runs changed.
    variant: Callable[[dict[str, Any]], dict[str, Any]]
    #: Name of a data payload: the event type ("chunk"/"finish"/"[DONE]" for Chat).
    event_name: Callable[[Any], str]
    first_event: str
    #: The event held back until the outcome is recorded.
    final_event: str
    last_event: str
    min_events: int
    #: The text of a whole (assembled or JSON) response with one text block.
    text: Callable[[dict[str, Any]], str]
    response_type: Callable[[dict[str, Any]], str]
    expected_type: str
    #: Whether a proxy error body has this API's shape.
    error_shaped: Callable[[dict[str, Any]], bool]
    #: Whether a 200 stream ends in this API's in-stream error report.
    reports_stream_error: Callable[[bytes], bool]
    tool: str
    tool_input: str
    call_prefix: str
    message_prefix: str

    def events(self, body: bytes) -> list[str]:
        return [self.event_name(data) for data in data_lines(body)]


#: The models the rig's proxy lets through: the one each wire's requests name.
MODELS = ("claude-sonnet-4-5", "gpt-4o", "gpt-5-codex")


def _anthropic_request(text: str, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def _anthropic_variant(body: dict[str, Any]) -> dict[str, Any]:
    """Another session id, and the text as a block with a cache marker."""
    variant = copy.deepcopy(body)
    variant["metadata"] = {"user_id": "session-b"}
    (message,) = variant["messages"]
    message["content"] = [
        {"type": "text", "text": message["content"], "cache_control": {"type": "ephemeral"}}
    ]
    return variant


def _anthropic_text(message: dict[str, Any]) -> str:
    (block,) = message["content"]
    assert block.keys() == {"type", "text"} and block["type"] == "text", block
    return str(block["text"])


def _chat_request(text: str, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4o",
        "stream": stream,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": text},
        ],
        **extra,
    }


def _chat_variant(body: dict[str, Any]) -> dict[str, Any]:
    """Another transport option."""
    return {**body, "stream_options": {"include_usage": False}}


def _chat_event(data: Any) -> str:
    if data == "[DONE]":
        return "[DONE]"
    if "error" in data:
        return "error"
    choices = data["choices"]
    return "finish" if choices and choices[0]["finish_reason"] else "chunk"


def _chat_stream_error(body: bytes) -> bool:
    last = data_lines(body)[-1]
    return isinstance(last, dict) and "malformed stream" in last["error"]["message"]


def _responses_request(text: str, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "model": "gpt-5-codex",
        "stream": stream,
        "store": False,
        "prompt_cache_key": "thread-a",
        "input": [
            {
                "type": "message",
                "id": "msg_a",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            }
        ],
        **extra,
    }


def _responses_variant(body: dict[str, Any]) -> dict[str, Any]:
    """Another thread's cache key and item ids."""
    variant = copy.deepcopy(body)
    variant["prompt_cache_key"] = "thread-b"
    variant["input"][0]["id"] = "msg_b"
    return variant


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _openai_error_shaped(body: dict[str, Any]) -> bool:
    return set(body) == {"error"}


ANTHROPIC_CASE = WireCase(
    name="anthropic",
    wire=ANTHROPIC,
    path="/v1/messages?beta=true",
    agent="claude-code",
    canonicalizer=ClaudeCodeCanonicalizer,
    auth=lambda token: {"x-api-key": token},
    request=_anthropic_request,
    variant=_anthropic_variant,
    event_name=lambda data: str(data["type"]),
    first_event="message_start",
    final_event="message_stop",
    last_event="message_stop",
    min_events=10,  # ~12 events 150 ms apart
    text=_anthropic_text,
    response_type=lambda message: str(message["type"]),
    expected_type="message",
    error_shaped=lambda body: body.get("type") == "error",
    reports_stream_error=lambda body: b"event: error" in body and b"malformed stream" in body,
    tool="Bash",
    tool_input='{ command = "ls" }',
    call_prefix="toolu_",
    message_prefix="msg_",
)
CHAT_CASE = WireCase(
    name="chat",
    wire=CHAT,
    path="/v1/chat/completions",
    agent="pi",
    canonicalizer=lambda: ChatCanonicalizer("test/openai-completions"),
    auth=_bearer,
    request=_chat_request,
    variant=_chat_variant,
    event_name=_chat_event,
    first_event="chunk",
    final_event="finish",
    last_event="[DONE]",
    min_events=6,
    text=lambda message: str(message["choices"][0]["message"]["content"]),
    response_type=lambda message: str(message["object"]),
    expected_type="chat.completion",
    error_shaped=_openai_error_shaped,
    reports_stream_error=_chat_stream_error,
    tool="bash",
    tool_input='{ command = "ls" }',
    call_prefix="call_",
    message_prefix="chatcmpl-",
)
RESPONSES_CASE = WireCase(
    name="responses",
    wire=RESPONSES,
    path="/v1/responses",
    agent="codex",
    canonicalizer=ResponsesCanonicalizer,
    auth=_bearer,
    request=_responses_request,
    variant=_responses_variant,
    event_name=lambda data: str(data["type"]),
    first_event="response.created",
    final_event="response.completed",
    last_event="response.completed",
    min_events=10,
    text=lambda message: str(message["output"][0]["content"][0]["text"]),
    response_type=lambda message: str(message["object"]),
    expected_type="response",
    error_shaped=_openai_error_shaped,
    reports_stream_error=lambda body: (
        data_lines(body)[-1]["type"] == "response.failed" and b"malformed stream" in body
    ),
    tool="exec_command",
    tool_input='{ cmd = "ls" }',
    call_prefix="call_",
    message_prefix="resp_",
)
WIRES = {case.name: case for case in (ANTHROPIC_CASE, CHAT_CASE, RESPONSES_CASE)}


@dataclass
class Rig:
    world: World
    journal: Journal
    fake: FakeModelServer
    proxy: JournalingProxy
    log: Path
    case: WireCase

    def connect(
        self, body: dict[str, Any], token: str = TOKEN, path: str | None = None
    ) -> http.client.HTTPResponse:
        parts = urlsplit(self.proxy.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        conn.request("POST", path or self.case.path, json.dumps(body), self.case.auth(token))
        return conn.getresponse()

    def post(
        self, body: dict[str, Any], token: str = TOKEN, path: str | None = None
    ) -> tuple[int, bytes, float]:
        """(status, body, seconds to the first body byte)."""
        started = time.monotonic()
        response = self.connect(body, token, path)
        first = response.read1(1)
        ttfb = time.monotonic() - started
        data = first + response.read()
        response.close()
        return response.status, data, ttfb

    def ask(self, text: str, **options: Any) -> tuple[int, bytes, float]:
        return self.post(self.case.request(text, **options))

    def steps(self) -> list[Any]:
        return self.world.load_steps(self.journal.turn_id)

    def fake_log(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@contextlib.contextmanager
def open_rig(tmp_path: Path, case: WireCase) -> Iterator[Rig]:
    world = open_world("local", data_dir=tmp_path / "world")
    try:
        world.create_session("ses_proxy", {})
        world.create_turn("ses_proxy", "turn_proxy", "p", {"agent": case.agent})
        lease = world.claim_turn("turn_proxy", "test", 60)
        assert lease is not None
        # With an event log writer, as the worker's: the contract holds with it on.
        events = TurnEvents(world, "turn_proxy", lease.epoch, lease.attempt)
        events.begin_attempt("test")
        journal = Journal(world, lease, events=events)
        log = tmp_path / "fake.jsonl"
        script = parse_script(SCRIPT % {"tool": case.tool, "tool_input": case.tool_input})
        with FakeModelServer(script, log_path=log) as fake:
            upstream = Upstream(fake.url, PROVIDER_KEY, send_key=True)
            with JournalingProxy(
                journal, case.canonicalizer(), upstream, TOKEN, models=MODELS
            ) as proxy:
                yield Rig(world, journal, fake, proxy, log, case)
    finally:
        world.close()
