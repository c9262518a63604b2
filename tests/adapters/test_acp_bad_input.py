"""ACP bad input, with the scripted agent: a command that is not an ACP agent, an agent
that never answers initialize, an agent asking for what the client did not offer. One
clear error each; the turn fails and nothing is recorded finished that did not finish
(the launch stays an intent, no tool step ends done)."""

from __future__ import annotations

from pathlib import Path

import pytest
from acp_cases import fake_agent_harness, run_args
from claude_cases import dump
from support import Harness


def _failed(h: Harness, *needles: str) -> None:
    out = h.cli(*run_args(h), timeout=120)
    assert out.returncode != 0, out.stdout
    turn_id = out.stdout.splitlines()[1].split()[1]
    for needle in needles:
        assert needle in out.stderr, out.stderr
    show = h.show(turn_id)
    assert show["turn"]["status"] == "failed", dump(show)
    done = [s for s in show["steps"] if s["status"] == "done"]
    assert done == [], dump(show)


@pytest.mark.parametrize(
    ("mode", "needles"),
    [
        ("not-acp", ("not an ACP agent", "Hello! I am a friendly program")),
        ("silent", ("did not answer initialize within 5 s",)),
        ("unoffered", ("'workspace/secrets'", "did not offer")),
    ],
)
def test_bad_agent(tmp_path: Path, mode: str, needles: tuple[str, ...]) -> None:
    for h in fake_agent_harness(tmp_path, mode):
        _failed(h, *needles)


def test_unknown_preset(tmp_path: Path) -> None:
    for h in fake_agent_harness(tmp_path, "tools"):
        out = h.cli(*run_args(h, agent="acp:nope"))
        assert out.returncode == 2 and "unknown agent 'acp:nope'" in out.stderr
