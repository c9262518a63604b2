"""Claude Code in the Docker sandbox: the real CLI 2.1.332 in the session's container,
against the fake model, through the proxy's unix socket and the in-container bridge.

The kill matrix with the CLI in Docker is ``test_claude_kill_matrix.py`` (parametrized
``docker``); this file has the plain turn, re-attach after the container is lost, bad
input, and the provider key's absence from the container.
"""

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
    notify_runs,
    run_args,
    tool_rows,
)
from support import Harness, ids_of


@pytest.fixture
def h(tmp_path: Path, docker_host: str) -> Iterator[Harness]:
    yield from claude_harness(tmp_path, where="docker")


def test_turn_in_docker(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    ids = ids_of(out)
    show = h.show(ids["turn"])
    assert tool_rows(show) == [
        ("Bash", "done"),
        ("Write", "done"),
        ("notify", "done"),
    ], dump(show)
    assert bash_runs(h, ids["session"]) == 1 and notify_runs(h) == 1
    assert h.repeated_requests() == {}

    # The session's next turn resumes the CLI's transcript in the same container.
    second = h.cli(*run_args(h, "--session", ids["session"], prompt=SECOND_PROMPT))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == SECOND_REPLY

    # A finished turn replays in the container with 0 upstream calls and no tool run.
    calls = len(h.requests())
    replay = h.cli("replay", ids["turn"])
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == FINAL and len(h.requests()) == calls
    assert bash_runs(h, ids["session"]) == 1 and notify_runs(h) == 1
