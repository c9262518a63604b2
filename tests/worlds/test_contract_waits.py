"""The World contract for durable waits: suspend, signals, wake-ups.

Runs on every backend in :data:`WAIT_BACKENDS` (a backend joins once it implements the
wait methods of ``worlds/base.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from durable_harness.core.errors import LeaseLost, NotFound
from durable_harness.core.types import Lease, TurnStatus
from durable_harness.core.world import World

if TYPE_CHECKING:
    from conftest import WorldSpec

WAIT_BACKENDS = ["local", "postgres", "s3sqs-moto", "s3sqs-seaweedfs"]
# Narrows conftest's world_spec (all backends) to those that implement waits.
pytestmark = pytest.mark.parametrize("world_spec", WAIT_BACKENDS, indirect=True)


@pytest.fixture
def world(world_spec: WorldSpec) -> Iterator[World]:
    with world_spec.open() as w:
        w.create_session("s")
        w.create_turn("s", "t", "prompt", {})
        yield w


def claim(world: World) -> Lease:
    lease = world.claim("w", 30)
    assert lease is not None and lease.turn_id == "t"
    return lease


def test_suspended_turn_has_no_lease_and_wakes_on_its_timer(world: World) -> None:
    lease = claim(world)
    # 2 s: the three calls before the timer fires take well over 0.4 s on a loaded
    # machine's S3 World (CI once claimed the turn back early, rightly).
    wake = time.time() + 2.0
    world.suspend(lease, wake, "timer")
    turn = world.get_turn("t")
    assert turn.status is TurnStatus.WAITING and turn.waiting_for == "timer"
    assert turn.lease_owner is None
    assert world.claim("w", 30) is None
    time.sleep(max(0.0, wake - time.time()) + 0.1)
    again = claim(world)
    assert again.epoch == lease.epoch + 1
    assert world.get_turn("t").waiting_for is None


def test_suspend_is_fenced(world: World) -> None:
    stale = claim(world)
    world.claim_turn("t", "other", 30, force=True)
    with pytest.raises(LeaseLost):
        world.suspend(stale, time.time() + 60, "timer")


def test_signal_wakes_a_waiting_turn(world: World) -> None:
    world.suspend(claim(world), time.time() + 3600, "signal ci")
    assert world.claim("w", 30) is None
    assert world.send_signal("t", "ci", '{"status": "failed"}') is True
    claim(world)
    assert world.get_signal("t", "ci") == '{"status": "failed"}'


def test_duplicate_delivery_is_ignored(world: World) -> None:
    assert world.send_signal("t", "ci", "first", delivery_id="d1") is True
    assert world.send_signal("t", "ci", "first again", delivery_id="d1") is False
    assert world.send_signal("t", "ci", "same payload, no id") is True
    assert world.send_signal("t", "ci", "same payload, no id") is False
    assert world.get_signal("t", "ci") == "first"
    assert world.get_signal("t", "other") is None
    assert [s.payload for s in world.list_signals("t", "ci")] == [
        "first",
        "same payload, no id",
    ]


def test_signals_of_a_name_queue_up_in_order(world: World) -> None:
    for n in range(3):
        assert world.send_signal("t", "ci", f"run {n}", delivery_id=f"d{n}") is True
    found = world.list_signals("t", "ci")
    assert [(s.index, s.payload, s.delivery_id) for s in found] == [
        (0, "run 0", "d0"),
        (1, "run 1", "d1"),
        (2, "run 2", "d2"),
    ]
    assert all(s.claimed_by is None for s in found)


def test_a_signal_is_claimed_by_one_wait_step_only(world: World) -> None:
    world.send_signal("t", "ci", "run 0")
    assert world.claim_signal("t", "ci", 0, seq=4) is True
    assert world.claim_signal("t", "ci", 0, seq=4) is True  # the same step again: its own
    assert world.claim_signal("t", "ci", 0, seq=9) is False
    assert world.claim_signal("t", "ci", 1, seq=9) is False  # no such signal
    assert [s.claimed_by for s in world.list_signals("t", "ci")] == [4]


def test_suspend_wakes_only_for_a_signal_the_wait_has_not_seen(world: World) -> None:
    world.send_signal("t", "ci", "run 0")
    world.suspend(claim(world), time.time() + 3600, "signal ci", signal="ci", seen=1)
    assert world.claim("w", 30) is None  # the one signal there was seen (e.g. taken)
    world.send_signal("t", "ci", "run 1")
    claim(world)


def test_watches_route_a_repository_ref_to_turns(world: World) -> None:
    world.create_turn("s", "t2", "prompt", {})
    world.watch("github:o/r", "branch:main", "t", "ci")
    world.watch("github:o/r", "branch:main", "t", "ci")  # idempotent
    world.watch("github:o/r", "branch:main", "t2", "build")
    assert world.watchers("github:o/r", "branch:main") == [("t", "ci"), ("t2", "build")]
    assert world.watchers("github:o/r", "branch:dev") == []
    assert world.watchers("github:o/other", "branch:main") == []
    # A new push's watch replaces the turn's last one: the earlier commit reaches nobody.
    world.watch("github:o/r", "sha:aaa", "t", "ci")
    world.watch("github:o/r", "sha:bbb", "t", "ci")
    assert world.watchers("github:o/r", "sha:aaa") == []
    assert world.watchers("github:o/r", "sha:bbb") == [("t", "ci")]
    assert world.watchers("github:o/r", "branch:main") == [("t2", "build")]
    with pytest.raises(NotFound):
        world.watch("github:o/r", "branch:main", "nope", "ci")


def test_signal_before_the_wait_is_kept_and_wakes_the_suspend(world: World) -> None:
    lease = claim(world)
    world.send_signal("t", "ci", "early")  # arrives while the turn still runs
    world.suspend(lease, time.time() + 3600, "signal ci", signal="ci")
    claim(world)  # deliverable at once: the awaited signal is already there


def test_signal_for_an_unknown_turn(world: World) -> None:
    with pytest.raises(NotFound):
        world.send_signal("nope", "ci", "x")


def test_suspends_do_not_count_toward_dead_letter(world: World) -> None:
    world.max_attempts = 2
    for _ in range(4):  # four deliveries, each ending in a deliberate suspend
        world.suspend(claim(world), time.time(), "timer")
    lease = claim(world)
    assert lease.attempt == 5 and world.get_turn("t").status is TurnStatus.RUNNING


def test_enqueue_wakes_a_waiting_turn(world: World) -> None:
    world.suspend(claim(world), time.time() + 3600, "timer")
    world.enqueue("t")
    claim(world)
