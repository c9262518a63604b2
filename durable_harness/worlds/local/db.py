"""The local World's SQLite database: one connection, its transactions, its migrations.

``<data_dir>/world.sqlite3`` holds sessions, turns (which double as the queue) and steps.
WAL mode lets readers run beside the single writer, ``busy_timeout`` makes a writer wait
for the lock instead of failing, and a write transaction takes the write lock up front
(``BEGIN IMMEDIATE``), so the check a write depends on and the write happen under one
lock. :func:`fence` and :func:`turn_row` are the row checks the facets share.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from durable_harness.core.errors import LeaseLost, NotFound, WorldError
from durable_harness.core.migrations import apply_migrations
from durable_harness.core.types import Turn, TurnStatus
from durable_harness.worlds.local.schema import MIGRATIONS, turn_from_row

DB_NAME = "world.sqlite3"
BUSY_TIMEOUT_MS = 30_000
OTHER_FOLDER = "choose another folder with --data-dir or DURABLE_HARNESS_DATA_DIR"


class Database:
    """The World's database at ``path``, opened (and migrated) on first use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # One connection guarded by a lock rather than one per thread: SQLite admits a single
        # writer anyway, so per-thread connections would buy nothing for the two threads that
        # share a World (turn + lease renewal), yet close() would have to reach connections
        # owned by other threads. The lock also keeps one thread's transaction from
        # interleaving with another thread's statements on the shared connection.
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._closed = False

    def open(self) -> None:
        with self._lock:
            self.connection()

    def connection(self) -> sqlite3.Connection:
        if self._closed:
            raise WorldError(f"the local World at {self.path.parent} is closed")
        if self._conn is None:
            try:
                conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                try:
                    self._configure(conn)
                except BaseException:
                    conn.close()
                    raise
            except sqlite3.Error as exc:
                raise WorldError(
                    f"cannot open the local World {self.path}: {exc}; {_open_advice(exc)}"
                ) from exc
            self._conn = conn
        return self._conn

    def _configure(self, conn: sqlite3.Connection) -> None:
        conn.row_factory = sqlite3.Row
        # busy_timeout first: switching to WAL itself may have to wait for another process.
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise WorldError(
                f"{self.path}: SQLite refused WAL mode (got {mode!r}); put the World "
                "folder on a local filesystem"
            )
        # FULL: an intent is on disk when insert_intent returns (invariant 1).
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        self._migrate(conn)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")  # two processes starting at once migrate once
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version ("
                " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            current = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
            if current > len(MIGRATIONS):
                raise WorldError(
                    f"{self.path} has schema version {current}, but this durable-harness "
                    f"knows only up to {len(MIGRATIONS)}: upgrade durable-harness to open it"
                )
            apply_migrations(
                MIGRATIONS,
                current,
                conn.execute,
                "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def transaction(self, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction; writes take the database's write lock up front."""
        if self._pid != os.getpid():
            # A connection must not cross fork(): the child opens its own and abandons the
            # inherited one unclosed (closing it could release locks the parent holds).
            self._conn, self._lock, self._pid = None, threading.RLock(), os.getpid()
        with self._lock:
            conn = self.connection()
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield conn
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise WorldError(f"local World {self.path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
            self._conn = None
            self._closed = True


def turn_row(conn: sqlite3.Connection, turn_id: str) -> sqlite3.Row:
    row: sqlite3.Row | None = conn.execute(
        "SELECT * FROM turns WHERE turn_id = ?", (turn_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"no turn {turn_id!r}")
    return row


def fence(conn: sqlite3.Connection, turn_id: str, epoch: int) -> None:
    """Raise LeaseLost unless ``epoch`` is the turn's current one and it is running."""
    row = turn_row(conn, turn_id)
    if row["epoch"] != epoch or row["status"] != TurnStatus.RUNNING:
        raise LeaseLost(
            f"turn {turn_id}: a write with lease epoch {epoch} was refused; the turn is "
            f"{row['status']} at epoch {row['epoch']} (another worker took it over)"
        )


def _open_advice(exc: sqlite3.Error) -> str:
    """What to do about a World file SQLite cannot open."""
    if "not a database" in str(exc) or "malformed" in str(exc):
        return f"it is not a durable-harness World or it is damaged: restore it, or {OTHER_FOLDER}"
    return f"check that this user may read and write that folder, or {OTHER_FOLDER}"


def load_turn(conn: sqlite3.Connection, turn_id: str) -> Turn:
    return turn_from_row(turn_row(conn, turn_id))
