"""Death detection beyond the contract suite: a reused pid on the local World, and a
PostgreSQL worker whose connection is cut while it lives (it fences itself first)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from postgres_server import PostgresServer

from durable_harness.core.errors import LeaseLost
from durable_harness.core.types import Lease, TurnStatus
from durable_harness.core.world import World
from durable_harness.harness.cancel import Cancellation
from durable_harness.harness.lease import LeaseKeeper
from durable_harness.worlds.local import LocalWorld, holder
from durable_harness.worlds.postgres import PostgresWorld

LEASE = 30.0


def running(world: World, turn_id: str = "t1") -> Lease:
    world.create_session("s1")
    world.create_turn("s1", turn_id, "hi", {})
    lease = world.claim("w1", LEASE)
    assert lease is not None
    return lease


# -- local: pid + start time + boot id ---------------------------------------------------
@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalWorld]:
    with LocalWorld(tmp_path / "world") as world:
        yield world


def fake_holder(world: LocalWorld, value: str | None) -> None:
    with world._db.transaction(write=True) as conn:
        conn.execute("UPDATE turns SET holder = ? WHERE turn_id = 't1'", (value,))


def start_time(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return int(raw[raw.rindex(b")") + 2 :].split()[19])


def test_a_claim_records_this_process_as_holder(local: LocalWorld) -> None:
    running(local)
    with local._db.transaction(write=False) as conn:
        recorded = conn.execute("SELECT holder FROM turns").fetchone()[0]
    boot = holder._boot_id()
    assert recorded == f"{boot}:{os.getpid()}:{start_time(os.getpid())}"
    assert not holder.is_dead(recorded)
    assert local.claim("w2", LEASE) is None  # alive: its lease stands


def test_a_reused_pid_is_not_mistaken_for_the_holder(local: LocalWorld) -> None:
    """The record names a pid that is alive now, but with another start time: the holder
    died and its pid went to another process. That is a dead holder."""
    lease = running(local)
    boot = holder._boot_id()
    fake_holder(local, f"{boot}:{os.getpid()}:{start_time(os.getpid()) + 1}")
    taken = local.claim("w2", LEASE)
    assert taken is not None and taken.epoch == lease.epoch + 1


def test_a_live_unrelated_pid_with_its_own_start_time_is_alive(local: LocalWorld) -> None:
    """A record whose pid and start time match a live process (pid 1 here) is that
    process: its lease stands, whoever it is."""
    running(local)
    boot = holder._boot_id()
    fake_holder(local, f"{boot}:1:{start_time(1)}")
    assert local.claim("w2", LEASE) is None
    assert local.claim_turn("t1", "w2", LEASE) is None


def test_a_holder_of_another_host_or_boot_is_not_judged(local: LocalWorld) -> None:
    running(local)
    fake_holder(local, "00000000-0000-0000-0000-000000000000:999999999:1")
    assert local.claim("w2", LEASE) is None
    fake_holder(local, None)  # a claim made off Linux, or by an older version
    assert local.claim("w2", LEASE) is None


def test_a_gone_pid_is_dead(local: LocalWorld) -> None:
    lease = running(local)
    boot = holder._boot_id()
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    free = next(p for p in range(pid_max - 1, 1, -1) if not Path(f"/proc/{p}").exists())
    fake_holder(local, f"{boot}:{free}:1")
    taken = local.claim_turn("t1", "w2", LEASE)
    assert taken is not None and taken.epoch == lease.epoch + 1


# -- PostgreSQL: the connection a claim is tied to --------------------------------------
@pytest.fixture
def pg_url(postgres: PostgresServer) -> Iterator[str]:
    with postgres.database() as url:
        yield url


def holder_pid(conn: psycopg.Connection[Any], world: PostgresWorld) -> int:
    """The backend pid of the session holding ``world``'s claim lock."""
    row = conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND ((classid::bigint << 32) | objid::bigint) = %s",
        (world._holder.key(),),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_terminated_backend_is_taken_back_and_the_turn_goes_on(pg_url: str) -> None:
    """``pg_terminate_backend`` of the claim connection while the server is up: the
    worker takes its lock back within milliseconds and keeps its turn (as after a server
    restart); if another worker cut the lease in that gap, the worker is fenced first."""
    with PostgresWorld(pg_url) as a, PostgresWorld(pg_url) as b:
        lease = running(a)
        cancel = Cancellation()
        stopped: list[float] = []
        cancel.add_stopper(lambda why: stopped.append(time.monotonic()))
        with (
            LeaseKeeper(a, lease, 3.0, cancel=cancel) as keeper,
            psycopg.connect(pg_url, autocommit=True) as conn,
        ):
            old = holder_pid(conn, a)
            conn.execute("SELECT pg_terminate_backend(%s)", (old,))
            taken = None
            until = time.monotonic() + 4.0  # past the lease: renewals went on
            while taken is None and time.monotonic() < until:
                taken = b.claim("w2", LEASE)
                time.sleep(0.02)
            if taken is not None:  # B cut the lease in the gap: A was stopped first
                assert stopped and stopped[0] < time.monotonic() and cancel.fenced
            else:
                assert stopped == [] and not keeper.lost.is_set()
                assert holder_pid(conn, a) != old  # the same key, on a new session
                a.renew(keeper.lease, LEASE)


