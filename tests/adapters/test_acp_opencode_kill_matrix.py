"""The acp:opencode kill matrix (:mod:`kill_matrix`), on a host folder: ``opencode acp``
with the harness as its ACP client. The worker and OpenCode's process group are killed
(-9) at each point around the turn's bash call (a ``never`` tool journaled at OpenCode's
permission request, step 3: the launch is step 0, the title request step 1, the first
model call step 2), then a new worker finishes the turn: it restores OpenCode's database
and loads the session (``session/load``) with the resume message. Counted as for every
CLI: model calls paid twice, never tools run twice (bash, and the host tool notify served
over MCP), the final reply, and the replay. The opencode turn and script are
``opencode_cases``'s.

Run with ``-s`` to see the table the report quotes.
"""

from __future__ import annotations

from pathlib import Path

from claude_cases import kill_worker_and_cli, launch_processes
from kill_matrix import Cli, Point, matrix, points, run_point
from opencode_cases import AGENT_CONFIG, FINAL, PROMPT, TOOLS, opencode_harness
from support import Harness


def _launches(under: Path | None = None) -> list[int]:
    return launch_processes("HOME=/tmp/durable-harness-acp-opencode-", "environ", under)


ACP_OPENCODE = Cli(
    name="acp:opencode",
    kill=lambda pid: kill_worker_and_cli(pid, "opencode"),
    launches=_launches,
    final=FINAL,
    timeout=180,
)


def _args(h: Harness) -> list[str]:
    return [
        "run", "--agent", "acp:opencode", "--workspace", str(h.tmp / "ws"),
        "--agent-config", str(AGENT_CONFIG), "--tools", TOOLS, PROMPT,
    ]  # fmt: skip


@matrix(points(shell_seq=3), ())
def test_kill_matrix(tmp_path: Path, where: str, point: Point) -> None:
    harness = opencode_harness(
        tmp_path, sleep=point.sleep, chunk_delay_ms=point.chunk_delay_ms, notify=True
    )
    run_point(harness, _args, point, ACP_OPENCODE, where)
