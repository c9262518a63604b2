"""The embedded World: one folder holding a SQLite database and a blob folder.

Layout::

    <data_dir>/world.sqlite3     sessions, turns (which double as the queue), steps
    <data_dir>/blobs/ab/cdef...  content-addressed payloads, named by their sha256 hex

Several worker processes on one machine may share the folder. WAL mode lets readers run
beside the single writer, ``busy_timeout`` makes a writer wait for the lock instead of
failing, and every read-modify-write (claim, fenced journal writes) runs under
``BEGIN IMMEDIATE``, so the check (epoch, lease, visibility) and the write it guards happen
under one write lock and two processes cannot both pass the check.

The queue lives in the turns table: a turn has a message when ``visible_at`` is not NULL,
which makes "one message per turn" structural. While a worker holds the lease,
``visible_at`` follows ``lease_expires_at``, as SQS's visibility timeout does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlparse

from pydantic import Field

from durable_harness.core.errors import (
    ConfigError,
    CorruptJournal,
    LeaseLost,
    NotFound,
    StepConflict,
    WorldError,
)
from durable_harness.core.settings import (
    WorldSettings,
    refuse_unknown_options,
    take_max_attempts,
)
from durable_harness.core.types import Lease, Session, Step, StepStatus, Turn, TurnStatus
from durable_harness.core.world import World
from durable_harness.worlds.local_schema import (
    MIGRATIONS,
    session_from_row,
    step_from_row,
    turn_from_row,
)

DB_NAME = "world.sqlite3"
BUSY_TIMEOUT_MS = 30_000

_DIGEST = re.compile(r"[0-9a-f]{64}")
_OUTCOMES = (StepStatus.DONE, StepStatus.POSSIBLY_RAN)
_OTHER_FOLDER = "choose another folder with --data-dir or DURABLE_HARNESS_DATA_DIR"


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/durable-harness``, by default ``~/.local/share/durable-harness``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "durable-harness"


class LocalSettings(WorldSettings):
    """The folder: ``DURABLE_HARNESS_DATA_DIR`` / ``--data-dir``."""

    data_dir: Path = Field(default_factory=default_data_dir)

    def world_options(self) -> dict[str, Any]:
        return {"data_dir": self.data_dir}


class LocalWorld(World):
    """A World in a local folder; see the module docstring for the layout and locking."""

    settings_model: ClassVar[type[WorldSettings]] = LocalSettings

    @classmethod
    def from_options(cls, **options: Any) -> LocalWorld:
        """``data_dir`` (or ``url``: ``file:///path`` or a folder path) and ``max_attempts``."""
        url = options.pop("url", None)
        if url is not None:
            options["data_dir"] = _folder_of(str(url), options.get("data_dir"))
        if "data_dir" not in options:
            raise ConfigError(
                "the local World needs a folder: pass data_dir (or a path as the World)"
            )
        data_dir = options.pop("data_dir")
        max_attempts = take_max_attempts("local", options)
        refuse_unknown_options("local", options)
        return cls(data_dir, max_attempts=max_attempts)

    def __init__(self, data_dir: str | Path, max_attempts: int = 5) -> None:
        self.data_dir = Path(data_dir).expanduser()
        self.max_attempts = max_attempts
        self._db_path = self.data_dir / DB_NAME
        self._blob_dir = self.data_dir / "blobs"
        # One connection guarded by a lock rather than one per thread: SQLite admits a single
        # writer anyway, so per-thread connections would buy nothing for the two threads that
        # share a World (turn + lease renewal), yet close() would have to reach connections
        # owned by other threads. The lock also keeps one thread's transaction from
        # interleaving with another thread's statements on the shared connection.
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._closed = False
        try:
            self._blob_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WorldError(
                f"cannot create the World folder {self.data_dir}: {exc}; {_OTHER_FOLDER}"
            ) from exc
        with self._lock:
            self._connection()

    # -- connection, transactions, migrations ----------------------------------------
    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise WorldError(f"the local World at {self.data_dir} is closed")
        if self._conn is None:
            try:
                conn = sqlite3.connect(self._db_path, isolation_level=None, check_same_thread=False)
                try:
                    self._configure(conn)
                except BaseException:
                    conn.close()
                    raise
            except sqlite3.Error as exc:
                raise WorldError(
                    f"cannot open the local World {self._db_path}: {exc}; {_open_advice(exc)}"
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
                f"{self._db_path}: SQLite refused WAL mode (got {mode!r}); put the World "
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
                    f"{self._db_path} has schema version {current}, but this durable-harness "
                    f"knows only up to {len(MIGRATIONS)}: upgrade durable-harness to open it"
                )
            for version, (name, statements) in enumerate(MIGRATIONS, start=1):
                if version <= current:
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, time.time()),
                )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def _transaction(self, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction; writes take the database's write lock up front."""
        if self._pid != os.getpid():
            # A connection must not cross fork(): the child opens its own and abandons the
            # inherited one unclosed (closing it could release locks the parent holds).
            self._conn, self._lock, self._pid = None, threading.RLock(), os.getpid()
        with self._lock:
            conn = self._connection()
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
                raise WorldError(f"local World {self._db_path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
            self._conn = None
            self._closed = True

    # -- blobs ---------------------------------------------------------------------
    def _blob_path(self, digest: str) -> Path:
        if not _DIGEST.fullmatch(digest):
            # Also keeps a crafted digest like "../../x" from escaping the blob folder.
            raise NotFound(f"no blob {digest!r}: not a sha256 hex digest")
        return self._blob_dir / digest[:2] / digest[2:]

    def put_blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self._blob_path(digest)
        if path.exists():
            return digest
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            _fsync_dir(path.parent)  # makes the rename itself survive a power cut
        except OSError as exc:
            raise WorldError(
                f"cannot write blob {digest} under {self._blob_dir}: {exc}; check that this user "
                "may write there and the disk is not full"
            ) from exc
        return digest

    def get_blob(self, digest: str) -> bytes:
        path = self._blob_path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise NotFound(f"no blob {digest} in {self._blob_dir}") from exc
        except OSError as exc:
            raise WorldError(f"cannot read blob {digest}: {exc}") from exc
        if hashlib.sha256(data).hexdigest() != digest:
            raise CorruptJournal(f"blob {digest} in {self._blob_dir} does not match its digest")
        return data

    # -- sessions and turns ----------------------------------------------------------
    def create_session(self, session_id: str, meta: dict[str, Any] | None = None) -> Session:
        with self._transaction(write=True) as conn:
            conn.execute(
                "INSERT OR IGNORE INTO sessions (session_id, created_at, meta) VALUES (?, ?, ?)",
                (session_id, time.time(), json.dumps(meta or {})),
            )
            return self._session(conn, session_id)

    def get_session(self, session_id: str) -> Session:
        with self._transaction(write=False) as conn:
            return self._session(conn, session_id)

    def list_sessions(self, limit: int = 100) -> list[Session]:
        with self._transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT * FROM sessions ORDER BY created_at DESC, rowid DESC LIMIT ?", (limit,)
            ).fetchall()
            return [session_from_row(row) for row in rows]

    def create_turn(
        self, session_id: str, turn_id: str, prompt: str, config: dict[str, Any]
    ) -> Turn:
        with self._transaction(write=True) as conn:
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
            return self._turn(conn, turn_id)

    def get_turn(self, turn_id: str) -> Turn:
        with self._transaction(write=False) as conn:
            return self._turn(conn, turn_id)

    def list_turns(self, session_id: str | None = None, limit: int = 100) -> list[Turn]:
        with self._transaction(write=False) as conn:
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
        with self._transaction(write=False) as conn:
            row = conn.execute(
                "SELECT 1 FROM turns WHERE status IN ('queued', 'running', 'waiting') LIMIT 1"
            ).fetchone()
            return row is not None

    def put_session_record(self, session_id: str, name: str, digest: str) -> None:
        with self._transaction(write=True) as conn:
            self._session(conn, session_id)
            conn.execute(
                "INSERT INTO session_records (session_id, name, digest) VALUES (?, ?, ?)"
                " ON CONFLICT (session_id, name) DO UPDATE SET digest = excluded.digest",
                (session_id, name, digest),
            )

    def get_session_record(self, session_id: str, name: str) -> str | None:
        with self._transaction(write=False) as conn:
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

    def _turn(self, conn: sqlite3.Connection, turn_id: str) -> Turn:
        return turn_from_row(self._turn_row(conn, turn_id))

    def _turn_row(self, conn: sqlite3.Connection, turn_id: str) -> sqlite3.Row:
        row: sqlite3.Row | None = conn.execute(
            "SELECT * FROM turns WHERE turn_id = ?", (turn_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"no turn {turn_id!r}")
        return row

    # -- queue and leases ------------------------------------------------------------
    def enqueue(self, turn_id: str, delay: float = 0.0) -> None:
        with self._transaction(write=True) as conn:
            turn = self._turn(conn, turn_id)
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
        with self._transaction(write=True) as conn:
            now = time.time()  # read under the write lock: the wait for it may be long
            while True:
                row = conn.execute(
                    "SELECT * FROM turns WHERE (status IN (?, ?) AND visible_at <= ?)"
                    " OR (status = ? AND lease_expires_at <= ?)"
                    " ORDER BY created_at, rowid LIMIT 1",
                    (TurnStatus.QUEUED, TurnStatus.WAITING, now, TurnStatus.RUNNING, now),
                ).fetchone()
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
        with self._transaction(write=True) as conn:
            now = time.time()
            row = self._turn_row(conn, turn_id)
            turn = turn_from_row(row)
            if turn.status in (TurnStatus.DONE, TurnStatus.FAILED):
                return None
            visible_at = row["visible_at"]
            deliverable = (
                turn.status in (TurnStatus.QUEUED, TurnStatus.WAITING)
                and visible_at is not None
                and visible_at <= now
            ) or (
                turn.status == TurnStatus.RUNNING
                and turn.lease_expires_at is not None
                and turn.lease_expires_at <= now
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
            " waiting_for = NULL WHERE turn_id = :turn_id",
            {
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

    def _fence(self, conn: sqlite3.Connection, turn_id: str, epoch: int) -> None:
        """Raise LeaseLost unless ``epoch`` is the turn's current one and it is running."""
        row = self._turn_row(conn, turn_id)
        if row["epoch"] != epoch or row["status"] != TurnStatus.RUNNING:
            raise LeaseLost(
                f"turn {turn_id}: a write with lease epoch {epoch} was refused; the turn is "
                f"{row['status']} at epoch {row['epoch']} (another worker took it over)"
            )

    def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        with self._transaction(write=True) as conn:
            self._fence(conn, lease.turn_id, lease.epoch)
            expires_at = time.time() + lease_seconds
            conn.execute(
                "UPDATE turns SET lease_expires_at = ?, visible_at = ? WHERE turn_id = ?",
                (expires_at, expires_at, lease.turn_id),
            )
            return dataclasses.replace(lease, expires_at=expires_at)

    def release(self, lease: Lease, delay: float = 0.0, error: str | None = None) -> None:
        with self._transaction(write=True) as conn:
            self._fence(conn, lease.turn_id, lease.epoch)
            conn.execute(
                "UPDATE turns SET status = ?, visible_at = ?, lease_owner = NULL,"
                " lease_expires_at = NULL, error = COALESCE(?, error) WHERE turn_id = ?",
                (TurnStatus.QUEUED, time.time() + delay, error, lease.turn_id),
            )

    def suspend(
        self, lease: Lease, wake_at: float, waiting_for: str, signal: str | None = None
    ) -> None:
        with self._transaction(write=True) as conn:
            self._fence(conn, lease.turn_id, lease.epoch)
            if (
                signal is not None
                and conn.execute(
                    "SELECT 1 FROM signals WHERE turn_id = ? AND name = ?", (lease.turn_id, signal)
                ).fetchone()
            ):
                # It landed between the wait's check and this suspend: wake at once.
                wake_at = time.time()
            conn.execute(
                "UPDATE turns SET status = ?, visible_at = ?, lease_owner = NULL,"
                " lease_expires_at = NULL, waiting_for = ?, attempt_floor = attempts"
                " WHERE turn_id = ?",
                (TurnStatus.WAITING, wake_at, waiting_for, lease.turn_id),
            )

    def send_signal(self, turn_id: str, name: str, payload: str) -> bool:
        with self._transaction(write=True) as conn:
            self._turn_row(conn, turn_id)
            inserted = conn.execute(
                "INSERT INTO signals (turn_id, name, payload, received_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (turn_id, name) DO NOTHING",
                (turn_id, name, payload, time.time()),
            ).rowcount
            conn.execute(
                "UPDATE turns SET visible_at = ? WHERE turn_id = ? AND status = ?",
                (time.time(), turn_id, TurnStatus.WAITING),
            )
            return inserted == 1

    def get_signal(self, turn_id: str, name: str) -> str | None:
        with self._transaction(write=False) as conn:
            row = conn.execute(
                "SELECT payload FROM signals WHERE turn_id = ? AND name = ?", (turn_id, name)
            ).fetchone()
            return None if row is None else str(row["payload"])

    def complete_turn(self, lease: Lease, result: str) -> None:
        self._finish_turn(lease, TurnStatus.DONE, result=result, error=None)

    def fail_turn(self, lease: Lease, error: str) -> None:
        self._finish_turn(lease, TurnStatus.FAILED, result=None, error=error)

    def _finish_turn(
        self, lease: Lease, status: TurnStatus, result: str | None, error: str | None
    ) -> None:
        with self._transaction(write=True) as conn:
            self._fence(conn, lease.turn_id, lease.epoch)
            conn.execute(
                "UPDATE turns SET status = ?, result = COALESCE(?, result),"
                " error = COALESCE(?, error), finished_at = ?, visible_at = NULL,"
                " lease_owner = NULL, lease_expires_at = NULL WHERE turn_id = ?",
                (status, result, error, time.time(), lease.turn_id),
            )

    # -- journal -------------------------------------------------------------------
    def load_steps(self, turn_id: str) -> list[Step]:
        with self._transaction(write=False) as conn:
            self._turn(conn, turn_id)
            rows = conn.execute(
                "SELECT * FROM steps WHERE turn_id = ? ORDER BY seq", (turn_id,)
            ).fetchall()
            return [step_from_row(row) for row in rows]

    def insert_intent(self, step: Step) -> None:
        if step.status != StepStatus.INTENT:
            raise WorldError(f"insert_intent takes a step in status intent, got {step.status}")
        # Its own transaction, committed (and fsynced: synchronous=FULL) before returning.
        with self._transaction(write=True) as conn:
            self._fence(conn, step.turn_id, step.epoch)
            taken = conn.execute(
                "SELECT seq, key FROM steps WHERE turn_id = ? AND (seq = ? OR key = ?)",
                (step.turn_id, step.seq, step.key),
            ).fetchone()
            if taken is not None:
                raise StepConflict(
                    f"turn {step.turn_id}: step seq {step.seq} / key {step.key!r} conflicts "
                    f"with the recorded step seq {taken['seq']} / key {taken['key']!r}"
                )
            row = dataclasses.asdict(step) | {
                "output": None,
                "output_blob": None,
                "finished_at": None,
                "started_at": step.started_at or time.time(),
                "meta": json.dumps(step.meta),
            }
            conn.execute(
                f"INSERT INTO steps ({', '.join(row)}) VALUES ({', '.join(':' + k for k in row)})",
                row,
            )

    def restart_intent(self, turn_id: str, seq: int, epoch: int) -> int:
        with self._transaction(write=True) as conn:
            self._fence(conn, turn_id, epoch)
            step = self._step(conn, turn_id, seq)
            if step.status != StepStatus.INTENT:
                raise StepConflict(
                    f"turn {turn_id}: step {seq} already has an outcome ({step.status})"
                )
            # started_at stays the first start: a wait's deadline is measured from it.
            conn.execute(
                "UPDATE steps SET attempts = attempts + 1, epoch = ? WHERE turn_id = ? AND seq = ?",
                (epoch, turn_id, seq),
            )
            return step.attempts + 1

    def finish_step(
        self,
        turn_id: str,
        seq: int,
        epoch: int,
        status: StepStatus,
        output: str | None,
        output_blob: str | None,
        meta: dict[str, Any],
    ) -> None:
        if status not in _OUTCOMES:
            raise WorldError(f"finish_step records done or possibly_ran, got {status}")
        with self._transaction(write=True) as conn:
            self._fence(conn, turn_id, epoch)
            step = self._step(conn, turn_id, seq)
            if step.status != StepStatus.INTENT:
                raise StepConflict(
                    f"turn {turn_id}: step {seq} already has an outcome ({step.status})"
                )
            # Merged, not replaced: what the intent recorded stays visible to `show`.
            merged = {**step.meta, **meta}
            conn.execute(
                "UPDATE steps SET status = ?, output = ?, output_blob = ?, epoch = ?,"
                " finished_at = ?, meta = ? WHERE turn_id = ? AND seq = ?",
                (status, output, output_blob, epoch, time.time(), json.dumps(merged), turn_id, seq),
            )

    def _step(self, conn: sqlite3.Connection, turn_id: str, seq: int) -> Step:
        row = conn.execute(
            "SELECT * FROM steps WHERE turn_id = ? AND seq = ?", (turn_id, seq)
        ).fetchone()
        if row is None:
            raise NotFound(f"turn {turn_id} has no step {seq}")
        return step_from_row(row)


# -- row decoding ---------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return  # directories cannot be opened for fsync on Windows
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _folder_of(url: str, data_dir: object) -> str:
    """The folder a ``local://`` or ``file://`` URL or a plain path names; it must agree
    with ``data_dir``."""
    path = url
    if "://" in url:
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost") or not parsed.path.strip("/"):
            raise ConfigError(
                f"{url!r}: a {parsed.scheme}:// World is a folder on this machine: write "
                f"{parsed.scheme}:///absolute/path (three slashes) or a plain path"
            )
        path = unquote(parsed.path)
    if data_dir is not None and Path(str(data_dir)) != Path(path):
        raise ConfigError(f"World {url!r} names a folder, but data_dir says {data_dir}")
    return path


def _open_advice(exc: sqlite3.Error) -> str:
    """What to do about a World file SQLite cannot open."""
    if "not a database" in str(exc) or "malformed" in str(exc):
        return f"it is not a durable-harness World or it is damaged: restore it, or {_OTHER_FOLDER}"
    return f"check that this user may read and write that folder, or {_OTHER_FOLDER}"
