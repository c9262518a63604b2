"""The Chat Completions wire format alone: reading chunks, what is held back, assembling
a completion from its chunks and back."""

from __future__ import annotations

import json

import pytest

from durable_harness.adapters.proxy.sse import MalformedStream
from durable_harness.adapters.proxy.wire.chat import CHAT


def frame(data: object) -> str:
    return f"data: {json.dumps(data)}\n\n"


def chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def test_reading_chunks() -> None:
    assert CHAT.parse_event(": keep-alive\n\n") is None
    done = CHAT.parse_event("data: [DONE]\n\n")
    assert done is not None and done.type == "[DONE]" and CHAT.holds_back(done)
    error = CHAT.parse_event(frame({"error": {"message": "boom", "type": "server_error"}}))
    assert error is not None and error.type in CHAT.error_events
    with pytest.raises(MalformedStream):
        CHAT.parse_event("data: {not json\n\n")
    with pytest.raises(MalformedStream):
        CHAT.parse_event(frame({"object": "chat.completion.chunk"}))  # no choices


def test_held_back_from_the_finish_chunk() -> None:
    deltas = CHAT.parse_event(frame(chunk({"content": "hi"})))
    finish = CHAT.parse_event(frame(chunk({}, "stop")))
    usage = CHAT.parse_event(frame({"id": "chatcmpl-1", "choices": [], "usage": {}}))
    assert deltas is not None and not CHAT.holds_back(deltas)
    assert finish is not None and CHAT.holds_back(finish)
    assert usage is not None and not CHAT.holds_back(usage)  # already held: it comes after


def test_two_tool_calls_assemble_and_round_trip() -> None:
    calls = [
        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "bash"}},
        {"index": 1, "id": "call_b", "type": "function", "function": {"name": "write"}},
    ]
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Two "}),
        chunk({"content": "calls."}),
        chunk({"tool_calls": [{**calls[0], "function": {"name": "bash", "arguments": '{"c'}}]}),
        chunk({"tool_calls": [{**calls[1], "function": {"name": "write", "arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '": 1}'}}]}),
        chunk({}, "tool_calls"),
        {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
        {},  # [DONE]
    ]
    completion = CHAT.assemble(chunks)
    message = completion["choices"][0]["message"]
    assert message["content"] == "Two calls."
    assert [c["function"] for c in message["tool_calls"]] == [
        {"name": "bash", "arguments": '{"c": 1}'},
        {"name": "write", "arguments": "{}"},
    ]
    meta = CHAT.meta(completion)
    assert meta["tool_use_ids"] == ["call_a", "call_b"] and meta["stop_reason"] == "tool_use"
    assert meta["input_tokens"] == 3 and meta["output_tokens"] == 4
    # A JSON completion replayed to a streaming request reads back as itself.
    events = [CHAT.parse_event(text) for text in CHAT.events_for(completion)]
    assert events[-1] is not None and events[-1].type == "[DONE]"
    again = CHAT.assemble([e.data for e in events if e is not None])
    assert again["choices"] == completion["choices"] and again["usage"] == completion["usage"]
