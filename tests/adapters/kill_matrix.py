"""The kill matrix every CLI adapter passes, driven once for all of them.

A turn (a model call, the CLI's shell tool ``never`` running a command with an effect,
a host tool ``notify`` ``never``, the scripted final reply) is started by a worker, which
is killed at a :class:`Point`; a new worker finishes the turn (``resume``), and then the
finished turn is replayed. Counted at the fake model and in the workspace:

* 0 upstream calls for a model request whose outcome was recorded before the kill, and
  every upstream call is one attempt of one journal step (none paid twice);
* every ``never`` tool's effect made once (:attr:`Cli.effects`);
* the scripted final reply, by a second delivery;
* the replay: the same reply, 0 upstream calls, no tool run.

``where`` is ``host`` (the CLI on a host folder: it dies with the worker's process group
and a new launch resumes its session record; the shell step of an interrupted command
ends ``possibly_ran``) or ``docker`` (the CLI in the session's container: only the worker
dies, the CLI runs on, the new worker re-attaches to its job and finishes the same launch,
so the shell step ends ``done`` and there is one launch).

Each ``test_<cli>_kill_matrix.py`` says what is particular to its CLI (:class:`Cli`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from claude_cases import alive, bash_runs, dump, model_keys, notify_runs, upstream_keys, wait_for
from support import Harness

from durable_harness.harness.crash import CRASH_EXIT_CODE

__all__ = ["Cli", "Point", "kill_and_resume", "matrix", "points"]


@dataclass(frozen=True)
class Point:
    name: str
    sleep: float = 0  # seconds the shell command sleeps after its effect
    chunk_delay_ms: int = 0  # slows the first model response
    crash_at: str | None = None  # DURABLE_HARNESS_CRASH_AT
    shell_status: str = "done"  # the first shell step's status after the resume (host)

    @property
    def id(self) -> str:
        return self.name.replace(" ", "-")


def points(shell_seq: int, sleep: float = 30) -> list[Point]:
    """The points around the turn's first shell call (journal step ``shell_seq``), and one
    after the whole launch:

    * ``model streaming``: SIGKILL while the first model response streams (slowed);
    * ``before tool``: the worker exits (crash injection) after the response, before the
      tool's intent; the CLI's hook or plugin cannot reach the harness and blocks the tool;
    * ``tool running``: SIGKILL while the command sleeps (``sleep`` s), its effect made;
    * ``tool returned``: the worker exits after the tool ran, before its outcome;
    * ``after tool``: the worker exits after the outcome, before the next model call;
    * ``after launch``: the worker exits after the CLI's run (launch step 0) is journaled,
      before the turn is marked done: the next delivery answers from the journal and
      starts no CLI.
    """
    return [
        Point("model streaming", chunk_delay_ms=250),
        Point("before tool", crash_at=f"{shell_seq}:before_intent"),
        Point("tool running", sleep=sleep, shell_status="possibly_ran"),
        Point("tool returned", crash_at=f"{shell_seq}:after_run", shell_status="possibly_ran"),
        Point("after tool", crash_at=f"{shell_seq}:after_outcome"),
        Point("after launch", crash_at="0:after_outcome"),
    ]


def matrix(
    all_points: list[Point], in_docker: tuple[str, ...] | None = None
) -> Any:  # a pytest parametrize mark
    """``(where, point)`` for every point on the host, and in Docker the points named in
    ``in_docker`` (all when None; ``DH_TEST_DOCKER_MATRIX=full`` runs all of them too)."""
    if os.environ.get("DH_TEST_DOCKER_MATRIX") == "full":
        in_docker = None
    docker = [p for p in all_points if in_docker is None or p.name in in_docker]
    cases = [("host", p) for p in all_points] + [("docker", p) for p in docker]
    return pytest.mark.parametrize(
        ("where", "point"), cases, ids=[f"{where}-{p.id}" for where, p in cases]
    )


def _shell_runs(h: Harness, session: str | None) -> int:
    return bash_runs(h, session)


def _notify_runs(h: Harness, session: str | None) -> int:
    return notify_runs(h)


@dataclass(frozen=True)
class Cli:
    """What is particular to one CLI's matrix."""

    name: str
    kill: Callable[[int], list[int]]  # worker pid -> the pids that were below it
    #: Live processes of a launch of this CLI working in the given folder (the test's).
    launches: Callable[[Path], list[int]]
    final: str  # the scripted final reply
    shell_tool: str = "bash"  # the journal's name of the CLI's shell tool
    #: ``never`` effects counted after the kill, each must be 1: name -> (h, session) -> n.
    #: The first one is the shell command the kill points are placed around.
    effects: dict[str, Callable[[Harness, str | None], int]] = field(
        default_factory=lambda: {"shell": _shell_runs, "notify": _notify_runs}
    )
    timeout: float = 120  # for the worker's crash, the tool to start, resume and replay
    #: Whether a new worker re-attaches to the CLI still running in the container
    #: (an ACP agent's launch instead ends with its worker, in Docker too).
    reattaches: bool = True


