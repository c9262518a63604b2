"""The codex kill matrix: the worker and the CLI's process group are killed (-9) at each
point of a turn, then a new worker finishes it. Counted at the fake model and in the
workspace: model calls paid twice, never tools run twice, the final reply.

Run twice, as Claude Code's matrix: ``host`` (the CLI on a host folder, the developer-only
opt-in: it dies with the worker and a new launch resumes its rollout) and ``docker`` (the
CLI in the session's container: only the worker dies, Codex runs on, and the new worker
re-attaches to its job, serves its proxy again on the same socket and finishes the launch;
every hook and model request that broke with the worker is retried and journaled once, so
the first command's step ends ``done`` at every point, with the command started once).

The turn ends with a call of the host tool ``notify`` (``never``, served over MCP), counted
too: it runs once at every point, and 0 times on replay.

Points (around the turn's first ``exec_command`` call, a ``never`` tool, step 2):

* ``model streaming``: SIGKILL while the first model response streams (slowed to ~4 s);
* ``before tool``: the worker exits (crash injection) after the response, before the
  tool's intent; the hook's failure blocks the tool;
* ``tool running``: SIGKILL while the command sleeps, its effect already made;
* ``tool returned``: the worker exits after the tool ran, before its outcome is recorded;
* ``after tool``: the worker exits after the outcome, before the next model call.

Run with ``-s`` to see the table the report quotes.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from claude_cases import WHERE, alive, dump, model_keys, upstream_keys, wait_for
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
from support import Harness

from durable_harness.harness.crash import CRASH_EXIT_CODE

BASH_SEQ = 2


@dataclass(frozen=True)
class Point:
    name: str
    sleep: float = 0  # seconds the command sleeps after its effect
    chunk_delay_ms: int = 0  # slows the first model response
    crash_at: str | None = None  # DURABLE_HARNESS_CRASH_AT
    bash_status: str = "done"  # the first shell step's status after the resume


POINTS = [
    Point("model streaming", chunk_delay_ms=250),
    Point("before tool", crash_at=f"{BASH_SEQ}:before_intent"),
    Point("tool running", sleep=8, bash_status="possibly_ran"),
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
    time.sleep(0.8)  # well inside the stream (4 s) or the command's sleep (8 s)
    assert proc.poll() is None, "the worker finished before it could be killed"
    below = kill_worker_and_cli(proc.pid)
    proc.wait(timeout=10)
    return below


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("point", POINTS, ids=[p.name.replace(" ", "-") for p in POINTS])
def test_kill_matrix(
    tmp_path: Path, point: Point, where: str, request: pytest.FixtureRequest
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

        # Never tools at most once: the first command's effect and the second's.
        assert bash_runs(h, session) == 1, (runs_at_kill, dump(after))
        assert write_runs(h, session) == 1, dump(after)
        # The host tool (served over MCP, `never`) ran once, journaled by its call id.
        assert notify_runs(h) == 1, dump(after)
        assert [s["status"] for s in after["steps"] if s["name"] == "notify"] == ["done"]
        first_bash = next(s for s in after["steps"] if s["name"] == "Bash")
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
        assert bash_runs(h, session) == 1 and write_runs(h, session) == 1
        assert notify_runs(h) == 1
        _report(point, where, repeated, after)


def _report(point: Point, where: str, repeated: list[str], after: dict[str, object]) -> None:
    steps = after["steps"]
    assert isinstance(steps, list)
    row = {
        "point": point.name,
        "where": where,
        "upstream calls repeated": len(repeated),
        "never-tool runs (first, second command, host tool)": "1, 1, 1",
        "steps": " ".join(f"{s['kind']}:{s['name']}:{s['status']}" for s in steps),
        "final reply": FINAL,
    }
    print("\nKILL-MATRIX " + json.dumps(row))
