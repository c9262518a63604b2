"""The codex kill matrix (:mod:`kill_matrix`): the worker, and on the host the CLI's
process group, are killed (-9) at each point around the turn's first ``exec_command``
call (a ``never`` tool, journaled as ``Bash``, step 2), then a new worker finishes the
turn. Counted: model calls paid twice, never tools run twice (the first command's effect,
the second command's, the host tool ``notify`` served over MCP), the final reply, and the
replay (0 upstream calls, 0 tool runs).

``host`` runs Codex on a host folder (the developer-only opt-in): it dies with the worker
and a new launch resumes its rollout. ``docker`` runs it in the session's container: only
the worker dies, Codex runs on, and the new worker re-attaches to its job, serves its
proxy again on the same socket and finishes the launch; every hook and model request that
broke with the worker is retried and journaled once.

Run with ``-s`` to see the table the report quotes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from codex_cases import (
    FINAL,
    bash_runs,
    cli_processes,
    codex_harness,
    kill_worker_and_cli,
    notify_runs,
    run_args,
    write_runs,
)
from kill_matrix import Cli, Point, matrix, points, run_point

CODEX = Cli(
    name="codex",
    kill=kill_worker_and_cli,
    launches=cli_processes,
    final=FINAL,
    shell_tool="Bash",
    effects={
        "first command": bash_runs,
        "second command": write_runs,
        "notify": lambda h, _session: notify_runs(h),
    },
)


@matrix(points(shell_seq=2, sleep=8))
def test_kill_matrix(
    tmp_path: Path, where: str, point: Point, request: pytest.FixtureRequest
) -> None:
    if where == "docker":
        request.getfixturevalue("docker_host")
    harness = codex_harness(
        tmp_path,
        sleep=point.sleep,
        chunk_delay_ms=point.chunk_delay_ms,
        where=where,
        notify=True,
    )
    run_point(harness, run_args, point, CODEX, where)
