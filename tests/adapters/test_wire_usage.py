"""The usage each wire format records (core/usage.py): the fake models' replies with a
scripted usage, read by the proxy's wire formats (what a CLI agent's model step keeps),
and by the custom turn's reader, which tells the three APIs apart by their fields."""

from __future__ import annotations

from typing import Any

import pytest

from durable_harness.adapters.proxy.wire.anthropic import ANTHROPIC
from durable_harness.adapters.proxy.wire.base import WireFormat
from durable_harness.adapters.proxy.wire.chat import CHAT, assemble_completion, completion_chunks
from durable_harness.adapters.proxy.wire.responses import RESPONSES
from durable_harness.core.usage import usage_meta
from durable_harness.testing.fake_model_chat import build_completion
from durable_harness.testing.fake_model_responses import build_response
from durable_harness.testing.fake_model_script import build_message, parse_script

SCRIPT = """
[[rule]]
reply.text = "hello"
reply.usage.input_tokens = 120
reply.usage.output_tokens = 30
reply.usage.cache_read_tokens = 900
reply.usage.cache_write_tokens = 40
"""
RULE = parse_script(SCRIPT).rules[0]
SPLIT = {
    "input_tokens": 120,
    "output_tokens": 30,
    "cache_read_tokens": 900,
    "cache_write_tokens": 40,
}
# OpenAI's APIs report no cache writes: the fake bills the scripted ones as plain input.
OPENAI_SPLIT = {**SPLIT, "input_tokens": 160, "cache_write_tokens": 0}


def _anthropic() -> dict[str, Any]:
    return build_message({"model": "claude-sonnet-4-5", "messages": []}, RULE)


def _chat() -> dict[str, Any]:
    return build_completion({"model": "gpt-4.1", "messages": []}, RULE, "d" * 64)


def _responses() -> dict[str, Any]:
    return build_response({"model": "gpt-5-codex", "input": []}, RULE, "d" * 64)


CASES = [
    ("anthropic", ANTHROPIC, _anthropic, "claude-sonnet-4-5", SPLIT),
    ("chat", CHAT, _chat, "gpt-4.1", OPENAI_SPLIT),
    ("responses", RESPONSES, _responses, "gpt-5-codex", OPENAI_SPLIT),
]


@pytest.mark.parametrize(
    ("name", "wire", "reply", "model", "split"), CASES, ids=[c[0] for c in CASES]
)
def test_each_wire_records_the_split_usage(
    name: str, wire: WireFormat, reply: Any, model: str, split: dict[str, int]
) -> None:
    body = reply()
    meta = wire.meta(body)
    assert meta["model"] == model
    assert {k: meta[k] for k in split} == split, name
    # The custom turn's reader finds the same in the same reply.
    assert usage_meta(body, "requested") == {"model": model, **split}


def test_the_fake_speaks_each_apis_own_spelling() -> None:
    assert _anthropic()["usage"] == {
        "input_tokens": 120,
        "cache_creation_input_tokens": 40,
        "cache_read_input_tokens": 900,
        "output_tokens": 30,
    }
    chat = _chat()["usage"]
    assert (chat["prompt_tokens"], chat["prompt_tokens_details"]) == (1060, {"cached_tokens": 900})
    responses = _responses()["usage"]
    assert responses["input_tokens"] == 1060
    assert responses["input_tokens_details"] == {"cached_tokens": 900}


def test_a_streamed_chat_reply_keeps_its_usage() -> None:
    """The usage chunk of a stream (``stream_options.include_usage``) reaches the meta."""
    assembled = assemble_completion(completion_chunks(_chat()))
    assert {k: CHAT.meta(assembled)[k] for k in OPENAI_SPLIT} == OPENAI_SPLIT


def test_missing_or_odd_usage_is_zero_and_the_requested_model() -> None:
    zero = dict.fromkeys(SPLIT, 0)
    assert usage_meta({"content": []}, "claude-haiku-4-5") == {"model": "claude-haiku-4-5", **zero}
    assert usage_meta("not a reply", None) == {"model": None, **zero}
    odd = {"usage": {"input_tokens": "lots", "output_tokens": -3, "cache_read_input_tokens": None}}
    assert usage_meta(odd, "m") == {"model": "m", **zero}
    # Cached tokens above the total (a provider's mistake) never make input negative.
    bad = {
        "object": "response",
        "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 9}},
    }
    assert usage_meta(bad, "m")["input_tokens"] == 0


@pytest.mark.parametrize(
    ("name", "wire", "reply", "model", "split"), CASES, ids=[c[0] for c in CASES]
)
def test_a_streamed_reply_keeps_its_usage(
    name: str, wire: WireFormat, reply: Any, model: str, split: dict[str, int]
) -> None:
    """What the proxy records of a streamed reply: its events as the API sends them,
    assembled back into the response whose meta the step keeps."""
    parsed = [wire.parse_event(text) for text in wire.events_for(reply())]
    assembled = wire.assemble([event.data for event in parsed if event is not None])
    meta = wire.meta(assembled)
    assert meta["model"] == model and {k: meta[k] for k in split} == split, name
