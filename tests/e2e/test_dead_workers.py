"""A dead or stopping worker's turn, taken over by another worker process at once: SIGKILL
(local and PostgreSQL detect the death: no waiting for the 30 s lease) and SIGTERM (a
deploy: the step in flight finishes, the turn is handed back, nothing lost or repeated)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from postgres_server import PostgresServer, wait_until
from support import DEMO_REPLY, DEMO_TOOLS, FIXTURES, Harness, make_harness

from durable_harness.core.types import TurnStatus
from durable_harness.core.world import World
from durable_harness.worlds.local import LocalWorld
from durable_harness.worlds.postgres import PostgresWorld

SLOW_TOOLS = f"{FIXTURES / 'slow_tools.py'}:TOOLS"
LEASE = 30.0


@pytest.fixture(params=["local", "postgres"])
def on_world(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[Path], AbstractContextManager[Harness]]]:
    """``harness(script)``: a harness (30 s lease) on the local World or on a fresh
    PostgreSQL database."""

    @contextmanager
    def harness(script: Path) -> Iterator[Harness]:
        for h in make_harness(tmp_path, script, lease=str(LEASE)):
            h.env["SLOW_TOOL_RUNS"] = str(tmp_path / "runs.txt")
            if request.param == "local":
                yield h
                return
            server: PostgresServer = request.getfixturevalue("postgres")
            with server.database() as url:
                h.use_postgres(url)
                yield h

    yield harness


def world_of(h: Harness) -> World:
    if h.env["DURABLE_HARNESS_WORLD"] == "postgres":
        return PostgresWorld(h.env["DURABLE_HARNESS_POSTGRES_URL"])
    return LocalWorld(Path(h.env["DURABLE_HARNESS_DATA_DIR"]))


def runs(h: Harness) -> list[str]:
    path = Path(h.env["SLOW_TOOL_RUNS"])
    return path.read_text().splitlines() if path.exists() else []


def enqueue(h: Harness, *args: str) -> None:
    out = h.cli("run", "--detach", *args)
    assert out.returncode == 0, out.stderr


def _only_turn(h: Harness) -> str:
    with world_of(h) as world:
        (turn,) = world.list_turns()
        return turn.turn_id


def stop_all(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)


def test_a_sigkilled_workers_turn_is_taken_over_long_before_its_lease(
    on_world: Callable[[Path], AbstractContextManager[Harness]],
) -> None:
    with on_world(FIXTURES / "slow.toml") as h:
        enqueue(h, "--tools", SLOW_TOOLS, "look up everything")
        turn_id = _only_turn(h)
        a = h.popen("worker", SLOW_TOOL_SECONDS="30")
        b = None
        try:
            wait_until(lambda: any(line.startswith("start") for line in runs(h)), timeout=60)
            b = h.popen("worker", SLOW_TOOL_SECONDS="0.2")
            with world_of(h) as world:
                first = world.get_turn(turn_id)
                time.sleep(1.0)  # B is up and idle
                os.killpg(a.pid, signal.SIGKILL)
                killed = time.monotonic()
                wait_until(lambda: world.get_turn(turn_id).epoch > first.epoch, interval=0.01)
                took = time.monotonic() - killed
                wait_until(lambda: world.get_turn(turn_id).status is TurnStatus.DONE, timeout=60)
        finally:
            stop_all(a, *([b] if b is not None else []))
        print(f"SIGKILL to the turn held by another worker: {took:.2f} s (lease {LEASE:.0f} s)")
        assert took < LEASE / 3, took  # taken over, not waited out
        data = h.show(turn_id)
        assert data["turn"]["result"] == "The answer is 42."
        assert data["turn"]["deliveries"] == 2
        assert h.repeated_requests() == {}


def test_sigterm_hands_the_turn_over_with_nothing_lost_or_repeated(
    on_world: Callable[[Path], AbstractContextManager[Harness]],
) -> None:
    """SIGTERM to worker A while a model call is in flight (the one after the `never`
    refund): A lets it finish, records it, hands the turn back and exits 0; idle worker B
    finishes it: no model call made twice, the refund made once, the scripted reply."""
    with on_world(FIXTURES / "handover.toml") as h:
        enqueue(h, "--tools", DEMO_TOOLS, "Refund order 42, then note it.")
        turn_id = _only_turn(h)
        a = h.popen("worker")
        b = None
        try:
            wait_until(lambda: h.server.request_count >= 3, timeout=60)  # the slow one
            assert h.ledger_lines() != []  # the refund ran
            b = h.popen("worker")
            time.sleep(0.5)
            a.send_signal(signal.SIGTERM)
            termed = time.monotonic()
            _, a_err = a.communicate(timeout=60)
            a_exited = time.monotonic() - termed
            with world_of(h) as world:
                wait_until(lambda: world.get_turn(turn_id).status is TurnStatus.DONE, timeout=60)
                handed_over = time.monotonic() - termed
        finally:
            stop_all(*([b] if b is not None else []))
        assert a.returncode == 0, a_err
        assert "handed back" in a_err, a_err
        print(f"SIGTERM: A exited after {a_exited:.2f} s, turn done after {handed_over:.2f} s")
        assert handed_over < LEASE  # nobody waited for A's lease
        data = h.show(turn_id)
        assert data["turn"]["result"] == DEMO_REPLY
        assert data["turn"]["deliveries"] == 2
        assert h.repeated_requests() == {}  # model calls repeated: 0
        assert len([line for line in h.ledger_lines() if "refund" in line]) == 1
        # A's last model call, in flight at the SIGTERM, is B's replayed step.
        hows = [s["how"] for s in data["steps"]]
        assert hows[:5] == ["replayed"] * 5 and "live" in hows[5:], hows


def test_sigterm_to_run_hands_its_turn_back_for_resume(
    on_world: Callable[[Path], AbstractContextManager[Harness]],
) -> None:
    """`run` drives its turn as a worker does, and SIGTERM stops it the same way: the
    model call in flight finishes and is recorded, the turn is handed back at once (no
    30 s lease to wait out), `run` exits 1 saying how to finish it, and `resume` does:
    no model call twice, the refund once, the scripted reply."""
    with on_world(FIXTURES / "handover.toml") as h:
        run = h.popen("run", "--tools", DEMO_TOOLS, "Refund order 42, then note it.")
        try:
            wait_until(lambda: h.server.request_count >= 3, timeout=60)  # the slow one
            assert h.ledger_lines() != []  # the refund ran
            run.send_signal(signal.SIGTERM)
            out, err = run.communicate(timeout=60)
        finally:
            stop_all(run)
        assert run.returncode == 1, err
        assert "handed back" in err and "resume" in err, err
        turn_id = out.splitlines()[1].split()[1]
        started = time.monotonic()
        resumed = h.cli("resume", turn_id)
        assert resumed.returncode == 0, resumed.stderr
        assert time.monotonic() - started < LEASE  # not its lease: handed back
        data = h.show(turn_id)
        assert data["turn"]["result"] == DEMO_REPLY
        assert data["turn"]["deliveries"] == 2
        assert h.repeated_requests() == {}
        assert len([line for line in h.ledger_lines() if "refund" in line]) == 1
