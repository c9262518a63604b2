"""Codex's canonicalization: unit rules on requests shaped as Codex 0.171.0 sends them.

The real CLI's traffic recorded twice is checked in ``test_codex.py``
(``test_real_cli_same_prompt_same_keys``).
"""

from __future__ import annotations

from typing import Any

import pytest

from durable_harness.adapters.codex.canonical import CodexCanonicalizer

HOME = "/tmp/durable-harness-codex-abc123"


def body(
    *,
    date: str = "2026-11-29",
    home: str = HOME,
    prompt: str = "add a pricing page",
    thread: str = "t1",
    item_ids: str = "a",
    call_id: str = "call_1",
    chunk: str = "63e6f7",
    wall: str = "0.0012",
    result: str = "BASH-42",
) -> dict[str, Any]:
    env = (
        "<environment_context>\n  <cwd>/srv/ws</cwd>\n  <shell>bash</shell>\n"
        f"  <current_date>{date}</current_date>\n  <timezone>Etc/UTC</timezone>\n"
        "</environment_context>"
    )
    output = (
        f"Chunk ID: {chunk}\nWall time: {wall} seconds\nProcess exited with code 0\n"
        f"Original token count: 2\nOutput:\n{result}\n"
    )
    return {
        "model": "gpt-5-codex",
        "stream": True,
        "store": False,
        "prompt_cache_key": thread,
        "client_metadata": {"session_id": thread, "turn_id": thread + "-turn"},
        "input": [
            {
                "type": "message",
                "id": f"msg_{item_ids}0",
                "role": "developer",
                "content": [{"type": "input_text", "text": f"- `r0` = `{home}/skills/.system`"}],
            },
            {
                "type": "message",
                "id": f"msg_{item_ids}1",
                "role": "user",
                "content": [{"type": "input_text", "text": env}],
            },
            {
                "type": "message",
                "id": f"msg_{item_ids}2",
                "role": "user",
                "content": [{"type": "input_text", "text": prompt}],
            },
            {
                "type": "function_call",
                "id": f"fc_{item_ids}",
                "name": "exec_command",
                "arguments": '{"cmd":"make"}',
                "call_id": call_id,
            },
            {
                "type": "function_call_output",
                "id": f"fco_{item_ids}",
                "call_id": call_id,
                "output": output,
            },
        ],
    }


def key(b: dict[str, Any], home: str = HOME, done: dict[str, str] | None = None) -> str:
    outcomes = done or {}
    thread = b["prompt_cache_key"]
    headers = {"session-id": thread, "thread-id": thread, "x-codex-window-id": thread + ":0"}
    return CodexCanonicalizer(home).key("/v1/responses", headers, b, outcomes.get)


@pytest.mark.parametrize(
    "volatile",
    [
        {"date": "2027-01-01"},
        {"thread": "t2"},
        {"item_ids": "b"},
        {"call_id": "call_other"},
        {"chunk": "aa11bb", "wall": "3.5003"},
    ],
)
def test_volatile_parts_do_not_change_the_key(volatile: dict[str, Any]) -> None:
    assert key(body(**volatile)) == key(body())


def test_home_path_is_stripped() -> None:
    other = "/tmp/durable-harness-codex-zzz999"
    assert key(body(home=other), home=other) == key(body())


def test_meaningful_parts_change_the_key() -> None:
    assert key(body(prompt="add a blog")) != key(body())
    assert key(body(result="BASH-43")) != key(body())
    changed = body()
    changed["model"] = "gpt-5"
    assert key(changed) != key(body())


def test_a_recorded_tool_output_is_keyed_by_its_journal_outcome() -> None:
    done = {"call_1": "outcome-digest"}
    aborted = body(result="aborted")
    assert key(aborted, done=done) == key(body(), done=done)
    assert key(body(), done=done) != key(body())
