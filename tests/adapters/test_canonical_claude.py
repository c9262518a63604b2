"""Claude Code's canonicalization: unit rules, then the real CLI's traffic recorded twice.

The rules were found by diffing real requests of Claude Code 2.1.332 (docs/claude-code.md
lists them with the evidence); the last tests keep them honest against the real CLI.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from claude_cases import FINAL, claude_harness, model_keys, run_args
from support import Harness, ids_of

from durable_harness.adapters.claude_code.canonical import ClaudeCodeCanonicalizer

HOME = "/tmp/durable-harness-claude-abc123"
ENV_BLOCK = (
    "<system-reminder>\n# Environment\nYou have been invoked in the following environment: \n"
    " - Primary working directory: /srv/ws\n - Is a git repository: {git}\n"
    " - Platform: linux\n - OS Version: {os}\n</system-reminder>"
)
GIT_BLOCK = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following "
    "context:\n# gitStatus\nThis is the git status at the start of the conversation.\n\n"
    "Current branch: main\n\nStatus:\n{status}\n\nRecent commits:\n{commit} init\n\n"
    "Claude Code attached this context automatically.\n</system-reminder>"
)


def body(
    *,
    date: str = "2026-11-29",
    tokens: int = 15000000,
    os_version: str = "Linux 6.1",
    git: str = "true",
    commit: str = "12126ab",
    status: str = " M a.txt",
    home: str = HOME,
    prompt: str = "add a pricing page",
    session: str = "s1",
    last_as_string: bool = False,
    result: str = "BASH-42",
) -> dict[str, Any]:
    first = [
        {"type": "text", "text": ENV_BLOCK.format(git=git, os=os_version)},
        {"type": "text", "text": GIT_BLOCK.format(status=status, commit=commit)},
        {"type": "text", "text": f"<system-reminder>\nToday's date is {date}.\n</system-reminder>"},
        {"type": "text", "text": f"<total_tokens>{tokens} tokens left</total_tokens>"},
        {"type": "text", "text": prompt, "cache_control": {"type": "ephemeral"}},
    ]
    tool_result: Any = result if last_as_string else [{"type": "text", "text": result}]
    return {
        "model": "claude-sonnet-4-5",
        "stream": True,
        "metadata": {"user_id": f'{{"session_id":"{session}"}}'},
        "system": [{"type": "text", "text": f"memory at {home}/.claude/projects/x/memory/"}],
        "messages": [
            {"role": "user", "content": first},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": tool_result}
                ],
            },
        ],
    }


def key(b: dict[str, Any], home: str = HOME, done: dict[str, str] | None = None) -> str:
    outcomes = done or {}
    headers = {"anthropic-beta": "b,a", "X-Claude-Code-Session-Id": b["metadata"]["user_id"]}
    return ClaudeCodeCanonicalizer(home).key("/v1/messages?beta=true", headers, b, outcomes.get)


@pytest.mark.parametrize(
    "volatile",
    [
        {"date": "2027-01-01"},
        {"tokens": 14978224},
        {"os_version": "Linux 6.9"},
        {"git": "false"},
        {"commit": "deadbee", "status": " M b.txt\n?? c.txt"},
        {"session": "s2"},
        {"last_as_string": True},
    ],
)
def test_volatile_parts_do_not_change_the_key(volatile: dict[str, Any]) -> None:
    assert key(body(**volatile)) == key(body())


def test_home_path_is_stripped() -> None:
    other = "/tmp/durable-harness-claude-zzz999"
    assert key(body(home=other), home=other) == key(body())


def test_meaningful_parts_change_the_key() -> None:
    assert key(body(prompt="add a blog")) != key(body())
    assert key(body(result="BASH-43")) != key(body())
    changed = body()
    changed["model"] = "claude-opus-4-1"
    assert key(changed) != key(body())


def test_a_recorded_tool_result_is_keyed_by_its_journal_outcome() -> None:
    done = {"toolu_1": "outcome-digest"}
    denied = body(result="PreToolUse:Bash hook error: already ran; its result was: …")
    assert key(denied, done=done) == key(body(), done=done)
    assert key(body(), done=done) != key(body())


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from claude_harness(tmp_path)


def test_real_cli_same_prompt_same_keys(h: Harness) -> None:
    """Two turns in two sessions (two session ids, two HOMEs, two launches): the same
    prompt gives the same canonical keys for every model call; another prompt does not."""
    first = h.cli(*run_args(h))
    assert first.returncode == 0, first.stderr
    (h.tmp / "ws" / "site" / "pricing.html").unlink()  # so the second turn writes it anew
    second = h.cli(*run_args(h))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == FINAL
    keys_1 = model_keys(h.show(ids_of(first)["turn"]))
    keys_2 = model_keys(h.show(ids_of(second)["turn"]))
    assert ids_of(first)["session"] != ids_of(second)["session"]
    assert len(keys_1) == 4 and keys_1 == keys_2
    (h.tmp / "ws" / "site" / "pricing.html").unlink()
    other = h.cli(*run_args(h, prompt="add a blog page"))
    assert other.returncode == 0, other.stderr
    keys_3 = model_keys(h.show(ids_of(other)["turn"]))
    assert keys_3[0] != keys_1[0]