def kill_and_resume(
    h: Harness, args: list[str], point: Point, cli: Cli, where: str = "host"
) -> dict[str, Any]:
    """Run ``args``, kill the worker at ``point``, resume the turn with a new worker, replay
    it, and check what the matrix checks (module docstring). Returns the matrix's row."""
    env = {"DURABLE_HARNESS_CRASH_AT": point.crash_at} if point.crash_at else {}
    proc = h.popen(*args, **env)
    assert proc.stdout is not None
    session_line, turn_line = proc.stdout.readline(), proc.stdout.readline()
    turn_id = turn_line.split()[1]
    session = session_line.split()[1] if where == "docker" else None
    shell = next(iter(cli.effects.values()))
    below = _kill_when(h, proc, point, cli, lambda: shell(h, session) == 1, turn_id)

    # Nothing of the killed launch survives it on the host: not the CLI, not its sleep.
    gone = lambda: not alive(below) and not cli.launches(h.tmp)  # noqa: E731
    wait_for(gone, 10, "the CLI to be gone")
    at_kill = {name: count(h, session) for name, count in cli.effects.items()}
    before = h.show(turn_id)
    done_before = set(model_keys(before, "done"))
    calls_before = len(h.requests())

    resumed = h.cli("resume", turn_id, timeout=max(cli.timeout, 300))
    assert resumed.returncode == 0, resumed.stderr
    after = h.show(turn_id)
    assert resumed.stdout.strip().splitlines()[-1] == cli.final, dump(after)
    assert after["turn"]["status"] == "done" and after["turn"]["deliveries"] == 2

    repeated = [k for k in upstream_keys(h, since=calls_before) if k in done_before]
    assert repeated == []
    attempts = {s["key"]: s["attempts"] for s in after["steps"] if s["kind"] == "model"}
    assert dict(Counter(upstream_keys(h))) == attempts, dump(after)

    def effects() -> dict[str, int]:
        return {name: count(h, session) for name, count in cli.effects.items()}

    assert set(effects().values()) == {1}, (effects(), at_kill, dump(after))
    first_shell = next(s for s in after["steps"] if s["name"] == cli.shell_tool)
    expected = point.shell_status if where == "host" or not cli.reattaches else "done"
    assert first_shell["status"] == expected, dump(after)
    launches = [s["kind"] for s in after["steps"]].count("agent")
    if (where == "docker" and cli.reattaches) or point.name == "after launch":
        # One launch: the new worker re-attached to the running CLI, or found its end.
        assert launches == 1, dump(after)

    calls = len(h.requests())
    replay = h.cli("replay", turn_id, timeout=max(cli.timeout, 300))
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == cli.final and len(h.requests()) == calls
    assert set(effects().values()) == {1}, effects()
    return {
        "cli": cli.name,
        "point": point.name,
        "where": where,
        "upstream calls repeated": len(repeated),
        "never-tool runs": effects(),
        "steps": " ".join(f"{s['kind']}:{s['name']}:{s['status']}" for s in after["steps"]),
        "final reply": cli.final,
    }


def report(row: dict[str, Any]) -> None:
    """The row, for the table the docs quote (run with ``-s`` to see it)."""
    print("\nKILL-MATRIX " + json.dumps(row))


def _kill_when(
    h: Harness,
    proc: subprocess.Popen[str],
    point: Point,
    cli: Cli,
    tool_started: Callable[[], bool],
    turn_id: str,
) -> list[int]:
    """Kill the worker (and its CLI's group) at ``point``; returns pids that were below it."""
    if point.crash_at is not None:
        proc.wait(timeout=cli.timeout)
        assert proc.returncode == CRASH_EXIT_CODE, proc.stderr.read() if proc.stderr else ""
        return []
    ready: Callable[[], bool]
    if point.chunk_delay_ms:
        ready = lambda: any(r["rule"] == "bash" for r in h.requests())  # noqa: E731
    else:
        ready = tool_started
    try:
        wait_for(ready, cli.timeout, what=f"{point.name} to begin")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{_what_happened(h, proc, turn_id)}") from None
    time.sleep(0.8)  # well inside the stream (~3 s) or the command's sleep
    assert proc.poll() is None, "the worker finished before it could be killed"
    below = cli.kill(proc.pid)
    proc.wait(timeout=10)
    return below


def _what_happened(h: Harness, proc: subprocess.Popen[str], turn_id: str) -> str:
    """What a point that never began leaves to read: the worker's stderr (it is stopped
    first), the turn's steps and the rules the fake model answered."""
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
    _, stderr = proc.communicate(timeout=10)
    steps = h.cli("show", turn_id)
    rules = [r.get("rule") for r in h.requests()]
    return f"worker stderr:\n{stderr[-4000:]}\nsteps:\n{steps.stdout}\nmodel rules: {rules}"


def run_point(
    harness: Iterator[Harness],
    args: Callable[[Harness], list[str]],
    point: Point,
    cli: Cli,
    where: str,
) -> None:
    """:func:`kill_and_resume` in the harness, and its row reported."""
    for h in harness:
        report(kill_and_resume(h, args(h), point, cli, where))
