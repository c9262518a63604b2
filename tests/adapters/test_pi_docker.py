"""Pi in the Docker sandbox: the real CLI 0.73.1 in the session's container, against the
fake model, through the proxy's unix socket and the in-container bridge.

The kill matrix with Pi in Docker is ``test_pi_kill_matrix.py`` (parametrized
``docker``); this file has the plain turn, the session's next turn after its container
was lost, and replay.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import container_text, dump, tool_rows
from pi_cases import (
    FINAL,
    SECOND_PROMPT,
    SECOND_REPLY,
    bash_runs,
    notify_runs,
    pi_harness,
    run_args,
)
from support import Harness, ids_of

from durable_harness.sandbox.docker import DockerSandbox


@pytest.fixture
def h(tmp_path: Path, docker_host: str) -> Iterator[Harness]:
    yield from pi_harness(tmp_path, where="docker")


def test_turn_in_docker(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    ids = ids_of(out)
    show = h.show(ids["turn"])
    assert tool_rows(show) == [("bash", "done"), ("write", "done"), ("notify", "done")], dump(show)
    assert bash_runs(h, ids["session"]) == 1 and notify_runs(h) == 1
    assert container_text(ids["session"], "/workspace/site/pricing.html") == "<h1>Pricing</h1>\n"
    assert h.repeated_requests() == {}

    # The session's next turn continues Pi's session file; the container was lost
    # between the turns, so a new one gets the workspace back from the World.
    box = DockerSandbox(ids["session"])
    try:
        box.remove()
    finally:
        box.close()
    second = h.cli(*run_args(h, "--session", ids["session"], prompt=SECOND_PROMPT))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == SECOND_REPLY
    assert container_text(ids["session"], "/workspace/site/pricing.html") == "<h1>Pricing</h1>\n"

    # A finished turn replays in the container with 0 upstream calls and no tool run.
    calls = len(h.requests())
    replay = h.cli("replay", ids["turn"])
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == FINAL and len(h.requests()) == calls
    assert bash_runs(h, ids["session"]) == 1 and notify_runs(h) == 1
