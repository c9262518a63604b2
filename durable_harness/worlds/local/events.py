"""The local World's event log: the ``events`` table.

An append runs in one write transaction (``BEGIN IMMEDIATE``: SQLite's single write
lock), so the key check, the fence and ``max(seq) + 1`` happen under the lock that makes
two processes append one after the other: no seq is taken twice, none is skipped, and a
reader sees seq ``n`` committed before ``n + 1`` is even chosen.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import WorldError
from durable_harness.core.types import Event
from durable_harness.core.world import MAX_EVENT_BYTES, EventLog
from durable_harness.worlds.local.db import Database, fence, turn_row
from durable_harness.worlds.local.schema import json_object


class LocalEvents(EventLog):
    """The :class:`EventLog` facet of :class:`~durable_harness.worlds.local.LocalWorld`."""

    _db: Database

    def append_event(
        self,
        turn_id: str,
        key: str,
        kind: str,
        data: dict[str, Any],
        epoch: int | None = None,
    ) -> Event:
        text = canonical_json(data)
        if len(text.encode("utf-8", "surrogatepass")) > MAX_EVENT_BYTES:
            raise WorldError(
                f"turn {turn_id}: event {key!r} is {len(text)} characters of JSON, over the "
                f"{MAX_EVENT_BYTES} bytes an event may hold; append it in pieces"
            )
        with self._db.transaction(write=True) as conn:
            turn_row(conn, turn_id)  # NotFound for an unknown turn
            known = conn.execute(
                "SELECT * FROM events WHERE turn_id = ? AND key = ?", (turn_id, key)
            ).fetchone()
            if known is not None:  # appended before (a writer repeating itself)
                return _event(known)
            if epoch is not None:
                fence(conn, turn_id, epoch)
            seq = conn.execute(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE turn_id = ?", (turn_id,)
            ).fetchone()[0]
            at = time.time()
            conn.execute(
                "INSERT INTO events (turn_id, seq, key, kind, data, at, epoch)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (turn_id, seq, key, kind, text, at, epoch),
            )
        return Event(turn_id, int(seq), key, kind, json_object(text, key, "data"), at, epoch)

    def read_events(self, turn_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        with self._db.transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT * FROM events WHERE turn_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (turn_id, after, limit),
            ).fetchall()
        return [_event(row) for row in rows]


def _event(row: sqlite3.Row) -> Event:
    where = f"turn {row['turn_id']} event {row['seq']}"
    return Event(
        turn_id=row["turn_id"],
        seq=int(row["seq"]),
        key=row["key"],
        kind=row["kind"],
        data=json_object(row["data"], where, "data"),
        at=float(row["at"]),
        epoch=None if row["epoch"] is None else int(row["epoch"]),
    )
