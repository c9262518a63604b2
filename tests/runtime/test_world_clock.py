"""Timers run by the World's clock: a worker whose clock is minutes off still wakes a
timer wait on time, on the Postgres World (whose clock is the database's ``now()``).

The worker's clock is faked in this process (``time.time`` shifted by 5 minutes either
way); PostgreSQL keeps the real time. A wait stamped and checked with the worker's own
clock would wake 5 minutes late (clock ahead) or spin, waking at once every time, for
as long as the timer runs (clock behind).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from durable_harness.core.errors import TurnSuspended
from durable_harness.core.keys import tool_key
from durable_harness.core.types import Lease
from durable_harness.harness.journal import Journal, StepResult
from durable_harness.harness.tools import ToolContext
from durable_harness.harness.waits import wait_tools
from durable_harness.worlds.postgres import PostgresWorld

if TYPE_CHECKING:
    from postgres_server import PostgresServer

REAL = time.time
TIMER = 2.0


@pytest.fixture
def world(postgres: PostgresServer) -> Iterator[PostgresWorld]:
    with postgres.database() as url, PostgresWorld(url) as world:
        world.create_session("s")
        world.create_turn("s", "t", "prompt", {})
        yield world


def sleep_step(world: PostgresWorld) -> tuple[Lease, str | TurnSuspended]:
    """Claim the turn and run its timer wait once: the lease, and the result or the
    wait's TurnSuspended."""
    lease = world.claim("w", 30)
    assert lease is not None
    journal = Journal(world, lease)
    [_, sleep_until] = wait_tools(world, journal)
    args = {"seconds": TIMER}
    begun = journal.begin_keyed(
        kind="tool", name="sleep_until", key=tool_key("call-1"), input=args, replay="safe"
    )
    assert not isinstance(begun, StepResult)
    try:
        return lease, str(sleep_until.invoke(args, ToolContext("t", "s", begun.step.seq)))
    except TurnSuspended as exc:
        return lease, exc


@pytest.mark.parametrize("skew", [300.0, -300.0], ids=["ahead", "behind"])
def test_a_timer_fires_on_time_when_the_worker_clock_is_off(
    world: PostgresWorld, skew: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "time", lambda: REAL() + skew)
    started = REAL()
    lease, wait = sleep_step(world)
    assert isinstance(wait, TurnSuspended)
    # The deadline is in the World's time: TIMER seconds from now, not now + skew.
    assert abs(wait.wake_at - (started + TIMER)) < 1.0
    world.suspend(lease, wait.wake_at, wait.waiting_for)
    assert world.claim("w", 30) is None  # not woken early (a clock behind would)
    while REAL() < started + TIMER + 0.5:
        time.sleep(0.05)
    # Woken on time (a clock ahead would wait 5 minutes more), and the wait is over.
    _, result = sleep_step(world)
    assert isinstance(result, str) and result.startswith(f"waited {TIMER:g} seconds")
