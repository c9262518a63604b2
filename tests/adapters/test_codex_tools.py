"""Host tools for the codex agent: the user's ``--tools`` served to the real Codex CLI over
MCP by the harness (host folder, developer opt-in), journaled by the model's call id under
the tool's own replay label."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import model_keys, tool_rows, upstream_keys
from codex_cases import FINAL, bash_runs, codex_harness, notify_runs, run_args, write_runs
from support import Harness, ids_of


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from codex_harness(tmp_path, notify=True)


def test_a_turn_with_a_host_tool_completes_and_replays_without_running_it(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    show = h.show(ids_of(out)["turn"])
    assert tool_rows(show) == [("Bash", "done"), ("Bash", "done"), ("notify", "done")]
    notify = next(s for s in show["steps"] if s["name"] == "notify")
    assert notify["key"].startswith("tool:call_"), notify
    # The tool ran once, given the step's idempotency key (turn:seq).
    assert (h.tmp / "notify.txt").read_text().split()[0] == f"{ids_of(out)['turn']}:{notify['seq']}"
    assert notify_runs(h) == 1 and bash_runs(h) == 1 and write_runs(h) == 1
    assert len(model_keys(show, "done")) == 4
    assert sorted(upstream_keys(h)) == sorted(model_keys(show))

    calls = len(h.requests())
    replay = h.cli("replay", ids_of(out)["turn"])
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == FINAL and len(h.requests()) == calls
    assert notify_runs(h) == 1 and bash_runs(h) == 1 and write_runs(h) == 1
