"""Leases between real worker processes: fencing of a paused worker, redelivery after a
SIGKILL, and `worker --until-idle`."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import FIXTURES, Harness, ids_of, make_harness, wait_for

SLOW_TOOLS = f"{FIXTURES / 'slow_tools.py'}:TOOLS"


@pytest.fixture
def slow(tmp_path: Path) -> Iterator[Harness]:
    for h in make_harness(tmp_path, FIXTURES / "slow.toml", lease="2"):
        h.env["SLOW_TOOL_RUNS"] = str(tmp_path / "runs.txt")
        yield h


def runs(h: Harness) -> list[str]:
    path = Path(h.env["SLOW_TOOL_RUNS"])
    return path.read_text().splitlines() if path.exists() else []


def first_turn(h: Harness) -> str:
    out = h.cli("ls", "--json")
    import json

    turns = json.loads(out.stdout)
    assert turns, out.stderr
    return str(turns[0]["turn_id"])


def test_paused_worker_is_fenced_out(slow: Harness) -> None:
    """Lease 2 s, a tool that sleeps 5 s, worker A paused past its lease: worker B takes
    the turn over; A's late writes are rejected; the turn completes once."""
    a = slow.popen("run", "--tools", SLOW_TOOLS, "look up everything")
    wait_for(lambda: any(line.startswith("start") for line in runs(slow)), 30, "a start")
    os.killpg(a.pid, signal.SIGSTOP)  # a GC pause, a frozen VM: renewals stop too
    time.sleep(2.5)  # the lease runs out
    b = slow.popen("worker", "--until-idle")
    wait_for(lambda: sum(line.startswith("start") for line in runs(slow)) == 2, 30, "two starts")
    os.killpg(a.pid, signal.SIGCONT)  # A wakes up and finishes its tool call, too late
    _, a_err = a.communicate(timeout=60)
    _, b_err = b.communicate(timeout=60)
    assert b.returncode == 0, b_err
    assert "lease lost" in a_err, a_err
    turn_id = first_turn(slow)
    data = slow.show(turn_id)
    assert data["turn"]["status"] == "done"
    assert data["turn"]["result"] == "The answer is 42."
    assert data["turn"]["deliveries"] == 2
    tool_step = data["steps"][1]
    assert tool_step["name"] == "slow_lookup" and tool_step["attempts"] == 2
    assert tool_step["recorded_by_delivery"] == 2  # B's outcome; A's write was refused
    # A finished its run of the tool, but its outcome was never recorded, and A made no
    # model call after it: the final model call happened once, by B.
    assert sum(line.startswith("end") for line in runs(slow)) == 2
    assert slow.server.request_count == 2
    assert slow.repeated_requests() == {}


def test_sigkilled_worker_turn_finished_by_another(slow: Harness) -> None:
    a = slow.popen("run", "--tools", SLOW_TOOLS, "look up everything")
    wait_for(lambda: any(line.startswith("start") for line in runs(slow)), 30, "a start")
    os.killpg(a.pid, signal.SIGKILL)
    a.communicate(timeout=10)
    killed_at = time.monotonic()
    b = slow.cli("worker", "--until-idle")
    assert b.returncode == 0, b.stderr
    assert time.monotonic() - killed_at >= 1.0  # it waited for the lease to run out
    data = slow.show(first_turn(slow))
    assert data["turn"]["status"] == "done"
    assert data["turn"]["result"] == "The answer is 42."
    assert data["turn"]["deliveries"] == 2
    assert [s["how"] for s in data["steps"]] == ["replayed", "live", "live"]
    assert slow.repeated_requests() == {}


def test_detach_then_worker(slow: Harness) -> None:
    out = slow.cli(
        "run", "--detach", "--tools", SLOW_TOOLS, "look up everything", SLOW_TOOL_SECONDS="0"
    )
    assert out.returncode == 0, out.stderr
    turn_id = ids_of(out)["turn"]
    assert slow.show(turn_id)["turn"]["status"] == "queued"
    w = slow.cli("worker", "--until-idle", SLOW_TOOL_SECONDS="0")
    assert w.returncode == 0, w.stderr
    assert slow.show(turn_id)["turn"]["result"] == "The answer is 42."


def test_resume_force_fences_live_holder(slow: Harness) -> None:
    a = slow.popen(
        "run", "--tools", SLOW_TOOLS, "look up everything", DURABLE_HARNESS_LEASE_SECONDS="60"
    )
    wait_for(lambda: any(line.startswith("start") for line in runs(slow)), 30, "a start")
    turn_id = first_turn(slow)
    r = slow.cli("resume", turn_id, "--force", SLOW_TOOL_SECONDS="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "The answer is 42."
    _, a_err = a.communicate(timeout=60)
    assert "lease lost" in a_err
    assert slow.show(turn_id)["turn"]["deliveries"] == 2
