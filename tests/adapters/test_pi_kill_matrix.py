"""The pi kill matrix: the worker and the CLI's process group are killed (-9) at each
point of a turn, then a new worker finishes it. Counted at the fake model and in the
workspace: model calls paid twice, never tools run twice, the final reply.

Points (around the turn's ``bash`` call, a ``never`` tool, step 2), as for Claude Code:

* ``model streaming``: SIGKILL while the first model response streams (slowed to ~3 s);
* ``before tool``: the worker exits (crash injection) after the response, before the
  tool's intent; the extension cannot reach the harness and blocks the tool;
* ``tool running``: SIGKILL while the bash command sleeps, its effect already made;
* ``tool returned``: the worker exits after the tool ran, before its outcome is recorded;
* ``after tool``: the worker exits after the outcome, before the next model call.

Run with ``-s`` to see the table the report quotes.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from claude_cases import alive, dump, model_keys, upstream_keys, wait_for
from pi_cases import (
    FINAL,
    bash_runs,
    cli_processes,
    kill_worker_and_cli,
    notify_runs,
    pi_harness,
    run_args,
)
from support import Harness

from durable_harness.harness.crash import CRASH_EXIT_CODE

BASH_SEQ = 2


#: The points also run with the CLI in Docker (each costs a container and ~30 s; the host
#: runs all five): one a model stream cut by the worker's death, one a hook cut by it, one
#: a tool running while the worker is gone. DH_TEST_DOCKER_MATRIX=full runs all five.
IN_DOCKER = (
    ("model streaming", "before tool", "tool running", "tool returned", "after tool")
    if os.environ.get("DH_TEST_DOCKER_MATRIX") == "full"
    else ("model streaming", "before tool", "tool running")
)
#: In Docker only the worker is killed: the command need not outlast a CLI's death.
DOCKER_SLEEP = 6.0


@dataclass(frozen=True)
class Point:
    name: str
    sleep: float = 0  # seconds the bash command sleeps after its effect
    chunk_delay_ms: int = 0  # slows the first model response
    crash_at: str | None = None  # DURABLE_HARNESS_CRASH_AT
    bash_status: str = "done"  # the first bash step's status after the resume


POINTS = [
    Point("model streaming", chunk_delay_ms=250),
    Point("before tool", crash_at=f"{BASH_SEQ}:before_intent"),
    Point("tool running", sleep=30, bash_status="possibly_ran"),
    Point("tool returned", crash_at=f"{BASH_SEQ}:after_run", bash_status="possibly_ran"),
    Point("after tool", crash_at=f"{BASH_SEQ}:after_outcome"),
]


def _kill_when(
    h: Harness, proc: subprocess.Popen[str], point: Point, session: str | None
) -> list[int]:
    """Kill the worker (and its CLI's group) at ``point``; returns pids that were below it."""
    if point.crash_at is not None:
        proc.wait(timeout=120)
        assert proc.returncode == CRASH_EXIT_CODE, proc.stderr.read() if proc.stderr else ""
        return []
    ready: Callable[[], bool]
    if point.chunk_delay_ms:
        ready = lambda: any(r["rule"] == "bash" for r in h.requests())  # noqa: E731
    else:
        ready = lambda: bash_runs(h, session) == 1  # noqa: E731
    wait_for(ready, what=f"{point.name} to begin")
    time.sleep(0.8)  # well inside the stream (3 s) or the command's sleep (30 s)
    assert proc.poll() is None, "the worker finished before it could be killed"
    below = kill_worker_and_cli(proc.pid)
    proc.wait(timeout=10)
    return below


@pytest.mark.parametrize(
    ("where", "point"),
    [("host", p) for p in POINTS] + [("docker", p) for p in POINTS if p.name in IN_DOCKER],
    ids=[f"host-{p.name.replace(' ', '-')}" for p in POINTS]
    + [f"docker-{p.name.replace(' ', '-')}" for p in POINTS if p.name in IN_DOCKER],
)
def test_kill_matrix(
    tmp_path: Path, where: str, point: Point, request: pytest.FixtureRequest
) -> None:
    sleep = point.sleep
    if where == "docker":
        request.getfixturevalue("docker_host")
        sleep = min(sleep, DOCKER_SLEEP)
    harness = pi_harness(tmp_path, sleep=sleep, chunk_delay_ms=point.chunk_delay_ms, where=where)
    for h in harness:
        env = {"DURABLE_HARNESS_CRASH_AT": point.crash_at} if point.crash_at else {}
        proc = h.popen(*run_args(h), **env)
        assert proc.stdout is not None
        session_line, turn_line = proc.stdout.readline(), proc.stdout.readline()
        turn_id = turn_line.split()[1]
        session = session_line.split()[1] if where == "docker" else None
        below = _kill_when(h, proc, point, session)

        # Nothing of the killed launch survives it: not the CLI, not its shell's sleep.
        gone = lambda pids=below: not alive(pids) and not cli_processes()  # noqa: E731
        wait_for(gone, 10, "the CLI to be gone")
        runs_at_kill = bash_runs(h, session)
        before = h.show(turn_id)
        done_before = set(model_keys(before, "done"))
        calls_before = len(h.requests())

        resumed = h.cli("resume", turn_id)
        assert resumed.returncode == 0, resumed.stderr
        after = h.show(turn_id)

        # The turn ends with the scripted final reply, by a second delivery.
        assert resumed.stdout.strip().splitlines()[-1] == FINAL, dump(after)
        assert after["turn"]["status"] == "done" and after["turn"]["deliveries"] == 2

        # 0 upstream calls for a request whose outcome was recorded before the kill; and
        # every upstream call is one attempt of one journal step (none paid twice).
        repeated = [k for k in upstream_keys(h, since=calls_before) if k in done_before]
        assert repeated == []
        attempts = {s["key"]: s["attempts"] for s in after["steps"] if s["kind"] == "model"}
        assert dict(Counter(upstream_keys(h))) == attempts, dump(after)

        # Never tools at most once: the bash effect and the host tool's ledger.
        assert bash_runs(h, session) == 1, (runs_at_kill, dump(after))
        assert notify_runs(h) == 1
        first_bash = next(s for s in after["steps"] if s["name"] == "bash")
        expected = point.bash_status if where == "host" else "done"
        assert first_bash["status"] == expected, dump(after)
        if where == "docker":  # one launch: the new worker re-attached to the running CLI
            assert [s["kind"] for s in after["steps"]].count("agent") == 1, dump(after)

        # The finished turn replays through the proxy (its last launch, as recorded) with
        # 0 upstream calls and no tool run.
        calls = len(h.requests())
        replay = h.cli("replay", turn_id)
        assert replay.returncode == 0, replay.stderr
        assert replay.stdout.strip() == FINAL and len(h.requests()) == calls
        assert bash_runs(h, session) == 1 and notify_runs(h) == 1
        _report(point, where, repeated, after)


def _report(point: Point, where: str, repeated: list[str], after: dict[str, object]) -> None:
    steps = after["steps"]
    assert isinstance(steps, list)
    row = {
        "point": point.name,
        "where": where,
        "upstream calls repeated": len(repeated),
        "never-tool runs (bash, notify)": "1, 1",
        "steps": " ".join(f"{s['kind']}:{s['name']}:{s['status']}" for s in steps),
        "final reply": FINAL,
    }
    print("\nKILL-MATRIX " + json.dumps(row))
