"""The journaling proxy speaking the OpenAI Chat Completions API (``POST
/v1/chat/completions``) to the fake model over real sockets: recorded, replayed byte for
byte, everything from the ``finish_reason`` chunk to ``[DONE]`` held back until recorded,
errors passed through and never recorded."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from durable_harness.adapters.proxy.canonical_chat import ChatCanonicalizer
from durable_harness.adapters.proxy.server import JournalingProxy, Upstream, message_of
from durable_harness.adapters.proxy.wire.chat import CHAT
from durable_harness.core.types import StepStatus
from durable_harness.core.world import World
from durable_harness.harness.journal import Journal, decode_output
from durable_harness.testing.fake_model import FakeModelServer, parse_script
from durable_harness.worlds import open_world

TOKEN = "per-turn-token"
PATH = "/v1/chat/completions"
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
reply.tool_use = [ { name = "bash", input = { command = "ls" } } ]

[[rule]]
name = "hello"
reply.text = "Hello there."
"""


@dataclass
class Rig:
    world: World
    journal: Journal
    fake: FakeModelServer
    proxy: JournalingProxy
    log: Path

    def connect(self, body: dict[str, Any], token: str = TOKEN) -> http.client.HTTPResponse:
        parts = urlsplit(self.proxy.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        conn.request("POST", PATH, json.dumps(body), {"Authorization": f"Bearer {token}"})
        return conn.getresponse()

    def post(self, body: dict[str, Any], token: str = TOKEN) -> tuple[int, bytes, float]:
        started = time.monotonic()
        response = self.connect(body, token)
        first = response.read1(1)
        ttfb = time.monotonic() - started
        data = first + response.read()
        response.close()
        return response.status, data, ttfb

    def steps(self) -> list[Any]:
        return self.world.load_steps(self.journal.turn_id)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    world = open_world("local", data_dir=tmp_path / "world")
    world.create_session("ses_proxy", {})
    world.create_turn("ses_proxy", "turn_proxy", "p", {"agent": "pi"})
    lease = world.claim_turn("turn_proxy", "test", 60)
    assert lease is not None
    journal = Journal(world, lease)
    log = tmp_path / "fake.jsonl"
    with FakeModelServer(parse_script(SCRIPT), log_path=log) as fake:
        upstream = Upstream(fake.url, "provider-key", send_key=True)
        canonicalizer = ChatCanonicalizer("test/openai-completions")
        with JournalingProxy(journal, canonicalizer, upstream, TOKEN) as proxy:
            yield Rig(world, journal, fake, proxy, log)
    world.close()


def request(text: str, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
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


def chunks(body: bytes) -> list[Any]:
    return [
        "[DONE]" if line == "data: [DONE]" else json.loads(line.removeprefix("data: "))
        for line in body.decode().splitlines()
        if line.startswith("data: ")
    ]


def test_streams_incrementally_records_and_ends_with_done(rig: Rig) -> None:
    status, body, ttfb = rig.post(request("slow please"))
    assert status == 200
    stream = chunks(body)
    assert stream[-1] == "[DONE]" and len(stream) >= 6 and ttfb < 0.5, ttfb
    (step,) = rig.steps()
    assert step.kind == "model" and step.status is StepStatus.DONE and step.input is None
    recorded = decode_output(rig.world, step)
    assert "".join(recorded["events"]).encode() == body  # kept byte for byte
    completion = message_of(recorded, CHAT)
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"].startswith("one two")
    assert completion["usage"]["total_tokens"] > 0
    assert rig.fake.request_count == 1


def test_the_finish_chunk_arrives_only_after_the_outcome_is_recorded(rig: Rig) -> None:
    response = rig.connect(request("slow please"))
    seen_open = False
    while line := response.readline():
        text = line.decode().strip()
        if not text.startswith("data: {"):
            continue
        (step,) = rig.steps()
        finished = json.loads(text.removeprefix("data: "))["choices"][:1]
        if finished and finished[0]["finish_reason"]:
            assert step.status is StepStatus.DONE  # recorded before the CLI sees the end
            break
        seen_open = seen_open or step.status is StepStatus.INTENT
    assert seen_open  # deltas flowed while the step was still an intent
    response.close()


def test_replay_is_byte_identical_and_calls_nothing(rig: Rig) -> None:
    first = rig.post(request("hello"))
    # Another transport option: the same question, answered from the journal.
    again = rig.post(request("hello", stream_options={"include_usage": False}))
    assert first[0] == again[0] == 200 and first[1] == again[1]
    assert rig.fake.request_count == 1 and rig.proxy.stats.replayed == 1
    rig.post(request("hello, something else"))
    assert rig.fake.request_count == 2


def test_upstream_gets_the_harness_key_as_bearer_and_the_journal_key(rig: Rig) -> None:
    rig.post(request("hello"))
    (line,) = [json.loads(x) for x in rig.log.read_text().splitlines()]
    assert line["path"] == PATH and line["api_key_sent"] is True
    assert line["request_key"] == rig.steps()[0].key


def test_json_request_replays_a_streamed_answer_and_back(rig: Rig) -> None:
    rig.post(request("hello"))
    status, body, _ = rig.post(request("hello", stream=False))
    completion = json.loads(body)
    assert status == 200 and completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"] == "Hello there."
    # A JSON answer recorded first is replayed to a streaming request as chunks.
    rig.post(request("use a tool", stream=False))
    status, body, _ = rig.post(request("use a tool"))
    stream = chunks(body)
    assert stream[-1] == "[DONE]"
    assert any(c["choices"] and c["choices"][0]["finish_reason"] for c in stream[:-1])
    assert rig.fake.request_count == 2


def test_tool_calls_reply_is_assembled_for_the_journal(rig: Rig) -> None:
    rig.post(request("use a tool"))
    (step,) = rig.steps()
    assert step.meta["stop_reason"] == "tool_use"
    (call_id,) = step.meta["tool_use_ids"]
    assert call_id.startswith("call_") and step.meta["message_id"].startswith("chatcmpl-")
    completion = message_of(decode_output(rig.world, step), CHAT)
    (call,) = completion["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}


def test_upstream_error_reaches_the_client_and_is_not_recorded(rig: Rig) -> None:
    status, body, _ = rig.post(request("overloaded"))
    assert status == 529 and json.loads(body)["error"]["type"] == "overloaded_error"
    rig.post(request("overloaded"))
    (step,) = rig.steps()
    assert step.status is StepStatus.INTENT and step.attempts == 2
    assert "HTTP 529" in rig.proxy.upstream_errors[-1]
    assert rig.fake.request_count == 2


def test_malformed_stream_is_reported_in_stream_and_not_recorded(rig: Rig) -> None:
    status, body, _ = rig.post(request("malformed"))
    assert status == 200
    last = chunks(body)[-1]
    assert "malformed stream" in last["error"]["message"]
    (step,) = rig.steps()
    assert step.status is StepStatus.INTENT


def test_dropped_stream_breaks_the_client_stream_and_is_not_recorded(rig: Rig) -> None:
    with pytest.raises(http.client.IncompleteRead):
        rig.post(request("drop"))
    (step,) = rig.steps()
    assert step.status is StepStatus.INTENT
    assert "broke off" in rig.proxy.upstream_errors[-1]
    # Not recorded: the same request goes upstream again.
    with pytest.raises(http.client.IncompleteRead):
        rig.post(request("drop"))
    assert rig.fake.request_count == 2


def test_proxy_errors_are_openai_shaped(rig: Rig) -> None:
    status, body, _ = rig.post(request("hello"), token="provider-key")
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
    assert rig.fake.request_count == 0 and rig.steps() == []
    rig.proxy.upstream = Upstream("http://127.0.0.1:9", "provider-key")
    status, body, _ = rig.post(request("hello"))
    assert status == 502 and "cannot reach" in json.loads(body)["error"]["message"]
