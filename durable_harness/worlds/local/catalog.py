"""The local World's catalog: sessions, turns and each session's named records.

A turn's row is also its queue message (see :mod:`.queue`): ``create_turn`` makes it
visible at once.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from durable_harness.core.errors import NotFound, WorldError
from durable_harness.core.types import DEAD_LETTER_PREFIX, Session, Turn, TurnCounts, TurnStatus
from durable_harness.core.world import Catalog
from durable_harness.worlds.local.db import Database, load_turn
from durable_harness.worlds.local.schema import session_from_row, turn_from_row


class LocalCatalog(Catalog):
    """The :class:`Catalog` facet of :class:`~durable_harness.worlds.local.LocalWorld`."""

    _db: Database

    def create_session(self, session_id: str, meta: dict[str, Any] | None = None) -> Session:
        with self._db.transaction(write=True) as conn:
            conn.execute(
                "INSERT OR IGNORE INTO sessions (session_id, created_at, meta) VALUES (?, ?, ?)",
                (session_id, time.time(), json.dumps(meta or {})),
            )
            return self._session(conn, session_id)

    def get_session(self, session_id: str) -> Session:
        with self._db.transaction(write=False) as conn:
            return self._session(conn, session_id)

    def list_sessions(self, limit: int = 100) -> list[Session]:
        with self._db.transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT * FROM sessions ORDER BY created_at DESC, rowid DESC LIMIT ?", (limit,)
            ).fetchall()
            return [session_from_row(row) for row in rows]

    def create_turn(
        self, session_id: str, turn_id: str, prompt: str, config: dict[str, Any]
    ) -> Turn:
        with self._db.transaction(write=True) as conn:
            self._session(conn, session_id)
            existing = conn.execute("SELECT * FROM turns WHERE turn_id = ?", (turn_id,)).fetchone()
            if existing is not None:
                # A retried create (the caller died after committing) gets the same turn back;
                # reusing the id for different work is a bug worth stopping.
                if existing["session_id"] == session_id and existing["prompt"] == prompt:
                    return turn_from_row(existing)
                raise WorldError(f"turn id {turn_id!r} is already used by another turn")
            now = time.time()
            idx = conn.execute(
                "SELECT COALESCE(MAX(idx) + 1, 0) FROM turns WHERE session_id = ?", (session_id,)
            ).fetchone()[0]
            conn.execute(
                "INSERT INTO turns (turn_id, session_id, idx, prompt, status, config,"
                " created_at, visible_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (turn_id, session_id, idx, prompt, TurnStatus.QUEUED, json.dumps(config), now, now),
            )
            return load_turn(conn, turn_id)

    def get_turn(self, turn_id: str) -> Turn:
        with self._db.transaction(write=False) as conn:
            return load_turn(conn, turn_id)

    def list_turns(self, session_id: str | None = None, limit: int = 100) -> list[Turn]:
        with self._db.transaction(write=False) as conn:
            if session_id is None:
                rows = conn.execute(
                    "SELECT * FROM turns ORDER BY created_at DESC, rowid DESC LIMIT ?", (limit,)
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT * FROM turns WHERE session_id = ? ORDER BY idx LIMIT ?",
                    (session_id, limit),
                ).fetchall()
            return [turn_from_row(row) for row in rows]

    def has_unfinished_turns(self) -> bool:
        with self._db.transaction(write=False) as conn:
            row = conn.execute(
                "SELECT 1 FROM turns WHERE status IN ('queued', 'running', 'waiting') LIMIT 1"
            ).fetchone()
            return row is not None

    def count_turns(self) -> TurnCounts:
        with self._db.transaction(write=False) as conn:
            rows = conn.execute(
                # substr, not LIKE: SQLite's LIKE ignores case, the prefix test does not.
                "SELECT status, COUNT(*) AS n, SUM(substr(error, 1, ?) = ?) AS dead"
                " FROM turns GROUP BY status",
                (len(DEAD_LETTER_PREFIX), DEAD_LETTER_PREFIX),
            ).fetchall()
        counts = {str(row["status"]): int(row["n"]) for row in rows}
        dead = sum(int(row["dead"] or 0) for row in rows if row["status"] == TurnStatus.FAILED)
        return TurnCounts(**counts, dead_lettered=dead)

    def put_session_record(self, session_id: str, name: str, digest: str) -> None:
        with self._db.transaction(write=True) as conn:
            self._session(conn, session_id)
            conn.execute(
                "INSERT INTO session_records (session_id, name, digest) VALUES (?, ?, ?)"
                " ON CONFLICT (session_id, name) DO UPDATE SET digest = excluded.digest",
                (session_id, name, digest),
            )

    def get_session_record(self, session_id: str, name: str) -> str | None:
        with self._db.transaction(write=False) as conn:
            row = conn.execute(
                "SELECT digest FROM session_records WHERE session_id = ? AND name = ?",
                (session_id, name),
            ).fetchone()
            return None if row is None else str(row["digest"])

    def _session(self, conn: sqlite3.Connection, session_id: str) -> Session:
        row = conn.execute("SELECT * FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        if row is None:
            raise NotFound(f"no session {session_id!r}")
        return session_from_row(row)
