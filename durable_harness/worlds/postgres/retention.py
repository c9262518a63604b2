"""The PostgreSQL World's part of ``durable-harness gc``: expired sessions, the mark's
roots, the blob listing and the touch-safe blob delete.

A session is removed in one transaction that first locks its row ``FOR UPDATE`` and then
checks again that it is expired: that lock conflicts with ``create_turn``'s lock on the
session and with the foreign-key check of a new session record, so a turn or record is
never added to a session being removed (it waits, then finds no session). A blob is
deleted by ``DELETE ... WHERE touched_at < cutoff``, which ``put_blob``'s upsert orders
by the row lock (see ``sql.PUT_BLOB``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import Any

import psycopg

from durable_harness.core.retention import BlobInfo, Dropped, Retention, digests_in
from durable_harness.worlds.postgres import connections as db
from durable_harness.worlds.postgres.connections import PostgresConnections

_S = "durable_harness"

_EXPIRED = f"""
SELECT s.session_id FROM {_S}.sessions s
WHERE s.created_at < %(before)s AND NOT EXISTS (
    SELECT 1 FROM {_S}.turns t WHERE t.session_id = s.session_id AND (
        t.status = 'open' OR GREATEST(t.created_at, COALESCE(t.finished_at, 0)) >= %(before)s))"""

_LOCK = f"SELECT 1 FROM {_S}.sessions WHERE session_id = %(sid)s FOR UPDATE"

# (table, what it counts as in Dropped or None); rows keyed by the session's turns.
_TURN_TABLES = (
    ("steps", "steps"),
    ("events", "events"),
    ("event_heads", None),
    ("signal_log", None),
    ("watches", None),
    ("jobs", None),
)

# Every text that may name a blob, with its session. The 64-hex runs are found by the
# server (one row per distinct digest), so the mark reads digests, not whole journals.
_ROOTS = f"""
WITH texts (sid, text) AS (
    SELECT t.session_id, concat_ws(' ', s.input, s.output, s.output_blob, s.meta::text)
    FROM {_S}.steps s JOIN {_S}.turns t USING (turn_id)
    UNION ALL SELECT session_id, concat_ws(' ', config::text, result) FROM {_S}.turns
    UNION ALL SELECT t.session_id, e.data FROM {_S}.events e JOIN {_S}.turns t USING (turn_id)
    UNION ALL
    SELECT t.session_id, g.payload FROM {_S}.signal_log g JOIN {_S}.turns t USING (turn_id)
    UNION ALL SELECT session_id, digest FROM {_S}.session_records
    UNION ALL SELECT session_id, meta::text FROM {_S}.sessions)
SELECT DISTINCT m[1] AS digest
FROM texts, regexp_matches(text, '(?<![0-9a-f])[0-9a-f]{{64}}(?![0-9a-f])', 'g') AS m
WHERE sid <> ALL(%(skip)s)"""

_BLOBS = f"SELECT digest, octet_length(data) AS size, touched_at FROM {_S}.blobs"

_DELETE_BLOBS = f"""
DELETE FROM {_S}.blobs WHERE digest = ANY(%s) AND touched_at < %s
RETURNING digest, octet_length(data) AS size"""


class PostgresRetention(PostgresConnections, Retention):
    """The :class:`Retention` facet of :class:`~durable_harness.worlds.postgres.PostgresWorld`."""

    def expired_sessions(self, before: float) -> list[str]:
        rows = self._run("gc", lambda c, _: db.all_rows(c, _EXPIRED, {"before": before}))
        return [str(row["session_id"]) for row in rows]

    def drop_session(self, session_id: str, before: float, dry_run: bool) -> Dropped | None:
        args = {"before": before, "sid": session_id}

        def op(conn: psycopg.Connection[Any], retried: bool) -> Dropped | None:
            with conn.transaction():
                if not dry_run:
                    db.one_row(conn, _LOCK, args)
                if db.one_row(conn, _EXPIRED + " AND s.session_id = %(sid)s", args) is None:
                    return None  # a retry after a lost commit lands here too: it is gone
                turns = f"(SELECT turn_id FROM {_S}.turns WHERE session_id = %(sid)s)"
                dropped = Dropped(turns=_count(conn, "turns", "session_id = %(sid)s", args))
                dropped.records = _count(conn, "session_records", "session_id = %(sid)s", args)
                for table, counted in _TURN_TABLES:
                    if counted is not None:
                        setattr(dropped, counted, _count(conn, table, f"turn_id IN {turns}", args))
                if dry_run:
                    return dropped
                for table, _ in _TURN_TABLES:
                    conn.execute(f"DELETE FROM {_S}.{table} WHERE turn_id IN {turns}", args)
                conn.execute(
                    f"DELETE FROM {_S}.owners WHERE (kind = 'turn' AND item_id IN {turns})"
                    " OR (kind = 'session' AND item_id = %(sid)s)",
                    args,
                )
                for table in ("turns", "session_records", "sessions"):
                    conn.execute(f"DELETE FROM {_S}.{table} WHERE session_id = %(sid)s", args)
                return dropped

        return self._run("gc", op)

    def referenced_digests(self, excluding: Collection[str] = ()) -> set[str]:
        rows = self._run("gc", lambda c, _: db.all_rows(c, _ROOTS, {"skip": list(excluding)}))
        found: set[str] = set()
        for row in rows:
            found.update(digests_in(str(row["digest"]).encode()))
        return found

    def list_blobs(self) -> Iterator[BlobInfo]:
        rows = self._run("gc", lambda c, _: db.all_rows(c, _BLOBS))
        return iter([BlobInfo(r["digest"], int(r["size"]), float(r["touched_at"])) for r in rows])

    def delete_blobs(self, digests: Sequence[str], touched_before: float) -> dict[str, int]:
        rows = self._run(
            "gc", lambda c, _: db.all_rows(c, _DELETE_BLOBS, (list(digests), touched_before))
        )
        return {str(row["digest"]): int(row["size"]) for row in rows}


def _count(conn: psycopg.Connection[Any], table: str, where: str, args: dict[str, Any]) -> int:
    row = db.one_row(conn, f"SELECT COUNT(*) AS n FROM {_S}.{table} WHERE {where}", args)
    return 0 if row is None else int(row["n"])
