"""A zombie holder and a check that says *absent* (issue 18's acceptance): the worker
running a checked ``never`` call is SIGSTOPped past its lease; another worker takes the
turn over, asks the check, which finds nothing landed yet, and must not run the call again
(the paused holder may still complete it): the step is *possibly ran*. When the zombie
wakes, its call completes once and its outcome is fenced out. On the local World (the
holder's pid is alive, only stopped) and on PostgreSQL (its connection is open)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres_server import PostgresServer
from support import FIXTURES, Harness, make_harness, wait_for

ZOMBIE_TOOLS = f"{FIXTURES / 'zombie_tools.py'}:TOOLS"


@pytest.fixture(params=["local", "postgres"])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    for harness in make_harness(tmp_path, FIXTURES / "zombie.toml", lease="1"):
        harness.env["CHARGE_RUNS"] = str(tmp_path / "runs.txt")
        harness.env["CHARGE_LEDGER"] = str(tmp_path / "ledger.txt")
        harness.env["CHARGE_SECONDS"] = "4"
        if request.param == "local":
            yield harness
            return
        server: PostgresServer = request.getfixturevalue("postgres")
        with server.database() as url:
            harness.use_postgres(url)
            yield harness


def lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines() if Path(path).exists() else []


def test_a_zombie_holders_absent_call_is_not_run_again(h: Harness) -> None:
    zombie = h.popen("run", "--tools", ZOMBIE_TOOLS, "charge order 7")
    assert zombie.stdout is not None
    turn_id = ""
    try:
        zombie.stdout.readline()  # session …
        turn_id = zombie.stdout.readline().split()[1]
        wait_for(lambda: lines(h.env["CHARGE_RUNS"]), timeout=60, what="the charge to start")
        os.killpg(zombie.pid, signal.SIGSTOP)  # paused inside the call, before it lands
        time.sleep(1.5)  # past its 1 s lease, which it can no longer renew

        resumed = h.cli("resume", turn_id)
        assert resumed.returncode == 0, resumed.stderr
        show = h.show(turn_id)
        (step,) = [s for s in show["steps"] if s["name"] == "charge"]
        # The check found nothing landed; the call was not run again: possibly ran.
        assert (step["status"], step["settled"], step["attempts"]) == (
            "possibly_ran",
            "absent",
            1,
        ), show
        assert show["turn"]["status"] == "done"
        assert show["turn"]["result"] == "Order 7 is taken care of."
        assert len(lines(h.env["CHARGE_RUNS"])) == 1
        assert lines(h.env["CHARGE_LEDGER"]) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(zombie.pid, signal.SIGCONT)
    # The zombie wakes: its call lands once, its outcome is fenced out (the turn is done).
    zombie.communicate(timeout=60)
    assert len(lines(h.env["CHARGE_LEDGER"])) == 1
    assert len(lines(h.env["CHARGE_RUNS"])) == 1
    after = h.show(turn_id)
    (step,) = [s for s in after["steps"] if s["name"] == "charge"]
    assert step["status"] == "possibly_ran" and after["turn"]["status"] == "done"
