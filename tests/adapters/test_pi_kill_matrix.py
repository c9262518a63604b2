"""The pi kill matrix (:mod:`kill_matrix`): the worker, and on the host the CLI's process
group, are killed (-9) at each point around the turn's ``bash`` call (a ``never`` tool,
step 2), then a new worker finishes the turn. Counted: model calls paid twice, never tools
(the bash command's effect, the host tool ``notify``) run twice, the final reply, and the
replay. At ``before tool`` the extension cannot reach the harness and blocks the tool.

Run with ``-s`` to see the table the report quotes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kill_matrix import Cli, Point, matrix, points, run_point
from pi_cases import FINAL, cli_processes, kill_worker_and_cli, pi_harness, run_args

PI = Cli(name="pi", kill=kill_worker_and_cli, launches=cli_processes, final=FINAL)

#: The points also run in Docker (each costs a container and ~30 s): a model stream cut by
#: the worker's death, a hook cut by it, a tool running while the worker is gone.
IN_DOCKER = ("model streaming", "before tool", "tool running")
#: In Docker only the worker is killed: the command need not outlast a CLI's death.
DOCKER_SLEEP = 6.0


@matrix(points(shell_seq=2), IN_DOCKER)
def test_kill_matrix(
    tmp_path: Path, where: str, point: Point, request: pytest.FixtureRequest
) -> None:
    sleep = point.sleep
    if where == "docker":
        request.getfixturevalue("docker_host")
        sleep = min(sleep, DOCKER_SLEEP)
    harness = pi_harness(tmp_path, sleep=sleep, chunk_delay_ms=point.chunk_delay_ms, where=where)
    run_point(harness, run_args, point, PI, where)
