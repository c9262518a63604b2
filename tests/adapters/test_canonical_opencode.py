"""OpenCode's canonicalization: unit rules, then the real CLI's traffic recorded twice.

The rules were found by diffing real requests of OpenCode 1.18.33 (``@ai-sdk/anthropic``
provider) in two private HOMEs (docs/opencode.md lists them); the last test keeps them
honest against the real CLI.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from claude_cases import model_keys
from opencode_cases import FINAL, opencode_harness, run_args
from support import Harness, ids_of

from durable_harness.adapters.opencode.canonical import OpenCodeCanonicalizer

HOME = "/tmp/durable-harness-opencode-abc123"
ENV_BLOCK = (
    "Here is some useful information about the environment you are running in:\n<env>\n"
    "  Working directory: /srv/ws\n  Workspace root folder: /\n"
    "  Is directory a git repo: {git}\n  Platform: linux\n  Today's date: {date}\n</env>\n"
    "skills at {home}/.config/opencode/skills"
)


def body(
    *,
    date: str = "Sun Nov 29 2026",
    git: str = "no",
    home: str = HOME,
    prompt: str = '"add a pricing page"',
    cached_last: bool = True,
    result: str = "BASH-42\n",
) -> dict[str, Any]:
    marker = {"cache_control": {"type": "ephemeral"}} if cached_last else {}
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": True,
        "system": [{"type": "text", "text": ENV_BLOCK.format(git=git, date=date, home=home)}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": prompt}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}, **marker}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": result, **marker}
                ],
            },
        ],
        "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto"},
    }


def key(
    b: dict[str, Any], home: str = HOME, done: dict[str, str] | None = None, session: str = "s1"
) -> str:
    outcomes = done or {}
    headers = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "structured-outputs-2025-11-13",
        "x-session-id": f"ses_{session}",
        "x-session-affinity": f"ses_{session}",
        "User-Agent": "opencode/1.18.33",
    }
    return OpenCodeCanonicalizer(home).key("/v1/messages", headers, b, outcomes.get)


@pytest.mark.parametrize(
    "volatile", [{"date": "Mon Jan 04 2027"}, {"git": "yes"}, {"cached_last": False}]
)
def test_volatile_parts_do_not_change_the_key(volatile: dict[str, Any]) -> None:
    assert key(body(**volatile)) == key(body())


def test_session_headers_and_home_path_are_stripped() -> None:
    other = "/tmp/durable-harness-opencode-zzz999"
    assert key(body(), session="s2") == key(body())
    assert key(body(home=other), home=other) == key(body())


def test_meaningful_parts_change_the_key() -> None:
    assert key(body(prompt='"add a blog"')) != key(body())
    assert key(body(result="BASH-43\n")) != key(body())
    changed = body()
    changed["model"] = "claude-opus-4-1"
    assert key(changed) != key(body())


def test_a_recorded_tool_result_is_keyed_by_its_journal_outcome() -> None:
    done = {"toolu_1": "outcome-digest"}
    denied = body(result="durable-harness: this call already ran and must not run again; …")
    assert key(denied, done=done) == key(body(), done=done)
    assert key(body(), done=done) != key(body())


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from opencode_harness(tmp_path)


def test_real_cli_same_prompt_same_keys(h: Harness) -> None:
    """Two turns in two sessions (two OpenCode session ids, two HOMEs, two launches): the
    same prompt gives the same canonical keys for every model call, the title request
    included (matched by its content); another prompt does not."""
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
    # Both turns asked the model (their journals are separate); the title request and the
    # first call start together, in either order.
    rules = [r["rule"] for r in h.requests()]
    assert sorted(rules) == sorted(["title", "bash", "write", "final"] * 2)
    (h.tmp / "ws" / "site" / "pricing.html").unlink()
    other = h.cli(*run_args(h, prompt="add a blog page"))
    assert other.returncode == 0, other.stderr
    keys_3 = model_keys(h.show(ids_of(other)["turn"]))
    assert keys_3[0] != keys_1[0] and keys_3[1] != keys_1[1]
    assert not set(keys_3) & set(keys_1)
