"""The opencode kill matrix (:mod:`kill_matrix`): the worker, and on the host OpenCode's
process group, are killed (-9) at each point around the turn's bash call (a ``never``
tool, step 3: the launch is step 0, the title request step 1, the first model call step
2), then a new worker finishes the turn. Counted: model calls paid twice, never tools run
twice (bash, and the host tool notify served over MCP), the final reply, and the replay.
At ``before tool`` the plugin's failed call blocks the tool.

Run with ``-s`` to see the table the report quotes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kill_matrix import Cli, Point, matrix, points, run_point
from opencode_cases import (
    FINAL,
    TOOLS,
    cli_processes,
    kill_worker_and_cli,
    opencode_harness,
    run_args,
)
from support import Harness

OPENCODE = Cli(
    name="opencode", kill=kill_worker_and_cli, launches=cli_processes, final=FINAL, timeout=180
)

#: The points also run in Docker (each costs a container and ~30 s): a model stream cut by
#: the worker's death, a hook cut by it, a tool running while the worker is gone.
IN_DOCKER = ("model streaming", "before tool", "tool running")
#: In Docker only the worker is killed: the command need not outlast a CLI's death.
DOCKER_SLEEP = 6.0


def _args(h: Harness) -> list[str]:
    return run_args(h, "--tools", TOOLS)


@matrix(points(shell_seq=3), IN_DOCKER)
def test_kill_matrix(
    tmp_path: Path, where: str, point: Point, request: pytest.FixtureRequest
) -> None:
    sleep = point.sleep
    if where == "docker":
        request.getfixturevalue("docker_host")
        sleep = min(sleep, DOCKER_SLEEP)
    harness = opencode_harness(
        tmp_path, sleep=sleep, chunk_delay_ms=point.chunk_delay_ms, notify=True, where=where
    )
    run_point(harness, _args, point, OPENCODE, where)
