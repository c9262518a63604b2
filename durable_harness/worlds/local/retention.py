"""The local World's part of ``durable-harness gc``: expired sessions, the mark's roots,
the blob folder's listing and its touch-safe delete (:mod:`.blobs`).

A session is removed in one ``BEGIN IMMEDIATE`` transaction that checks again that it
is expired: SQLite's single writer lock orders it against a ``create_turn`` on the same
session, so a turn is never created on a session that is being removed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterator, Sequence

from durable_harness.core.retention import BlobInfo, Dropped, Retention, digests_in
from durable_harness.worlds.local.blobs import BlobFolder
from durable_harness.worlds.local.db import Database

# A session is expired when it, and every turn of it, is older than `before` and no turn
# of it is still to be worked on.
_EXPIRED = """
SELECT s.session_id FROM sessions s
WHERE s.created_at < :before AND NOT EXISTS (
    SELECT 1 FROM turns t WHERE t.session_id = s.session_id AND (
        t.status IN ('queued', 'running', 'waiting')
        OR MAX(t.created_at, COALESCE(t.finished_at, 0)) >= :before))"""

_TURNS = "SELECT turn_id FROM turns WHERE session_id = ?"

# Per turn: (table, what it counts as in Dropped or None).
_TURN_TABLES = (
    ("steps", "steps"),
    ("events", "events"),
    ("signal_log", None),
    ("watches", None),
)

# Every text that may name a blob, with the session it belongs to.
_ROOTS = (
    "SELECT t.session_id AS sid, COALESCE(s.input, '') || ' ' || COALESCE(s.output, '')"
    " || ' ' || COALESCE(s.output_blob, '') || ' ' || s.meta AS text"
    " FROM steps s JOIN turns t USING (turn_id)",
    "SELECT session_id AS sid, config || ' ' || COALESCE(result, '') AS text FROM turns",
    "SELECT t.session_id AS sid, e.data AS text FROM events e JOIN turns t USING (turn_id)",
    "SELECT t.session_id AS sid, g.payload AS text FROM signal_log g JOIN turns t USING (turn_id)",
    "SELECT session_id AS sid, digest AS text FROM session_records",
    "SELECT session_id AS sid, meta AS text FROM sessions",
)


class LocalRetention(Retention):
    """The :class:`Retention` facet of :class:`~durable_harness.worlds.local.LocalWorld`."""

    _db: Database
    _blobs: BlobFolder

    def expired_sessions(self, before: float) -> list[str]:
        with self._db.transaction(write=False) as conn:
            rows = conn.execute(_EXPIRED, {"before": before}).fetchall()
        return [str(row["session_id"]) for row in rows]

    def drop_session(self, session_id: str, before: float, dry_run: bool) -> Dropped | None:
        with self._db.transaction(write=not dry_run) as conn:
            still = conn.execute(
                _EXPIRED + " AND s.session_id = :sid", {"before": before, "sid": session_id}
            ).fetchone()
            if still is None:
                return None
            turns = [str(row["turn_id"]) for row in conn.execute(_TURNS, (session_id,))]
            dropped = Dropped(turns=len(turns))
            dropped.records = _count(conn, "session_records", "session_id", [session_id])
            for table, counted in _TURN_TABLES:
                n = _count(conn, table, "turn_id", turns)
                if counted is not None:
                    setattr(dropped, counted, getattr(dropped, counted) + n)
            if dry_run:
                return dropped
            for table, _ in _TURN_TABLES:
                _delete(conn, table, "turn_id", turns)
            conn.execute(
                "DELETE FROM owners WHERE kind = 'turn' AND item_id IN"
                " (SELECT turn_id FROM turns WHERE session_id = ?)",
                (session_id,),
            )
            conn.execute("DELETE FROM owners WHERE kind = 'session' AND item_id = ?", (session_id,))
            conn.execute("DELETE FROM turns WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM session_records WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            return dropped

    def referenced_digests(self, excluding: Collection[str] = ()) -> set[str]:
        skip = set(excluding)
        found: set[str] = set()
        with self._db.transaction(write=False) as conn:
            for query in _ROOTS:
                for row in conn.execute(query):
                    if row["sid"] not in skip and row["text"]:
                        found.update(digests_in(str(row["text"]).encode()))
        return found

    def list_blobs(self) -> Iterator[BlobInfo]:
        return self._blobs.list()

    def delete_blobs(self, digests: Sequence[str], touched_before: float) -> dict[str, int]:
        freed = {d: self._blobs.delete(d, touched_before) for d in digests}
        return {d: size for d, size in freed.items() if size is not None}


def _count(conn: sqlite3.Connection, table: str, column: str, ids: list[str]) -> int:
    if not ids:
        return 0
    marks = ", ".join("?" * len(ids))
    row = conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {column} IN ({marks})", ids)
    return int(row.fetchone()[0])


def _delete(conn: sqlite3.Connection, table: str, column: str, ids: list[str]) -> None:
    if ids:
        marks = ", ".join("?" * len(ids))
        conn.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", ids)
