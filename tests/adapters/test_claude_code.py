"""The claude-code agent end to end: the real Claude Code CLI (the pinned version from
scripts/setup) against the scripted fake model, through the journaling proxy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import (
    FINAL,
    SECOND_PROMPT,
    SECOND_REPLY,
    bash_runs,
    claude_harness,
    dump,
    model_keys,
    notify_runs,
    run_args,
    tool_rows,
    upstream_keys,
)
from support import Harness, ids_of


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from claude_harness(tmp_path)


def test_turn_with_bash_edit_and_host_tool(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    show = h.show(ids_of(out)["turn"])
    kinds = [(s["kind"], s["name"]) for s in show["steps"]]
    assert kinds == [
        ("agent", "claude-code"),
        ("model", "claude-sonnet-4-5"),
        ("tool", "Bash"),
        ("model", "claude-sonnet-4-5"),
        ("tool", "Write"),
        ("model", "claude-sonnet-4-5"),
        ("tool", "notify"),
        ("model", "claude-sonnet-4-5"),
    ], dump(show)
    assert all(s["status"] == "done" and s["how"] == "live" for s in show["steps"])
    assert (h.tmp / "ws" / "site" / "pricing.html").read_text() == "<h1>Pricing</h1>\n"
    assert bash_runs(h) == 1 and notify_runs(h) == 1
    # Every model call reached the fake model once, keyed as the journal keyed it.
    assert sorted(upstream_keys(h)) == sorted(model_keys(show))
    assert all(r["api_key_sent"] for r in h.requests())


def test_finished_turn_replays_with_zero_upstream_calls(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    turn = ids_of(out)["turn"]
    calls = len(h.requests())
    replay = h.cli("replay", turn)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == FINAL
    assert len(h.requests()) == calls  # 0 upstream calls
    assert bash_runs(h) == 1 and notify_runs(h) == 1  # no tool ran again
    # With the model switched off entirely, the replay still answers from the journal.
    h.server.stop()
    offline = h.cli("replay", turn, ANTHROPIC_BASE_URL="http://127.0.0.1:9")
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout.strip() == FINAL


def test_second_turn_sees_the_first(h: Harness) -> None:
    first = h.cli(*run_args(h))
    assert first.returncode == 0, first.stderr
    session = ids_of(first)["session"]
    second = h.cli(*run_args(h, "--session", session, prompt=SECOND_PROMPT))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == SECOND_REPLY
    last = h.requests()[-1]
    assert last["rule"] == "second"  # matched on the first turn's reply in the history
    show = h.show(ids_of(second)["turn"])
    assert [s["kind"] for s in show["steps"]] == ["agent", "model"]
    assert tool_rows(show) == []
    assert bash_runs(h) == 1


def test_prompt_text_is_journal_input_not_a_flag(h: Harness) -> None:
    """A prompt that looks like a CLI flag reaches the model as text (it goes on stdin)."""
    out = h.cli(*run_args(h, prompt="--help add a pricing page"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    assert h.requests()[0]["rule"] == "bash"


def test_model_call_budget_ends_a_looping_turn(h: Harness) -> None:
    out = h.cli(*run_args(h, "--max-model-calls", "2"))
    assert out.returncode != 0
    assert "made 2 model calls in this turn without finishing" in out.stderr, out.stderr
    show = h.show(ids_of(out)["turn"])
    assert show["turn"]["status"] == "failed", dump(show)
    assert len(model_keys(show)) == 2 and len(h.requests()) == 2  # no third call upstream
    assert bash_runs(h) == 1