def test_a_worker_that_cannot_take_its_lock_back_stops_before_the_takeover(
    pg_url: str,
) -> None:
    """The claim connection is terminated and the lock is not to be had back (here the
    test's own session takes it first): the worker fences its turn; once the lock is free,
    another worker takes the turn over, after the worker stopped and before its lease
    would have ended."""
    with PostgresWorld(pg_url) as a, PostgresWorld(pg_url) as b:
        lease = running(a)
        cancel = Cancellation()
        stopped: list[float] = []
        cancel.add_stopper(lambda why: stopped.append(time.monotonic()))
        with (
            LeaseKeeper(a, lease, LEASE, cancel=cancel) as keeper,
            psycopg.connect(pg_url, autocommit=True) as conn,
        ):
            assert b.claim("w2", LEASE) is None  # A lives: its lease stands
            key = a._holder.key()
            conn.execute("SELECT pg_terminate_backend(%s)", (holder_pid(conn, a),))
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))  # queued before A's try
            cut = time.monotonic()
            while not stopped:
                assert time.monotonic() - cut < 5.0, "A never stopped its turn"
                time.sleep(0.01)
            assert b.claim("w2", LEASE) is None  # the lock is held: nobody cuts the lease
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            taken = None
            while taken is None:
                assert time.monotonic() - cut < 10.0, "nobody took the turn over"
                taken = b.claim("w2", LEASE)
                time.sleep(0.01)
            claimed_at = time.monotonic()
            assert stopped[0] < claimed_at and cancel.fenced
            with pytest.raises(LeaseLost):
                keeper.check()
        assert taken.epoch == lease.epoch + 1
        assert claimed_at - cut < LEASE / 3  # well before the lease would have ended
        with pytest.raises(LeaseLost):
            a.renew(lease, LEASE)
        # A's next claims are tied to a new connection, with a new key.
        assert a._holder.key() != key
        a.create_turn("s1", "t2", "next", {})
        again = a.claim("w1", LEASE)
        assert again is not None and again.turn_id == "t2"
        assert b.claim("w2", LEASE) is None


def test_a_live_holder_connection_keeps_the_lease(pg_url: str) -> None:
    """Renewals keep going and nothing is cut short while the holder's session lives,
    even with other workers claiming all the time."""
    with PostgresWorld(pg_url) as a, PostgresWorld(pg_url) as b:
        lease = running(a)
        with LeaseKeeper(a, lease, 2.0) as keeper:
            until = time.monotonic() + 3.0
            while time.monotonic() < until:
                assert b.claim("w2", 2.0) is None
                time.sleep(0.05)
            keeper.check()
        assert b.get_turn("t1").status == TurnStatus.RUNNING


# -- any World: a keeper that cannot renew fences its turn before the lease ends --------
def test_a_keeper_that_cannot_renew_stops_the_turn_before_its_lease_ends(
    tmp_path: Path,
) -> None:
    """The World becomes unreachable from this worker (here: its client is closed, so
    every renewal fails): the keeper stops the agent before the lease the World last
    granted runs out, i.e. before any other worker may claim the turn."""
    lease_seconds = 6.0  # its fence margin (a twentieth) outlasts a loaded machine's pauses
    with LocalWorld(tmp_path / "world") as other:
        a = LocalWorld(tmp_path / "world")
        lease = running(a)
        lease = a.renew(lease, lease_seconds)
        cancel = Cancellation()
        stopped: list[float] = []
        cancel.add_stopper(lambda why: stopped.append(time.time()))
        with LeaseKeeper(a, lease, lease_seconds, cancel=cancel) as keeper:
            time.sleep(lease_seconds / 2)  # one renewal went through
            a.close()  # from now on every renewal fails
            granted = keeper.lease.expires_at  # the last lease the World granted
            deadline = time.monotonic() + 3 * lease_seconds
            while not stopped:
                assert time.monotonic() < deadline, "the keeper never fenced the turn"
                time.sleep(0.01)
            assert cancel.fenced and keeper.lost.is_set()
            assert stopped[0] < granted  # stopped while the lease still stood
            while other.claim("w2", LEASE) is None:  # then it runs out, and is taken
                assert time.monotonic() < deadline + LEASE
                time.sleep(0.05)
            assert other.get_turn("t1").lease_owner == "w2"
