"""The acp:opencode kill matrix (:mod:`kill_matrix`), on a host folder and in Docker:
``opencode acp`` with the harness as its ACP client. The worker (and on the host
OpenCode's process group) is killed (-9) at each point around the turn's bash call (a
``never`` tool journaled at OpenCode's permission request, step 3: the launch is step 0,
the title request step 1, the first model call step 2), then a new worker finishes the
turn: it restores OpenCode's database and loads the session (``session/load``) with the
resume message. An ACP launch ends with its worker in Docker too (``reattaches=False``).
Counted as for every CLI: model calls paid twice, never tools run twice (bash, and the
host tool notify served over MCP), the final reply, and the replay. The opencode turn and
script are ``opencode_cases``'s.

Run with ``-s`` to see the table the report quotes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from claude_cases import kill_worker_and_cli, launch_processes
from kill_matrix import Cli, Point, matrix, points, run_point
from opencode_cases import AGENT_CONFIG, FINAL, PROMPT, TOOLS, WORKSPACE_ENV, opencode_harness
from support import Harness


def _launches(under: Path | None = None) -> list[int]:
    return launch_processes("HOME=/tmp/durable-harness-acp-opencode-", "environ", under)


ACP_OPENCODE = Cli(
    name="acp:opencode",
    kill=lambda pid: kill_worker_and_cli(pid, "opencode"),
    launches=_launches,
    final=FINAL,
    timeout=180,
    reattaches=False,  # the agent ends with its worker: a new launch loads the session
)
#: The points that also run in Docker. None yet: at "model streaming" and "tool running"
#: the kill, the resume and every count pass in the container, but the replay that follows
#: meets, now and then, one model request the journal does not hold (never on a host
#: folder); docs/acp.md lists it as open. Put them back here once it is found.
IN_DOCKER: tuple[str, ...] = ()
DOCKER_SLEEP = 6.0


def _args(h: Harness) -> list[str]:
    return [
        "run", "--agent", "acp:opencode", "--workspace", h.env[WORKSPACE_ENV],
        "--agent-config", str(AGENT_CONFIG), "--tools", TOOLS, PROMPT,
    ]  # fmt: skip


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
    run_point(harness, _args, point, ACP_OPENCODE, where)
