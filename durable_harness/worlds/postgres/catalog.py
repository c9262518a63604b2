"""The PostgreSQL World's blobs and catalog: sessions, turns, each session's records."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from durable_harness.core.errors import (
    CorruptJournal,
    NotFound,
    WorldError,
)
from durable_harness.core.types import DEAD_LETTER_PREFIX, Session, Turn, TurnCounts, TurnStatus
from durable_harness.core.world import BlobStore, Catalog
from durable_harness.worlds.postgres import connections as db
from durable_harness.worlds.postgres import sql
from durable_harness.worlds.postgres.connections import PostgresConnections
from durable_harness.worlds.postgres.sql import Row

#: Blobs larger than this are touched before they are sent, to skip re-sending a duplicate.
BLOB_PROBE_BYTES = 64 * 1024

_DIGEST = re.compile(r"[0-9a-f]{64}")


class PostgresCatalog(PostgresConnections, BlobStore, Catalog):
    """The blob and catalog facets of :class:`~durable_harness.worlds.postgres.PostgresWorld`."""

    def put_blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()

        def op(conn: psycopg.Connection[Any], retried: bool) -> str:
            if len(data) > BLOB_PROBE_BYTES and db.one_row(conn, sql.TOUCH_BLOB, (digest,)):
                return digest
            conn.execute(sql.PUT_BLOB, (digest, data))
            return digest

        return self._run("put_blob", op)

    def get_blob(self, digest: str) -> bytes:
        if not _DIGEST.fullmatch(digest):
            raise NotFound(f"no blob {digest!r}: not a sha256 hex digest")
        row = self._run("get_blob", lambda c, _: db.one_row(c, sql.GET_BLOB, (digest,)))
        if row is None:
            raise NotFound(f"no blob {digest} in the PostgreSQL World at {self.where}")
        data = bytes(row["data"])
        if hashlib.sha256(data).hexdigest() != digest:
            raise CorruptJournal(f"blob {digest} in {self.where} does not match its digest")
        return data

    # -- sessions and turns ----------------------------------------------------------------
    def create_session(self, session_id: str, meta: dict[str, Any] | None = None) -> Session:
        params = {"session_id": session_id, "meta": Jsonb(meta or {})}

        def op(conn: psycopg.Connection[Any], retried: bool) -> Row | None:
            # No row only when a concurrent create committed after this statement began:
            # its row is visible to the next statement.
            return db.one_row(conn, sql.CREATE_SESSION, params) or db.one_row(
                conn, sql.GET_SESSION, (session_id,)
            )

        row = self._run("create_session", op)
        if row is None:
            raise WorldError(f"session {session_id!r} was neither created nor found")
        return sql.session_of(row)

    def get_session(self, session_id: str) -> Session:
        row = self._run("get_session", lambda c, _: db.one_row(c, sql.GET_SESSION, (session_id,)))
        if row is None:
            raise NotFound(f"no session {session_id!r}")
        return sql.session_of(row)

    def list_sessions(self, limit: int = 100) -> list[Session]:
        rows = self._run("list_sessions", lambda c, _: db.all_rows(c, sql.LIST_SESSIONS, (limit,)))
        return [sql.session_of(row) for row in rows]

    def create_turn(
        self, session_id: str, turn_id: str, prompt: str, config: dict[str, Any]
    ) -> Turn:
        def op(conn: psycopg.Connection[Any], retried: bool) -> Turn:
            with conn.transaction():
                # Locking the session serializes turn creation in it, so the next index
                # read below cannot be taken by a concurrent create.
                if db.one_row(conn, sql.LOCK_SESSION, (session_id,)) is None:
                    raise NotFound(f"no session {session_id!r}")
                existing = db.one_row(conn, sql.GET_TURN, (turn_id,))
                if existing is not None:
                    # A retried create (the caller, or our own retry after a lost commit)
                    # gets the same turn back; reusing the id for other work is refused.
                    if existing["session_id"] == session_id and existing["prompt"] == prompt:
                        return sql.turn_of(existing)
                    raise WorldError(f"turn id {turn_id!r} is already used by another turn")
                args = {
                    "turn_id": turn_id,
                    "session_id": session_id,
                    "prompt": prompt,
                    "config": Jsonb(config),
                }
                conn.execute(sql.INSERT_TURN, args)
                conn.execute(sql.NOTIFY)  # delivered on COMMIT
                row = db.one_row(conn, sql.GET_TURN, (turn_id,))
            assert row is not None
            return sql.turn_of(row)

        return self._run("create_turn", op)

    def get_turn(self, turn_id: str) -> Turn:
        row = self._run("get_turn", lambda c, _: db.one_row(c, sql.GET_TURN, (turn_id,)))
        if row is None:
            raise NotFound(f"no turn {turn_id!r}")
        return sql.turn_of(row)

    def list_turns(self, session_id: str | None = None, limit: int = 100) -> list[Turn]:
        if session_id is None:
            query, params = sql.LIST_TURNS, (limit,)
        else:
            query, params = sql.LIST_SESSION_TURNS, (session_id, limit)  # type: ignore[assignment]
        rows = self._run("list_turns", lambda c, _: db.all_rows(c, query, params))
        return [sql.turn_of(row) for row in rows]

    def has_unfinished_turns(self) -> bool:
        # A turn has a job row exactly while it is unfinished (the queue holds no history).
        row = self._run("has_unfinished_turns", lambda c, _: db.one_row(c, sql.ANY_JOB))
        return row is not None

    def count_turns(self) -> TurnCounts:
        params = (DEAD_LETTER_PREFIX + "%",)
        rows = self._run("count_turns", lambda c, _: db.all_rows(c, sql.COUNT_TURNS, params))
        counts = {str(row["status"]): int(row["n"]) for row in rows}
        dead = sum(int(row["dead"]) for row in rows if row["status"] == TurnStatus.FAILED)
        return TurnCounts(**counts, dead_lettered=dead)

    def put_session_record(self, session_id: str, name: str, digest: str) -> None:
        params = (session_id, name, digest, session_id)
        row = self._run("put_session_record", lambda c, _: db.one_row(c, sql.PUT_RECORD, params))
        if row is None:
            raise NotFound(f"no session {session_id!r}")

    def get_session_record(self, session_id: str, name: str) -> str | None:
        params = (session_id, name)
        row = self._run("get_session_record", lambda c, _: db.one_row(c, sql.GET_RECORD, params))
        return None if row is None else str(row["digest"])
