"""Pi's canonicalization: unit rules, then the real CLI's traffic recorded twice.

The rules were found by diffing the real requests of Pi 0.73.1 against the fake model
(docs/pi.md lists them); the last test keeps them honest against the real CLI.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from claude_cases import model_keys
from pi_cases import FINAL, pi_harness, run_args
from support import Harness, ids_of

from durable_harness.adapters.pi.canonical import PiCanonicalizer

PACKAGE = "/opt/a/node_modules/@mariozechner/pi-coding-agent"
SYSTEM = (
    "You are an expert coding assistant operating inside pi.\n\n"
    "Pi documentation (read only when the user asks about pi itself):\n"
    "- Main documentation: {package}/README.md\n- Additional docs: {package}/docs\n"
    "Current date: {date}\nCurrent working directory: {cwd}"
)


def body(
    *,
    date: str = "2026-11-29",
    package: str = PACKAGE,
    cwd: str = "/srv/ws",
    prompt: str = "add a pricing page",
    result: str = "BASH-42\n",
    cache_on_last: bool = True,
) -> dict[str, Any]:
    cache = {"cache_control": {"type": "ephemeral"}}
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 16384,
        "stream": True,
        "system": [
            {"type": "text", "text": SYSTEM.format(package=package, date=date, cwd=cwd), **cache}
        ],
        "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": prompt}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": result,
                        "is_error": False,
                        **(cache if cache_on_last else {}),
                    }
                ],
            },
        ],
    }


def key(b: dict[str, Any], package: str = PACKAGE, done: dict[str, str] | None = None) -> str:
    outcomes = done or {}
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking"}
    return PiCanonicalizer(package).key("/v1/messages", headers, b, outcomes.get)


@pytest.mark.parametrize("volatile", [{"date": "2027-01-01"}, {"cache_on_last": False}])
def test_volatile_parts_do_not_change_the_key(volatile: dict[str, Any]) -> None:
    assert key(body(**volatile)) == key(body())


def test_the_install_folder_is_stripped() -> None:
    other = "/usr/lib/node_modules/@mariozechner/pi-coding-agent"
    assert key(body(package=other), package=other) == key(body())


def test_meaningful_parts_change_the_key() -> None:
    assert key(body(prompt="add a blog")) != key(body())
    assert key(body(result="BASH-43\n")) != key(body())
    assert key(body(cwd="/srv/other")) != key(body())  # the turn's workspace stays


def test_a_recorded_tool_result_is_keyed_by_its_journal_outcome() -> None:
    done = {"toolu_1": "outcome-digest"}
    blocked = body(result="durable-harness: this call already ran; its result was: …")
    assert key(blocked, done=done) == key(body(), done=done)
    assert key(body(), done=done) != key(body())


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from pi_harness(tmp_path)


def test_real_cli_same_prompt_same_keys(h: Harness) -> None:
    """Two turns in two sessions (two private HOMEs, two session files, two launches): the
    same prompt gives the same canonical keys for every model call; another does not."""
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
    other = h.cli(*run_args(h, prompt="add a blog page"))
    assert other.returncode == 0, other.stderr
    keys_3 = model_keys(h.show(ids_of(other)["turn"]))
    assert keys_3[0] != keys_1[0]
