"""The PostgreSQL World's queue, leases and durable waits: the ``jobs`` table, ``NOTIFY``.

Every claim records this process's holder key and first cuts short the leases of holders
that are gone (``holder.py``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import psycopg

from durable_harness.core.errors import (
    NotFound,
)
from durable_harness.core.types import Lease, TurnStatus
from durable_harness.core.world import Queue, Signal, delivery_key
from durable_harness.worlds.postgres import connections as db
from durable_harness.worlds.postgres import schema, sql
from durable_harness.worlds.postgres.connections import PostgresConnections
from durable_harness.worlds.postgres.holder import GRACE_SECONDS, HOLDER_POLL_SECONDS, Holder
from durable_harness.worlds.postgres.sql import Row

CHANNEL = schema.CHANNEL
#: The shortest wait for a job that is due: it is visible but was locked a moment ago.
MIN_WAIT_SECONDS = 0.02


class PostgresQueue(PostgresConnections, Queue):
    """The :class:`Queue` facet of :class:`~durable_harness.worlds.postgres.PostgresWorld`."""

    max_attempts: int
    _holder: Holder
    detects_dead_holders = True
    #: The holder key each lease this process holds was claimed with: (turn, epoch) -> key.
    _claimed_with: dict[tuple[str, int], int]

    def on_holder_lost(self, lease: Lease, callback: Callable[[str], None]) -> Callable[[], None]:
        key = self._claimed_with.pop((lease.turn_id, lease.epoch), None)
        if key is None:
            return lambda: None  # not claimed by this process (a test's hand-made lease)
        return self._holder.on_lost(key, (lease.turn_id, lease.epoch), callback)

    def _leased(self, lease: Lease | None, key: int) -> Lease | None:
        if lease is not None:
            claimed = self._claimed_with
            claimed[(lease.turn_id, lease.epoch)] = key
            while len(claimed) > 1000:  # leases never watched (parked at once): oldest go
                del claimed[next(iter(claimed))]
        return lease

    def enqueue(self, turn_id: str, delay: float = 0.0) -> None:
        params = {"turn_id": turn_id, "delay": float(delay)}

        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            if db.one_row(conn, sql.ENQUEUE_QUEUED, params) is not None:
                return
            # Enqueueing a failed turn is a manual retry: a new job, a fresh delivery budget.
            if db.one_row(conn, sql.ENQUEUE_FAILED, params) is not None:
                return
            # running: the lease holder has the message; done: nothing is left to deliver.
            if db.one_row(conn, sql.GET_TURN, (turn_id,)) is None:
                raise NotFound(f"no turn {turn_id!r}")

        self._run("enqueue", op)

    def claim(self, owner: str, lease_seconds: float) -> Lease | None:
        key = self._holder.key()
        params = {
            "owner": owner,
            "lease": float(lease_seconds),
            "max": self.max_attempts,
            "holder": key,
        }

        # A claim lost with its connection is not retried as such: its lease simply runs
        # out, the attempt it counted is spent, and the turn is delivered again.
        def op(conn: psycopg.Connection[Any], retried: bool) -> Lease | None:
            pull_in_dead(conn)
            while True:
                row = db.one_row(conn, sql.CLAIM, params)
                if row is None:
                    return None
                if row["epoch"] is not None:
                    return sql.lease_of(row, owner)
                self._dead_letter(conn, row["turn_id"], force=False)

        return self._leased(self._run("claim", op), key)

    def claim_turn(
        self, turn_id: str, owner: str, lease_seconds: float, force: bool = False
    ) -> Lease | None:
        key = self._holder.key()
        params = {
            "turn_id": turn_id,
            "owner": owner,
            "lease": float(lease_seconds),
            "max": self.max_attempts,
            "force": force,
            "holder": key,
        }

        def op(conn: psycopg.Connection[Any], retried: bool) -> Lease | None:
            pull_in_dead(conn)
            row = db.one_row(conn, sql.CLAIM_TURN, params)
            if row is not None:
                return sql.lease_of(row, owner)
            if self._dead_letter(conn, turn_id, force=force):
                return None
            if db.one_row(conn, sql.GET_TURN, (turn_id,)) is None:
                raise NotFound(f"no turn {turn_id!r}")
            return None  # finished, held by a live lease, or not visible yet

        return self._leased(self._run("claim_turn", op), key)

    def _dead_letter(self, conn: psycopg.Connection[Any], turn_id: str, force: bool) -> bool:
        """Fail a deliverable turn that used up its deliveries; the epoch moves on too, so
        a zombie still holding its expired lease is fenced out. Idempotent."""
        params = {"turn_id": turn_id, "max": self.max_attempts, "force": force}
        return db.one_row(conn, sql.DEAD_LETTER, params) is not None

    def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        params = {"turn_id": lease.turn_id, "epoch": lease.epoch, "lease": float(lease_seconds)}

        def op(conn: psycopg.Connection[Any], retried: bool) -> Lease:
            row = db.one_row(conn, sql.RENEW, params)
            if row is None:
                raise self._fence_error(conn, lease.turn_id, lease.epoch)
            return dataclasses.replace(lease, expires_at=float(row["lease_expires_at"]))

        return self._run("renew", op)

    def release(self, lease: Lease, delay: float = 0.0, error: str | None = None) -> None:
        params = {
            "turn_id": lease.turn_id,
            "epoch": lease.epoch,
            "delay": float(delay),
            "error": error,
        }

        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            if db.one_row(conn, sql.RELEASE, params) is not None:
                return
            self._unless_committed(conn, lease, retried, "queued")

        self._run("release", op)

    def end_turn(
        self, lease: Lease, status: TurnStatus, result: str | None, error: str | None
    ) -> None:
        params = {
            "turn_id": lease.turn_id,
            "epoch": lease.epoch,
            "status": status.value,
            # A text column cannot hold NUL (a model may answer "\u0000"): U+FFFD instead.
            "result": None if result is None else result.replace("\x00", "\ufffd"),
            "error": None if error is None else error.replace("\x00", "\ufffd"),
        }

        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            if db.one_row(conn, sql.FINISH_TURN, params) is not None:
                return
            self._unless_committed(conn, lease, retried, status.value)

        self._run(f"{status.value} turn", op)

    # -- durable waits -------------------------------------------------------------------
    def now(self) -> float:
        row = self._run("now", lambda c, _: db.one_row(c, sql.NOW))
        assert row is not None
        return float(row["now"])

    def suspend(
        self,
        lease: Lease,
        wake_at: float,
        waiting_for: str,
        signal: str | None = None,
        seen: int = 0,
    ) -> None:
        params = {
            "turn_id": lease.turn_id,
            "waiting_for": waiting_for,
            "signal": signal,
            "seen": seen,
            "wake_at": float(wake_at),
        }

        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            with conn.transaction():
                if db.one_row(conn, sql.LOCK_RUNNING_JOB, (lease.turn_id, lease.epoch)) is not None:
                    db.one_row(conn, sql.SUSPEND, params)
                    return
            self._unless_committed(conn, lease, retried, "waiting")

        self._run("suspend", op)

    def _unless_committed(
        self, conn: psycopg.Connection[Any], lease: Lease, retried: bool, status: str
    ) -> None:
        """A fenced write with ``lease`` matched no row: return if this is a retry whose
        first try committed (the turn stands in ``status`` at the lease's epoch: our write
        committed before the connection died), else raise why the fence refused it."""
        turn = db.one_row(conn, sql.GET_TURN, (lease.turn_id,))
        if retried and turn is not None and _is(turn, status, lease.epoch):
            return
        raise self._fence_error(conn, lease.turn_id, lease.epoch)

    def send_signal(
        self, turn_id: str, name: str, payload: str, delivery_id: str | None = None
    ) -> bool:
        delivery = delivery_key(payload, delivery_id)
        params = {"turn_id": turn_id, "name": name, "delivery_id": delivery, "payload": payload}

        def op(conn: psycopg.Connection[Any], retried: bool) -> bool:
            with conn.transaction():
                if db.one_row(conn, sql.GET_TURN, (turn_id,)) is None:
                    raise NotFound(f"no turn {turn_id!r}")
                db.one_row(conn, sql.LOCK_JOB, (turn_id,))  # none once the turn ended
                db.one_row(conn, sql.LOCK_TURN, (turn_id,))  # one insert at a time: idx
                if db.one_row(conn, sql.INSERT_SIGNAL, params) is None:
                    # A duplicate, unless it is our own insert whose reply was lost.
                    row = db.one_row(conn, sql.GET_DELIVERY, (turn_id, name, delivery))
                    return bool(retried and row is not None and row["payload"] == payload)
                db.one_row(conn, sql.WAKE, (turn_id,))
                return True

        return self._run("send_signal", op)

    def list_signals(self, turn_id: str, name: str) -> list[Signal]:
        rows = self._run(
            "list_signals", lambda c, _: db.all_rows(c, sql.LIST_SIGNALS, (turn_id, name))
        )
        return [
            Signal(int(r["idx"]), str(r["payload"]), str(r["delivery_id"]), r["claimed_by"])
            for r in rows
        ]

    def claim_signal(self, turn_id: str, name: str, index: int, seq: int) -> bool:
        params = {"turn_id": turn_id, "name": name, "idx": index, "seq": seq}
        row = self._run("claim_signal", lambda c, _: db.one_row(c, sql.CLAIM_SIGNAL, params))
        return row is not None and row["claimed_by"] == seq

    def watch(self, scope: str, ref: str, turn_id: str, name: str) -> None:
        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            if db.one_row(conn, sql.GET_TURN, (turn_id,)) is None:
                raise NotFound(f"no turn {turn_id!r}")
            conn.execute(sql.INSERT_WATCH, (scope, turn_id, name, ref))

        self._run("watch", op)

    def watchers(self, scope: str, ref: str) -> list[tuple[str, str]]:
        rows = self._run("watchers", lambda c, _: db.all_rows(c, sql.LIST_WATCHERS, (scope, ref)))
        return [(str(r["turn_id"]), str(r["name"])) for r in rows]

    def wait_for_work(self, timeout: float) -> None:
        """Return when a turn was created, enqueued or released (``NOTIFY``), when the
        next delayed job or expiring lease becomes deliverable, or after ``timeout``.

        The first call only starts listening and returns at once, so that the caller
        looks at the queue again: a notification sent before ``LISTEN`` would be lost.
        """
        mine = self._holder.current()  # no need to watch for our own death
        self._work_listener.wait(timeout, lambda conn: _next_visible(conn, mine))


def pull_in_dead(conn: psycopg.Connection[Any]) -> None:
    """Cut the leases of holders that are gone to the grace period (``holder.py``)."""
    conn.execute(sql.PULL_IN_DEAD, {"grace": GRACE_SECONDS})


def _next_visible(conn: psycopg.Connection[Any], mine: int | None) -> float | None:
    """Seconds until the next job is deliverable: nothing notifies when a lease runs out,
    so the wait ends with it (a dead worker's turn is redelivered at its lease's end, not
    at the next poll), nor when a holder dies, so while a turn runs the wait is at most
    ``HOLDER_POLL_SECONDS`` and each one first cuts short dead holders' leases (a turn
    held by this process, holder key ``mine``, needs no watching). The floor
    keeps a job that is visible but locked from causing a spin."""
    pull_in_dead(conn)
    others = conn.execute(sql.OTHERS_RUNNING, {"mine": mine}).fetchone()
    row = conn.execute(sql.NEXT_VISIBLE).fetchone()
    if row is None or row[0] is None:
        return None
    until = float(row[0])
    if others is not None and others[0]:
        until = min(until, HOLDER_POLL_SECONDS)
    return max(until, MIN_WAIT_SECONDS)


def _is(turn: Row, status: str, epoch: int) -> bool:
    return bool(turn["status"] == status and turn["epoch"] == epoch)
