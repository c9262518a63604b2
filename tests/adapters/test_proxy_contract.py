"""The journaling proxy's promises (``durable_harness/adapters/proxy/server.py``), run
against every wire format it speaks: Anthropic Messages, OpenAI Chat Completions, OpenAI
Responses (``proxy_cases.WIRES``), over real sockets to the fake model.

An unseen call is forwarded and teed into the journal while it streams, its end held back
until the outcome is recorded; a recorded call is answered from the journal byte for byte
with no upstream call; a half-sent request, an upstream error, a broken or malformed
stream and a refused token are never recorded as done.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from proxy_cases import PROVIDER_KEY, TOKEN, WIRES, Rig, WireCase, open_rig

from durable_harness.adapters.proxy.server import Upstream, message_of
from durable_harness.core.types import StepStatus
from durable_harness.harness.events import read_all
from durable_harness.harness.journal import Journal, decode_output


@pytest.fixture(params=list(WIRES))
def case(request: pytest.FixtureRequest) -> WireCase:
    return WIRES[request.param]


@pytest.fixture
def rig(tmp_path: Path, case: WireCase) -> Iterator[Rig]:
    with open_rig(tmp_path, case) as rig:
        yield rig


# -- an unseen call ----------------------------------------------------------------------
def test_an_unseen_call_streams_as_it_arrives_and_is_recorded(rig: Rig, case: WireCase) -> None:
    started = time.monotonic()
    status, body, ttfb = rig.ask("slow please")
    total = time.monotonic() - started
    assert status == 200
    events = case.events(body)
    assert events[0] == case.first_event and events[-1] == case.last_event
    assert case.final_event in events
    # Events 150 ms apart: the first reached the client at least two gaps before the
    # last (a proxy that buffered the stream would send its first byte with its last).
    # Relative to the stream's own length, so a loaded machine does not fail it.
    assert len(events) >= case.min_events and ttfb < total - 0.3, (ttfb, total)
    (step,) = rig.steps()
    assert step.kind == "model" and step.status is StepStatus.DONE
    assert step.input is None  # invariant 7: only the request's hash is kept
    recorded = decode_output(rig.world, step)
    assert "".join(recorded["events"]).encode() == body  # kept byte for byte
    assert case.text(message_of(recorded, case.wire)).startswith("one two")
    assert step.meta["output_tokens"] > 0
    assert rig.fake.request_count == 1
    # The text reached the turn's event log in pieces as it streamed, the last before
    # the step's step.finished, which carries it.
    log = read_all(rig.world, "turn_proxy")
    deltas = [e for e in log if e.kind == "text.delta"]
    text = case.text(message_of(recorded, case.wire))
    assert "".join(e.data["text"] for e in deltas) == text
    assert [e.data["n"] for e in deltas] == list(range(len(deltas))) and len(deltas) >= 2
    assert [e.kind for e in log if e.kind != "text.delta"] == [
        "turn.created",
        "attempt.started",
        "step.started",
        "step.finished",
    ]
    assert log[-1].kind == "step.finished" and log[-1].data["output"] == text


def test_the_end_of_the_stream_arrives_only_after_the_outcome_is_recorded(
    rig: Rig, case: WireCase
) -> None:
    response = rig.connect(case.request("slow please"))
    seen_open = False
    while line := response.readline():
        text = line.decode().strip()
        if not text.startswith("data: {"):
            continue
        (step,) = rig.steps()
        if case.event_name(json.loads(text.removeprefix("data: "))) == case.final_event:
            assert step.status is StepStatus.DONE  # recorded before the CLI sees the end
            break
        seen_open = seen_open or step.status is StepStatus.INTENT
    else:
        pytest.fail(f"no {case.final_event} in the stream")
    assert seen_open  # events flowed while the step was still an intent: teed, not buffered
    response.close()


def test_upstream_gets_the_harness_key_and_the_journal_key(rig: Rig, case: WireCase) -> None:
    rig.ask("hello")
    (line,) = rig.fake_log()
    assert line["path"] == case.wire.path and line["api_key_sent"] is True
    assert line["request_key"] == rig.steps()[0].key


def test_a_tool_call_reply_is_assembled_for_the_journal(rig: Rig, case: WireCase) -> None:
    rig.ask("use a tool")
    (step,) = rig.steps()
    assert step.meta["stop_reason"] == "tool_use"
    (call_id,) = step.meta["tool_use_ids"]
    assert call_id.startswith(case.call_prefix)
    assert step.meta["message_id"].startswith(case.message_prefix)


# -- a recorded call ---------------------------------------------------------------------
def test_a_recorded_call_is_replayed_byte_for_byte_and_calls_nothing(
    rig: Rig, case: WireCase
) -> None:
    first = rig.ask("hello")
    # What a CLI changes between runs (session ids, cache markers, item ids, transport
    # options): the same question, answered from the journal.
    again = rig.post(case.variant(case.request("hello")))
    assert first[0] == again[0] == 200 and first[1] == again[1]
    assert case.events(again[1])[-1] == case.last_event  # streamed, as the provider would
    assert rig.fake.request_count == 1 and rig.proxy.stats.replayed == 1
    rig.ask("hello, something else")
    assert rig.fake.request_count == 2


def test_a_json_request_replays_a_streamed_answer_and_back(rig: Rig, case: WireCase) -> None:
    rig.ask("hello")
    status, body, _ = rig.ask("hello", stream=False)
    message = json.loads(body)
    assert status == 200 and case.response_type(message) == case.expected_type
    assert case.text(message) == "Hello there."
    # A JSON answer recorded first is replayed to a streaming request as events.
    rig.ask("use a tool", stream=False)
    status, body, _ = rig.ask("use a tool")
    events = case.events(body)
    assert status == 200 and events[-1] == case.last_event and case.final_event in events
    assert rig.fake.request_count == 2


def test_a_replay_only_journal_refuses_unseen_calls(rig: Rig, case: WireCase) -> None:
    rig.ask("hello")
    rig.proxy.journal = Journal(rig.world, rig.journal.lease, replay_only=True)
    assert rig.ask("hello")[0] == 200
    status, body, _ = rig.ask("hello, new")
    assert status == 400 and b"durable-harness replay" in body
    assert case.error_shaped(json.loads(body))
    assert rig.proxy.fatal is not None and rig.fake.request_count == 1


# -- never recorded as done --------------------------------------------------------------
def test_a_half_sent_request_is_neither_journaled_nor_forwarded(rig: Rig, case: WireCase) -> None:
    body = json.dumps(case.request("hello")).encode()
    parts = urlsplit(rig.proxy.url)
    assert parts.hostname is not None and parts.port is not None
    head = [f"POST {case.path} HTTP/1.1", f"Host: {parts.netloc}"]
    head += [f"{name}: {value}" for name, value in case.auth(TOKEN).items()]
    head += ["Content-Type: application/json", f"Content-Length: {len(body)}", "", ""]
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall("\r\n".join(head).encode() + body[: len(body) // 2])
        conn.shutdown(socket.SHUT_WR)  # the CLI died mid-send
        assert conn.recv(1024) == b""  # no answer: the connection is closed
    assert rig.steps() == [] and rig.fake.request_count == 0
    assert rig.ask("hello")[0] == 200  # the whole request, sent again, runs once
    (step,) = rig.steps()
    assert step.status is StepStatus.DONE and rig.fake.request_count == 1


def test_an_upstream_error_reaches_the_client_and_is_not_recorded(rig: Rig, case: WireCase) -> None:
    status, body, _ = rig.ask("overloaded")
    assert status == 529 and json.loads(body)["error"]["type"] == "overloaded_error"
    rig.ask("overloaded")  # the same call again: runs again
    (step,) = rig.steps()
    assert step.status is StepStatus.INTENT and step.attempts == 2
    assert "HTTP 529" in rig.proxy.upstream_errors[-1]
    assert rig.fake.request_count == 2


def test_a_malformed_stream_is_reported_in_stream_and_not_recorded(
    rig: Rig, case: WireCase
) -> None:
    status, body, _ = rig.ask("malformed")
    assert status == 200 and case.reports_stream_error(body)
    (step,) = rig.steps()
    assert step.status is StepStatus.INTENT


def test_a_dropped_stream_breaks_the_client_stream_and_is_not_recorded(
    rig: Rig, case: WireCase
) -> None:
    with pytest.raises(http.client.IncompleteRead):
        rig.ask("drop")
    (step,) = rig.steps()
    assert step.status is StepStatus.INTENT
    assert "broke off" in rig.proxy.upstream_errors[-1]
    # Not recorded: the same request goes upstream again.
    with pytest.raises(http.client.IncompleteRead):
        rig.ask("drop")
    assert rig.fake.request_count == 2


def test_an_unreachable_upstream_is_a_502_and_not_recorded(rig: Rig, case: WireCase) -> None:
    rig.proxy.upstream = Upstream("http://127.0.0.1:9", PROVIDER_KEY)
    status, body, _ = rig.ask("hello")
    error = json.loads(body)
    assert status == 502 and "cannot reach the model endpoint" in error["error"]["message"]
    assert case.error_shaped(error)
    assert rig.steps()[0].status is StepStatus.INTENT


def test_only_the_turn_token_is_accepted_and_the_key_stays_inside(rig: Rig, case: WireCase) -> None:
    status, body, _ = rig.post(case.request("hello"), token=PROVIDER_KEY)
    error = json.loads(body)
    assert status == 401 and error["error"]["type"] == "authentication_error"
    assert case.error_shaped(error)
    assert rig.fake.request_count == 0 and rig.steps() == []
    status, _, _ = rig.ask("hello")
    assert status == 200  # the fake model got the harness's key, the client only the token
