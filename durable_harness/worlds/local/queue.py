"""The local World's queue, leases and waits, kept in the turns table.

A turn has a message when ``visible_at`` is not NULL, which makes "one message per turn"
structural. While a worker holds the lease, ``visible_at`` follows ``lease_expires_at``,
as SQS's visibility timeout does. A running turn whose holder (``holder``: the claiming
process, ``holder.py``) is provably dead is deliverable at once, as if its lease had run
out. Every read-modify-write (claim, the fenced writes) runs
in one write transaction, so the check (epoch, lease, visibility) and the write it
guards happen under one write lock and two processes cannot both pass the check.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time

from durable_harness.core.types import FINISHED, Lease, Turn, TurnStatus
from durable_harness.core.world import Queue, Signal, delivery_key
from durable_harness.worlds.local import holder
from durable_harness.worlds.local.db import Database, fence, load_turn, turn_row
from durable_harness.worlds.local.schema import turn_from_row


class LocalQueue(Queue):
    """The :class:`Queue` facet of :class:`~durable_harness.worlds.local.LocalWorld`."""

    _db: Database
    max_attempts: int
    detects_dead_holders = True

    def enqueue(self, turn_id: str, delay: float = 0.0) -> None:
        with self._db.transaction(write=True) as conn:
            turn = load_turn(conn, turn_id)
            visible_at = time.time() + delay
            if turn.status in (TurnStatus.QUEUED, TurnStatus.WAITING):
                conn.execute(
                    "UPDATE turns SET visible_at = ? WHERE turn_id = ?", (visible_at, turn_id)
                )
            elif turn.status == TurnStatus.FAILED:
                # Enqueueing a failed turn is a manual retry: it gets a fresh delivery budget.
                conn.execute(
                    "UPDATE turns SET status = ?, visible_at = ?, attempts = 0,"
                    " finished_at = NULL WHERE turn_id = ?",
                    (TurnStatus.QUEUED, visible_at, turn_id),
                )
            # running: the lease holder has the message; done: nothing is left to deliver.

    def claim(self, owner: str, lease_seconds: float) -> Lease | None:
        with self._db.transaction(write=True) as conn:
            now = time.time()  # read under the write lock: the wait for it may be long
            while True:
                row = (
                    _dead_holders_turn(conn, now)
                    or conn.execute(
                        "SELECT * FROM turns WHERE (status IN (?, ?) AND visible_at <= ?)"
                        " OR (status = ? AND lease_expires_at <= ?)"
                        " ORDER BY created_at, rowid LIMIT 1",
                        (TurnStatus.QUEUED, TurnStatus.WAITING, now, TurnStatus.RUNNING, now),
                    ).fetchone()
                )
                if row is None:
                    return None
                turn = turn_from_row(row)
                if self._exhausted(row):
                    self._dead_letter(conn, turn, now)
                    continue
                return self._take(conn, turn, owner, lease_seconds, now)

    def claim_turn(
        self, turn_id: str, owner: str, lease_seconds: float, force: bool = False
    ) -> Lease | None:
        with self._db.transaction(write=True) as conn:
            now = time.time()
            row = turn_row(conn, turn_id)
            turn = turn_from_row(row)
            if turn.status in FINISHED:
                return None
            visible_at = row["visible_at"]
            deliverable = (
                turn.status in (TurnStatus.QUEUED, TurnStatus.WAITING)
                and visible_at is not None
                and visible_at <= now
            ) or (
                turn.status == TurnStatus.RUNNING
                and turn.lease_expires_at is not None
                and (turn.lease_expires_at <= now or holder.is_dead(row["holder"]))
            )
            if not (deliverable or force):
                return None
            if self._exhausted(row):
                self._dead_letter(conn, turn, now)
                return None
            return self._take(conn, turn, owner, lease_seconds, now)

    def _take(
        self, conn: sqlite3.Connection, turn: Turn, owner: str, lease_seconds: float, now: float
    ) -> Lease:
        expires_at = now + lease_seconds
        conn.execute(
            "UPDATE turns SET status = :status, attempts = :attempt, epoch = :epoch,"
            " lease_owner = :owner, lease_expires_at = :expires_at, visible_at = :expires_at,"
            " waiting_for = NULL, holder = :holder WHERE turn_id = :turn_id",
            {
                "holder": holder.this_holder(),
                "status": TurnStatus.RUNNING,
                "attempt": turn.attempts + 1,
                "epoch": turn.epoch + 1,
                "owner": owner,
                "expires_at": expires_at,
                "turn_id": turn.turn_id,
            },
        )
        return Lease(
            turn_id=turn.turn_id,
            session_id=turn.session_id,
            owner=owner,
            epoch=turn.epoch + 1,
            attempt=turn.attempts + 1,
            expires_at=expires_at,
        )

    def _exhausted(self, row: sqlite3.Row) -> bool:
        """Would one more delivery pass max_attempts (counting since the last suspend)?"""
        return bool(row["attempts"] - row["attempt_floor"] + 1 > self.max_attempts)

    def _dead_letter(self, conn: sqlite3.Connection, turn: Turn, now: float) -> None:
        error = (
            f"dead-lettered after {turn.attempts} deliveries; last error: "
            f"{turn.error or 'lease expired (worker died?)'}"
        )
        # The epoch moves too, so a zombie still holding the expired lease is fenced out.
        conn.execute(
            "UPDATE turns SET status = ?, error = ?, epoch = epoch + 1, visible_at = NULL,"
            " lease_owner = NULL, lease_expires_at = NULL, finished_at = ? WHERE turn_id = ?",
            (TurnStatus.FAILED, error, now, turn.turn_id),
        )

    def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        with self._db.transaction(write=True) as conn:
            fence(conn, lease.turn_id, lease.epoch)
            expires_at = time.time() + lease_seconds
            conn.execute(
                "UPDATE turns SET lease_expires_at = ?, visible_at = ? WHERE turn_id = ?",
                (expires_at, expires_at, lease.turn_id),
            )
            return dataclasses.replace(lease, expires_at=expires_at)

    def release(self, lease: Lease, delay: float = 0.0, error: str | None = None) -> None:
        with self._db.transaction(write=True) as conn:
            fence(conn, lease.turn_id, lease.epoch)
            conn.execute(
                "UPDATE turns SET status = ?, visible_at = ?, lease_owner = NULL,"
                " lease_expires_at = NULL, error = COALESCE(?, error) WHERE turn_id = ?",
                (TurnStatus.QUEUED, time.time() + delay, error, lease.turn_id),
            )

    def suspend(
        self,
        lease: Lease,
        wake_at: float,
        waiting_for: str,
        signal: str | None = None,
        seen: int = 0,
    ) -> None:
        with self._db.transaction(write=True) as conn:
            fence(conn, lease.turn_id, lease.epoch)
            if signal is not None and _count(conn, lease.turn_id, signal) > seen:
                # It landed between the wait's check and this suspend: wake at once.
                wake_at = time.time()
            conn.execute(
                "UPDATE turns SET status = ?, visible_at = ?, lease_owner = NULL,"
                " lease_expires_at = NULL, waiting_for = ?, attempt_floor = attempts"
                " WHERE turn_id = ?",
                (TurnStatus.WAITING, wake_at, waiting_for, lease.turn_id),
            )

    def send_signal(
        self, turn_id: str, name: str, payload: str, delivery_id: str | None = None
    ) -> bool:
        with self._db.transaction(write=True) as conn:
            turn_row(conn, turn_id)
            inserted = conn.execute(
                "INSERT INTO signal_log (turn_id, name, idx, delivery_id, payload, received_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (turn_id, name, delivery_id) DO NOTHING",
                (
                    turn_id,
                    name,
                    _count(conn, turn_id, name),  # under the write lock: no race for idx
                    delivery_key(payload, delivery_id),
                    payload,
                    time.time(),
                ),
            ).rowcount
            conn.execute(
                "UPDATE turns SET visible_at = ? WHERE turn_id = ? AND status = ?",
                (time.time(), turn_id, TurnStatus.WAITING),
            )
            return inserted == 1

    def list_signals(self, turn_id: str, name: str) -> list[Signal]:
        with self._db.transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT idx, payload, delivery_id, claimed_by FROM signal_log"
                " WHERE turn_id = ? AND name = ? ORDER BY idx",
                (turn_id, name),
            ).fetchall()
        return [Signal(r["idx"], r["payload"], r["delivery_id"], r["claimed_by"]) for r in rows]

    def claim_signal(self, turn_id: str, name: str, index: int, seq: int) -> bool:
        with self._db.transaction(write=True) as conn:
            conn.execute(
                "UPDATE signal_log SET claimed_by = ? WHERE turn_id = ? AND name = ?"
                " AND idx = ? AND claimed_by IS NULL",
                (seq, turn_id, name, index),
            )
            row = conn.execute(
                "SELECT claimed_by FROM signal_log WHERE turn_id = ? AND name = ? AND idx = ?",
                (turn_id, name, index),
            ).fetchone()
        return row is not None and row["claimed_by"] == seq

    def watch(self, scope: str, ref: str, turn_id: str, name: str) -> None:
        with self._db.transaction(write=True) as conn:
            turn_row(conn, turn_id)
            conn.execute(
                "INSERT INTO watches (scope, turn_id, name, ref) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (scope, turn_id, name) DO UPDATE SET ref = excluded.ref",
                (scope, turn_id, name, ref),
            )

    def watchers(self, scope: str, ref: str) -> list[tuple[str, str]]:
        with self._db.transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT turn_id, name FROM watches WHERE scope = ? AND ref = ?"
                " ORDER BY turn_id, name",
                (scope, ref),
            ).fetchall()
        return [(str(r["turn_id"]), str(r["name"])) for r in rows]

    def end_turn(
        self, lease: Lease, status: TurnStatus, result: str | None, error: str | None
    ) -> None:
        with self._db.transaction(write=True) as conn:
            fence(conn, lease.turn_id, lease.epoch)
            conn.execute(
                "UPDATE turns SET status = ?, result = COALESCE(?, result),"
                " error = COALESCE(?, error), finished_at = ?, visible_at = NULL,"
                " lease_owner = NULL, lease_expires_at = NULL WHERE turn_id = ?",
                (status, result, error, time.time(), lease.turn_id),
            )


def _dead_holders_turn(conn: sqlite3.Connection, now: float) -> sqlite3.Row | None:
    """The oldest running turn with a live lease whose holder, a process of this host,
    is provably dead (``holder.is_dead``): deliverable now, not at its lease's end."""
    prefix = holder.same_host_prefix()
    if prefix is None:
        return None
    rows = conn.execute(
        "SELECT * FROM turns WHERE status = ? AND lease_expires_at > ? AND holder LIKE ?"
        " ORDER BY created_at, rowid",
        (TurnStatus.RUNNING, now, prefix),
    ).fetchall()
    return next((r for r in rows if holder.is_dead(r["holder"])), None)


def _count(conn: sqlite3.Connection, turn_id: str, name: str) -> int:
    row = conn.execute(
        "SELECT COUNT(*) FROM signal_log WHERE turn_id = ? AND name = ?", (turn_id, name)
    ).fetchone()
    return int(row[0])
