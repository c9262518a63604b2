"""The PostgreSQL World's event log: ``events``, numbered under ``event_heads``.

An append is one autocommit statement (one round trip): the fence (with an epoch: the
job row ``FOR SHARE``, running at that epoch, as a journal write checks it), the bump of
the turn's head row (whose row lock orders the turn's appends), the insert, and a
``NOTIFY`` on :data:`~.schema.EVENTS_CHANNEL`, all committed together. A seq is never
burnt: a key already in the log when the statement began bumps nothing, and a key that
another append committed while this one waited for the head row makes the insert fail,
which undoes the whole statement, bump included. Either way the first event is returned.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import CorruptJournal, NotFound, WorldError
from durable_harness.core.types import Event
from durable_harness.core.world import MAX_EVENT_BYTES, EventLog
from durable_harness.worlds.postgres import connections as db
from durable_harness.worlds.postgres.connections import PostgresConnections
from durable_harness.worlds.postgres.sql import Row

# The head row is made by a turn's first append. Its bump waits for the append in flight
# on the same turn, then numbers from what that one committed (ON CONFLICT DO UPDATE works
# on the newest row version). The key check reads the statement's snapshot: a key that
# committed later is caught by the unique index instead (see the module docstring).
APPEND_EVENT = """
WITH fence AS (
    SELECT FROM durable_harness.jobs
    WHERE turn_id = %(turn_id)s AND epoch = %(epoch)s AND status = 'running'
    FOR SHARE
), head AS (
    INSERT INTO durable_harness.event_heads AS h (turn_id, seq)
    SELECT turn_id, 1 FROM durable_harness.turns
    WHERE turn_id = %(turn_id)s
      AND (%(epoch)s::bigint IS NULL OR EXISTS (SELECT FROM fence))
      AND NOT EXISTS (
        SELECT FROM durable_harness.events WHERE turn_id = %(turn_id)s AND key = %(key)s)
    ON CONFLICT (turn_id) DO UPDATE SET seq = h.seq + 1
    RETURNING seq
), added AS (
    INSERT INTO durable_harness.events (turn_id, seq, key, kind, data, at, epoch)
    SELECT %(turn_id)s, seq, %(key)s, %(kind)s, %(data)s, durable_harness.epoch_now(),
           %(epoch)s
    FROM head
    RETURNING turn_id, seq, key, kind, data, at, epoch
)
SELECT added.*, pg_notify('durable_harness_events', added.turn_id) FROM added"""

_COLUMNS = "turn_id, seq, key, kind, data, at, epoch"

GET_EVENT = f"""
SELECT {_COLUMNS} FROM durable_harness.events WHERE turn_id = %s AND key = %s"""

READ_EVENTS = f"""
SELECT {_COLUMNS} FROM durable_harness.events
WHERE turn_id = %s AND seq > %s ORDER BY seq LIMIT %s"""

TURN_EXISTS = "SELECT 1 AS found FROM durable_harness.turns WHERE turn_id = %s"

_ONCE_PER_KEY = "events_once_per_key"  # the unique constraint on (turn_id, key)


class PostgresEventLog(PostgresConnections, EventLog):
    """The event log facet of :class:`~durable_harness.worlds.postgres.PostgresWorld`."""

    def append_event(
        self,
        turn_id: str,
        key: str,
        kind: str,
        data: dict[str, Any],
        epoch: int | None = None,
    ) -> Event:
        if not isinstance(data, dict):
            raise WorldError(f"turn {turn_id}: event {key!r}: data must be a JSON object")
        text = canonical_json(data)
        if len(text.encode("utf-8")) > MAX_EVENT_BYTES:
            raise WorldError(
                f"turn {turn_id}: event {key!r} has {len(text.encode('utf-8'))} bytes of data, "
                f"more than the {MAX_EVENT_BYTES} an event holds: append it in pieces"
            )
        params = {"turn_id": turn_id, "key": key, "kind": kind, "data": text, "epoch": epoch}

        # A retry after a lost reply finds its own committed event by its key: appends are
        # idempotent by key, so the ``retried`` flag needs no branch here.
        def op(conn: psycopg.Connection[Any], retried: bool) -> Event:
            try:
                row = db.one_row(conn, APPEND_EVENT, params)
            except psycopg.errors.UniqueViolation as exc:
                if exc.diag.constraint_name != _ONCE_PER_KEY:
                    raise
                row = None  # the key committed while we waited: it is below
            if row is not None:
                return event_of(row)
            row = db.one_row(conn, GET_EVENT, (turn_id, key))
            if row is not None:
                return event_of(row)
            if epoch is not None:
                raise self._fence_error(conn, turn_id, epoch)
            if db.one_row(conn, TURN_EXISTS, (turn_id,)) is None:
                raise NotFound(f"no turn {turn_id!r}")
            raise WorldError(f"turn {turn_id}: event {key!r} was neither appended nor found")

        return self._run("append_event", op)

    def read_events(self, turn_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        params = (turn_id, after, limit)
        rows = self._run("read_events", lambda c, _: db.all_rows(c, READ_EVENTS, params))
        return [event_of(row) for row in rows]

    def wait_for_events(self, timeout: float) -> None:
        """Return when an event was appended to any turn (``NOTIFY``), or after ``timeout``.

        The first call only starts listening and returns at once, so that the caller
        reads again: an event appended before ``LISTEN`` sent its notification to no one.
        """
        self._event_listener.wait(timeout)


def event_of(row: Row) -> Event:
    where = f"turn {row['turn_id']} event {row['seq']}"
    try:
        data = json.loads(row["data"])
    except ValueError as exc:
        raise CorruptJournal(f"{where}: its data is not JSON") from exc
    if not isinstance(data, dict):
        raise CorruptJournal(f"{where}: its data is not a JSON object")
    return Event(
        turn_id=row["turn_id"],
        seq=int(row["seq"]),
        key=row["key"],
        kind=row["kind"],
        data=data,
        at=float(row["at"]),
        epoch=None if row["epoch"] is None else int(row["epoch"]),
    )
