"""The journaling proxy between a client and the fake model, over real sockets: what is
forwarded, what is recorded, what is replayed (byte for byte), what is never recorded."""

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

from durable_harness.adapters.claude_code.canonical import ClaudeCodeCanonicalizer
from durable_harness.adapters.proxy.server import JournalingProxy, Upstream
from durable_harness.core.types import StepStatus
from durable_harness.core.world import World
from durable_harness.harness.journal import Journal
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
reply.tool_use = [ { name = "Bash", input = { command = "ls" } } ]

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

    def post(
        self, body: dict[str, Any], token: str = TOKEN, path: str = "/v1/messages?beta=true"
    ) -> tuple[int, bytes, float]:
        """(status, body, seconds to the first body byte)."""
        parts = urlsplit(self.proxy.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        started = time.monotonic()
        conn.request("POST", path, json.dumps(body), {"x-api-key": token})
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
    world.create_turn("ses_proxy", "turn_proxy", "p", {"agent": "claude-code"})
    lease = world.claim_turn("turn_proxy", "test", 60)
    assert lease is not None
    journal = Journal(world, lease)
    with FakeModelServer(parse_script(SCRIPT)) as fake:
        upstream = Upstream(fake.url, "provider-key", send_key=True)
        with JournalingProxy(journal, ClaudeCodeCanonicalizer(), upstream, TOKEN) as proxy:
            yield Rig(world, journal, fake, proxy)
    world.close()


def request(text: str, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def test_streams_incrementally_and_records(rig: Rig) -> None:
    status, body, ttfb = rig.post(request("slow please"))
    assert status == 200
    events = [e for e in body.decode().split("\n\n") if e]
    # ~12 events 150 ms apart: the first reached the client long before the last.
    assert len(events) >= 10 and ttfb < 0.5, ttfb
    (step,) = rig.steps()
    assert step.kind == "model" and step.status is StepStatus.DONE
    assert step.input is None  # invariant 7: only the request's hash is kept
    assert rig.fake.request_count == 1


def test_replay_is_byte_identical_and_calls_nothing(rig: Rig) -> None:
    first = rig.post(request("hello"))
    again = rig.post(request("hello"))
    assert first[0] == again[0] == 200 and first[1] == again[1]
    assert rig.fake.request_count == 1 and rig.proxy.stats.replayed == 1


def test_volatile_fields_do_not_change_the_key(rig: Rig) -> None:
    rig.post(request("hello", metadata={"user_id": "session-a"}))
    variant = request("hello", metadata={"user_id": "session-b"})
    variant["messages"] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}],
        }
    ]
    rig.post(variant)
    assert rig.fake.request_count == 1
    rig.post(request("hello, something else"))
    assert rig.fake.request_count == 2


def test_json_request_replays_a_streamed_answer(rig: Rig) -> None:
    rig.post(request("hello"))
    status, body, _ = rig.post(request("hello", stream=False))
    message = json.loads(body)
    assert status == 200 and message["content"] == [{"type": "text", "text": "Hello there."}]
    assert rig.fake.request_count == 1


def test_tool_use_reply_is_assembled_for_the_journal(rig: Rig) -> None:
    rig.post(request("use a tool"))
    (step,) = rig.steps()
    assert step.meta["stop_reason"] == "tool_use"
    assert len(step.meta["tool_use_ids"]) == 1


def test_upstream_error_reaches_the_client_and_is_not_recorded(rig: Rig) -> None:
    status, body, _ = rig.post(request("overloaded"))
    assert status == 529 and json.loads(body)["error"]["type"] == "overloaded_error"
    rig.post(request("overloaded"))  # the same call again: runs again
    (step,) = rig.steps()
    assert step.status is StepStatus.INTENT and step.attempts == 2
    assert rig.fake.request_count == 2
    assert "HTTP 529" in rig.proxy.upstream_errors[-1]


def test_malformed_stream_is_reported_in_stream_and_not_recorded(rig: Rig) -> None:
    status, body, _ = rig.post(request("malformed"))
    assert status == 200
    assert b"event: error" in body and b"malformed stream" in body
    (step,) = rig.steps()
    assert step.status is StepStatus.INTENT


def test_dropped_stream_breaks_the_client_stream_and_is_not_recorded(rig: Rig) -> None:
    with pytest.raises(http.client.IncompleteRead):
        rig.post(request("drop"))
    (step,) = rig.steps()
    assert step.status is StepStatus.INTENT
    assert "broke off" in rig.proxy.upstream_errors[-1]


def test_unreachable_upstream_is_a_502_and_not_recorded(rig: Rig) -> None:
    rig.proxy.upstream = Upstream("http://127.0.0.1:9", "provider-key")
    status, body, _ = rig.post(request("hello"))
    assert status == 502 and b"cannot reach the model endpoint" in body
    assert rig.steps()[0].status is StepStatus.INTENT


def test_only_the_turn_token_is_accepted_and_the_key_stays_inside(rig: Rig) -> None:
    status, body, _ = rig.post(request("hello"), token="provider-key")
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
    assert rig.fake.request_count == 0 and rig.steps() == []
    status, _, _ = rig.post(request("hello"))
    assert status == 200  # the fake model got the harness's key, the client only the token


def test_other_paths(rig: Rig) -> None:
    status, body, _ = rig.post(request("hello"), path="/v1/messages/count_tokens")
    assert status == 200 and "input_tokens" in json.loads(body)
    assert rig.steps() == []  # not journaled
    status, _, _ = rig.post({}, path="/v1/files")
    assert status == 404


def test_replay_only_journal_refuses_unseen_calls(rig: Rig) -> None:
    rig.post(request("hello"))
    lease = rig.journal.lease
    rig.proxy.journal = Journal(rig.world, lease, replay_only=True)
    assert rig.post(request("hello"))[0] == 200
    status, body, _ = rig.post(request("hello, new"))
    assert status == 400 and b"durable-harness replay" in body
    assert rig.proxy.fatal is not None and rig.fake.request_count == 1
