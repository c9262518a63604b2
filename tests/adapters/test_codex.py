"""The codex agent end to end: the real Codex CLI 0.171.0 against the fake model through the
journaling proxy, on a host folder (developer opt-in; Docker is the supported place)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import model_keys, tool_rows, upstream_keys
from codex_cases import (
    FINAL,
    SECOND_PROMPT,
    SECOND_REPLY,
    bash_runs,
    codex_harness,
    run_args,
    write_runs,
)
from support import Harness, ids_of


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from codex_harness(tmp_path)


def test_two_tool_turn_replays_and_a_second_turn_sees_the_first(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    ids = ids_of(out)
    show = h.show(ids["turn"])
    assert tool_rows(show) == [("Bash", "done"), ("Bash", "done")]
    assert len(model_keys(show, "done")) == 3
    assert bash_runs(h) == 1 and write_runs(h) == 1
    assert (h.tmp / "ws" / "site" / "pricing.html").read_text() == "<h1>Pricing</h1>\n"
    # Every upstream call carried its journal key; none was made twice.
    assert sorted(upstream_keys(h)) == sorted(model_keys(show))

    calls = len(h.requests())
    replay = h.cli("replay", ids["turn"])
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == FINAL and len(h.requests()) == calls
    assert bash_runs(h) == 1 and write_runs(h) == 1

    second = h.cli(*run_args(h, "--session", ids["session"], prompt=SECOND_PROMPT))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == SECOND_REPLY
    assert bash_runs(h) == 1 and write_runs(h) == 1


def test_real_cli_same_prompt_same_keys(h: Harness) -> None:
    """Two turns in two sessions (two threads, two CODEX_HOMEs): the same prompt gives the
    same canonical keys for every model call; another prompt does not."""
    first = h.cli(*run_args(h))
    assert first.returncode == 0, first.stderr
    second = h.cli(*run_args(h))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == FINAL
    keys_1 = model_keys(h.show(ids_of(first)["turn"]))
    keys_2 = model_keys(h.show(ids_of(second)["turn"]))
    assert ids_of(first)["session"] != ids_of(second)["session"]
    assert len(keys_1) == 3 and keys_1 == keys_2
    other = h.cli(*run_args(h, prompt="add a blog page"))
    assert other.returncode == 0, other.stderr
    keys_3 = model_keys(h.show(ids_of(other)["turn"]))
    assert keys_3[0] != keys_1[0]


def test_host_folder_needs_the_developer_opt_in(h: Harness) -> None:
    out = h.cli(*run_args(h), DURABLE_HARNESS_UNSAFE_HOST_AGENT="")
    assert out.returncode == 2
    assert "--workspace docker" in out.stderr and "DURABLE_HARNESS_UNSAFE_HOST_AGENT" in out.stderr
