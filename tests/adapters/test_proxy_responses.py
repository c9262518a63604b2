"""The journaling proxy speaking the OpenAI Responses API (``POST /v1/responses``) to the
fake model over real sockets: recorded, replayed byte for byte, the final
``response.completed`` held back until recorded, errors passed through and never recorded."""

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

from durable_harness.adapters.proxy.canonical_responses import ResponsesCanonicalizer
from durable_harness.adapters.proxy.server import JournalingProxy, Upstream, message_of
from durable_harness.adapters.proxy.wire.responses import RESPONSES
from durable_harness.core.types import StepStatus
from durable_harness.core.world import World
from durable_harness.harness.journal import Journal, decode_output
from durable_harness.testing.fake_model import FakeModelServer, parse_script
from durable_harness.worlds import open_world

TOKEN = "per-turn-token"
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
reply.tool_use = [ { name = "exec_command", input = { cmd = "ls" } } ]

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

    def post(
        self, body: dict[str, Any], token: str = TOKEN, path: str = "/v1/responses"
    ) -> tuple[int, bytes, float]:
        parts = urlsplit(self.proxy.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        started = time.monotonic()
        conn.request("POST", path, json.dumps(body), {"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        first = response.read1(1)
        ttfb = time.monotonic() - started
        data = first + response.read()
        conn.close()
        return response.status, data, ttfb

    def steps(self) -> list[Any]:
        return self.world.load_steps(self.journal.turn_id)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    world = open_world("local", data_dir=tmp_path / "world")
    world.create_session("ses_proxy", {})
    world.create_turn("ses_proxy", "turn_proxy", "p", {"agent": "codex"})
    lease = world.claim_turn("turn_proxy", "test", 60)
    assert lease is not None
    journal = Journal(world, lease)
    log = tmp_path / "fake.jsonl"
    with FakeModelServer(parse_script(SCRIPT), log_path=log) as fake:
        upstream = Upstream(fake.url, "provider-key", send_key=True)
        with JournalingProxy(journal, ResponsesCanonicalizer(), upstream, TOKEN) as proxy:
            yield Rig(world, journal, fake, proxy, log)
    world.close()


def request(text: str, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
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


def event_types(body: bytes) -> list[str]:
    return [
        json.loads(line.removeprefix("data: "))["type"]
        for line in body.decode().splitlines()
        if line.startswith("data: ")
    ]


def test_streams_incrementally_records_and_ends_with_completed(rig: Rig) -> None:
    status, body, ttfb = rig.post(request("slow please"))
    assert status == 200
    types = event_types(body)
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert len(types) >= 10 and ttfb < 0.5, ttfb
    (step,) = rig.steps()
    assert step.kind == "model" and step.status is StepStatus.DONE and step.input is None
    recorded = decode_output(rig.world, step)
    assert "".join(recorded["events"]).encode() == body  # kept byte for byte
    assert message_of(recorded, RESPONSES)["output"][0]["content"][0]["text"].startswith("one")
    assert rig.fake.request_count == 1


def test_replay_is_byte_identical_and_calls_nothing(rig: Rig) -> None:
    first = rig.post(request("hello"))
    # Another thread's cache key and item ids: the same question, answered from the journal.
    variant = request("hello", prompt_cache_key="thread-b")
    variant["input"][0]["id"] = "msg_b"
    again = rig.post(variant)
    assert first[0] == again[0] == 200 and first[1] == again[1]
    assert rig.fake.request_count == 1 and rig.proxy.stats.replayed == 1
    rig.post(request("hello, something else"))
    assert rig.fake.request_count == 2


def test_upstream_gets_the_harness_key_as_bearer_and_the_journal_key(rig: Rig) -> None:
    rig.post(request("hello"))
    (line,) = [json.loads(x) for x in rig.log.read_text().splitlines()]
    assert line["path"] == "/v1/responses" and line["api_key_sent"] is True
    assert line["request_key"] == rig.steps()[0].key


def test_json_request_replays_a_streamed_answer(rig: Rig) -> None:
    rig.post(request("hello"))
    status, body, _ = rig.post(request("hello", stream=False))
    response = json.loads(body)
    assert status == 200 and response["object"] == "response"
    assert response["output"][0]["content"][0]["text"] == "Hello there."
    assert rig.fake.request_count == 1


def test_function_call_reply_is_assembled_for_the_journal(rig: Rig) -> None:
    rig.post(request("use a tool"))
    (step,) = rig.steps()
    assert step.meta["stop_reason"] == "tool_use"
    (call_id,) = step.meta["tool_use_ids"]
    assert call_id.startswith("call_") and step.meta["message_id"].startswith("resp_")


def test_upstream_error_reaches_the_client_and_is_not_recorded(rig: Rig) -> None:
    status, body, _ = rig.post(request("overloaded"))
    assert status == 529 and json.loads(body)["error"]["type"] == "overloaded_error"
    rig.post(request("overloaded"))
    (step,) = rig.steps()
    assert step.status is StepStatus.INTENT and step.attempts == 2
    assert "HTTP 529" in rig.proxy.upstream_errors[-1]


def test_malformed_stream_is_reported_in_stream_and_not_recorded(rig: Rig) -> None:
    status, body, _ = rig.post(request("malformed"))
    assert status == 200
    assert event_types(body)[-1] == "response.failed" and b"malformed stream" in body
    (step,) = rig.steps()
    assert step.status is StepStatus.INTENT


def test_dropped_stream_breaks_the_client_stream_and_is_not_recorded(rig: Rig) -> None:
    with pytest.raises(http.client.IncompleteRead):
        rig.post(request("drop"))
    (step,) = rig.steps()
    assert step.status is StepStatus.INTENT
    assert "broke off" in rig.proxy.upstream_errors[-1]


def test_proxy_errors_are_openai_shaped(rig: Rig) -> None:
    status, body, _ = rig.post(request("hello"), token="provider-key")
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
    assert rig.fake.request_count == 0 and rig.steps() == []
    rig.proxy.upstream = Upstream("http://127.0.0.1:9", "provider-key")
    status, body, _ = rig.post(request("hello"))
    assert status == 502 and "cannot reach" in json.loads(body)["error"]["message"]
