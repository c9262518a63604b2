"""The claude-code kill matrix (:mod:`kill_matrix`): the worker, and on the host the CLI's
process group, are killed (-9) at each point around the turn's Bash call (a ``never``
tool, step 2), then a new worker finishes the turn. Counted: model calls paid twice,
never tools (the Bash command's effect, the host tool ``notify``) run twice, the final
reply, and the replay.

``host`` runs the CLI on a host folder (the developer-only opt-in): it dies with the
worker and a new launch resumes its transcript. ``docker`` runs it in the session's
container: only the worker dies, and the new worker re-attaches to the running CLI.

Run with ``-s`` to see the table the report quotes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from claude_cases import FINAL, claude_harness, kill_worker_and_cli, launch_processes, run_args
from kill_matrix import Cli, Point, matrix, points, run_point

CLAUDE = Cli(
    name="claude-code",
    kill=kill_worker_and_cli,
    launches=lambda under: launch_processes("durable-harness-claude-", under=under),
    final=FINAL,
    shell_tool="Bash",
)


@matrix(points(shell_seq=2, sleep=20))
def test_kill_matrix(
    tmp_path: Path, where: str, point: Point, request: pytest.FixtureRequest
) -> None:
    if where == "docker":
        request.getfixturevalue("docker_host")
    harness = claude_harness(
        tmp_path, sleep=point.sleep, chunk_delay_ms=point.chunk_delay_ms, where=where
    )
    run_point(harness, run_args, point, CLAUDE, where)
