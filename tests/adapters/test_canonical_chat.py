"""The Chat Completions canonicalizer: volatile fields dropped, tool-call ids by order,
recorded tool results as references, the CLI's text rules applied."""

from __future__ import annotations

from typing import Any

from durable_harness.adapters.proxy.canonical_chat import ChatCanonicalizer

PATH = "/v1/chat/completions"


def body(call_id: str, result: str, *, stream: bool = True, date: str = "2026-11-29") -> Any:
    call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    return {
        "model": "m",
        "stream": stream,
        "stream_options": {"include_usage": stream},
        "messages": [
            {"role": "system", "content": f"Current date: {date}"},
            {"role": "user", "content": [{"type": "text", "text": "go"}]},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
        ],
    }


def no_outcomes(call_id: str) -> str | None:
    return None


def test_call_ids_and_transport_do_not_count() -> None:
    canonical = ChatCanonicalizer("t")
    first = canonical.key(PATH, {"x-session-id": "a"}, body("call_a", "out"), no_outcomes)
    second = canonical.key(
        PATH, {"x-session-id": "b"}, body("call_b", "out", stream=False), no_outcomes
    )
    assert first == second
    assert first != canonical.key(PATH, {}, body("call_a", "other out"), no_outcomes)


def test_a_recorded_result_is_a_reference() -> None:
    canonical = ChatCanonicalizer("t")

    def outcomes(call_id: str) -> str | None:
        return "digest-1" if call_id == "call_a" else None

    form = canonical.canonical(PATH, {}, body("call_a", "whatever ran"), outcomes)
    assert form["body"]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call#1",
        "journal": "digest-1",
    }
    assert form["body"]["messages"][2]["tool_calls"][0]["id"] == "call#1"
    # Whatever the output said, the reference keys alike.
    assert canonical.key(PATH, {}, body("call_a", "x"), outcomes) == canonical.key(
        PATH, {}, body("call_a", "y"), outcomes
    )


def test_text_rules_apply_to_every_text() -> None:
    canonical = ChatCanonicalizer("t", lambda text: text.replace("2026-11-30", "2026-11-29"))
    assert canonical.key(PATH, {}, body("c", "o"), no_outcomes) == canonical.key(
        PATH, {}, body("c", "o", date="2026-11-30"), no_outcomes
    )
