"""The PostgreSQL World: many workers on many machines sharing one database.

Self-hosting takes two environment variables, ``DURABLE_HARNESS_WORLD=postgres`` and
``DURABLE_HARNESS_POSTGRES_URL=postgresql://USER:PASSWORD@HOST:5432/DBNAME``; the schema
(``postgres_schema.py``) is created and migrated on start.

How the contract is kept:

* **Queue.** ``jobs`` holds one row per unfinished turn (so "one message per turn" is a
  primary key) with its lease: ``status``, ``epoch``, ``attempts``, ``lease_owner``,
  ``visible_at``. ``claim`` takes the oldest visible job with ``FOR UPDATE SKIP LOCKED`` and
  leases it in the same statement; ending a turn deletes its job and copies the final
  attempts and epoch into ``turns``. Lease times are the database server's clock, so
  workers' clocks need not agree.
* **Fencing.** Every journal write carries its epoch and checks it in the same statement
  against the job row, which it locks ``FOR SHARE``: a claim (which updates that row) and
  a stale write are serialized, and a write that waited re-checks the new epoch. Multi-table
  writes lock ``jobs`` before ``turns`` (or ``steps``), always in that order, so two
  statements never deadlock.
* **Durability.** Each journal write is one autocommit statement, one round trip, durable
  when it returns (``synchronous_commit`` on, the server's default).
* **Wake-ups.** Creating, enqueueing and releasing a turn ``NOTIFY`` :data:`CHANNEL`;
  :meth:`PostgresWorld.wait_for_work` ``LISTEN`` s on a connection of its own.
* **Reconnection.** A failed connection is replaced and the operation retried for up to
  :data:`RECONNECT_SECONDS` (a server restart cuts every pooled connection). A write whose
  connection died may or may not have committed: each write's retry recognizes its own
  committed row as success (see the ``retried`` branches).

A World must not cross ``fork()``: open it in the process that uses it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from durable_harness.core.errors import (
    ConfigError,
    CorruptJournal,
    DurableHarnessError,
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
from durable_harness.core.types import Check, Lease, Session, Step, StepStatus, Turn, TurnStatus
from durable_harness.core.world import Outcome, World
from durable_harness.worlds import postgres_schema as schema
from durable_harness.worlds import postgres_sql as sql

log = logging.getLogger(__name__)

CHANNEL = schema.CHANNEL
#: How long an operation keeps trying to get a working connection back before it fails.
RECONNECT_SECONDS = 30.0
POOL_MAX_SIZE = 8  # the turn's thread, the lease renewal thread, doctor, a few spare
#: Blobs larger than this are looked up before they are sent, to skip re-sending a duplicate.
BLOB_PROBE_BYTES = 64 * 1024
#: The shortest wait for a job that is due: it is visible but was locked a moment ago.
MIN_WAIT_SECONDS = 0.02

_DIGEST = re.compile(r"[0-9a-f]{64}")
_T = TypeVar("_T")
Row = dict[str, Any]


class PostgresSettings(WorldSettings):
    """The database: ``DURABLE_HARNESS_POSTGRES_URL=postgresql://USER:PASSWORD@HOST/DB``."""

    postgres_url: str | None = None

    def world_options(self) -> dict[str, Any]:
        return {} if self.postgres_url is None else {"url": self.postgres_url}


class PostgresWorld(World):
    """A World in a PostgreSQL database; see the module docstring for how it works."""

    settings_model: ClassVar[type[WorldSettings]] = PostgresSettings

    @classmethod
    def from_options(cls, **options: Any) -> PostgresWorld:
        """``url`` (``postgresql://USER:PASSWORD@HOST:5432/DBNAME``) and ``max_attempts``."""
        url = options.pop("url", None)
        if not url:
            raise ConfigError(
                "the postgres World needs a database URL: set DURABLE_HARNESS_POSTGRES_URL="
                "postgresql://USER:PASSWORD@HOST:5432/DBNAME"
            )
        max_attempts = take_max_attempts("postgres", options)
        refuse_unknown_options("postgres", options)
        return cls(str(url), max_attempts=max_attempts)

    def __init__(self, url: str, max_attempts: int = 5) -> None:
        self.max_attempts = max_attempts
        self.where = schema.Where.of(url)
        self._url = url
        with schema.connect(url, self.where) as conn:  # one clear error for a bad URL
            self.schema_version = schema.migrate(conn, self.where)
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url,
            kwargs=schema.connection_kwargs(url),
            min_size=1,
            max_size=POOL_MAX_SIZE,
            open=False,
            configure=_configure,
            name="durable-harness",
            timeout=5.0,  # per try; _run keeps trying until RECONNECT_SECONDS
            reconnect_timeout=RECONNECT_SECONDS,
        )
        try:
            self._pool.open(wait=True, timeout=15.0)
        except PoolTimeout as exc:
            self._pool.close()
            raise WorldError(f"cannot open connections to PostgreSQL at {self.where}") from exc
        self._listener: psycopg.Connection[Any] | None = None
        self._listen_lock = threading.Lock()

    # -- connections -------------------------------------------------------------------
    def _run(self, what: str, op: Callable[[psycopg.Connection[Any], bool], _T]) -> _T:
        """Run ``op(conn, retried)`` on a pooled connection, retrying on a lost connection.

        ``retried`` is True when an earlier try failed with the connection: that try may
        have committed, and ``op`` must then accept its own committed write as success.
        """
        deadline = time.monotonic() + RECONNECT_SECONDS
        retried, pause = False, 0.05
        while True:
            try:
                with self._pool.connection() as conn:
                    return op(conn, retried)
            except PoolClosed as exc:
                raise WorldError(f"the PostgreSQL World at {self.where} is closed") from exc
            except psycopg.OperationalError as exc:
                # OperationalError covers a cut connection, the server shutting down or not
                # yet accepting connections, no connection free in time (PoolTimeout), and
                # serialization failures: all worth a retry.
                if time.monotonic() + pause > deadline:
                    raise WorldError(
                        f"PostgreSQL at {self.where} failed during {what} and did not come "
                        f"back within {RECONNECT_SECONDS:.0f}s: {_one_line(exc)}; check that the "
                        "server is running and DURABLE_HARNESS_POSTGRES_URL"
                    ) from exc
                log.warning("PostgreSQL %s failed (%s); retrying", what, _one_line(exc))
                if not retried:
                    with contextlib.suppress(psycopg.Error):
                        self._pool.check()  # a restart killed the idle connections too
                retried = True
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
            except DurableHarnessError:
                raise
            except psycopg.errors.InsufficientPrivilege as exc:
                user = self.where.user
                raise WorldError(
                    f"PostgreSQL World at {self.where}: {what}: {_one_line(exc)}; GRANT SELECT, "
                    f"INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA durable_harness TO {user} "
                    "(durable-harness doctor lists what is missing)"
                ) from exc
            except psycopg.Error as exc:
                raise WorldError(f"PostgreSQL World at {self.where}: {what}: {exc}") from exc

    def close(self) -> None:
        with self._listen_lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
        self._pool.close()

    # -- blobs -----------------------------------------------------------------------------
    def put_blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()

        def op(conn: psycopg.Connection[Any], retried: bool) -> str:
            if len(data) > BLOB_PROBE_BYTES and _one(conn, sql.BLOB_EXISTS, (digest,)):
                return digest
            conn.execute(sql.PUT_BLOB, (digest, data))
            return digest

        return self._run("put_blob", op)

    def get_blob(self, digest: str) -> bytes:
        if not _DIGEST.fullmatch(digest):
            raise NotFound(f"no blob {digest!r}: not a sha256 hex digest")
        row = self._run("get_blob", lambda c, _: _one(c, sql.GET_BLOB, (digest,)))
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
            return _one(conn, sql.CREATE_SESSION, params) or _one(
                conn, sql.GET_SESSION, (session_id,)
            )

        row = self._run("create_session", op)
        if row is None:
            raise WorldError(f"session {session_id!r} was neither created nor found")
        return sql.session_of(row)

    def get_session(self, session_id: str) -> Session:
        row = self._run("get_session", lambda c, _: _one(c, sql.GET_SESSION, (session_id,)))
        if row is None:
            raise NotFound(f"no session {session_id!r}")
        return sql.session_of(row)

    def list_sessions(self, limit: int = 100) -> list[Session]:
        rows = self._run("list_sessions", lambda c, _: _all(c, sql.LIST_SESSIONS, (limit,)))
        return [sql.session_of(row) for row in rows]

    def create_turn(
        self, session_id: str, turn_id: str, prompt: str, config: dict[str, Any]
    ) -> Turn:
        def op(conn: psycopg.Connection[Any], retried: bool) -> Turn:
            with conn.transaction():
                # Locking the session serializes turn creation in it, so the next index
                # read below cannot be taken by a concurrent create.
                if _one(conn, sql.LOCK_SESSION, (session_id,)) is None:
                    raise NotFound(f"no session {session_id!r}")
                existing = _one(conn, sql.GET_TURN, (turn_id,))
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
                row = _one(conn, sql.GET_TURN, (turn_id,))
            assert row is not None
            return sql.turn_of(row)

        return self._run("create_turn", op)

    def get_turn(self, turn_id: str) -> Turn:
        row = self._run("get_turn", lambda c, _: _one(c, sql.GET_TURN, (turn_id,)))
        if row is None:
            raise NotFound(f"no turn {turn_id!r}")
        return sql.turn_of(row)

    def list_turns(self, session_id: str | None = None, limit: int = 100) -> list[Turn]:
        if session_id is None:
            query, params = sql.LIST_TURNS, (limit,)
        else:
            query, params = sql.LIST_SESSION_TURNS, (session_id, limit)  # type: ignore[assignment]
        rows = self._run("list_turns", lambda c, _: _all(c, query, params))
        return [sql.turn_of(row) for row in rows]

    def has_unfinished_turns(self) -> bool:
        # A turn has a job row exactly while it is unfinished (the queue holds no history).
        row = self._run("has_unfinished_turns", lambda c, _: _one(c, sql.ANY_JOB))
        return row is not None

    def put_session_record(self, session_id: str, name: str, digest: str) -> None:
        params = (session_id, name, digest, session_id)
        row = self._run("put_session_record", lambda c, _: _one(c, sql.PUT_RECORD, params))
        if row is None:
            raise NotFound(f"no session {session_id!r}")

    def get_session_record(self, session_id: str, name: str) -> str | None:
        params = (session_id, name)
        row = self._run("get_session_record", lambda c, _: _one(c, sql.GET_RECORD, params))
        return None if row is None else str(row["digest"])

    # -- queue and leases ------------------------------------------------------------------
    def enqueue(self, turn_id: str, delay: float = 0.0) -> None:
        params = {"turn_id": turn_id, "delay": float(delay)}

        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            if _one(conn, sql.ENQUEUE_QUEUED, params) is not None:
                return
            # Enqueueing a failed turn is a manual retry: a new job, a fresh delivery budget.
            if _one(conn, sql.ENQUEUE_FAILED, params) is not None:
                return
            # running: the lease holder has the message; done: nothing is left to deliver.
            if _one(conn, sql.GET_TURN, (turn_id,)) is None:
                raise NotFound(f"no turn {turn_id!r}")

        self._run("enqueue", op)

    def claim(self, owner: str, lease_seconds: float) -> Lease | None:
        params = {"owner": owner, "lease": float(lease_seconds), "max": self.max_attempts}

        # A claim lost with its connection is not retried as such: its lease simply runs
        # out, the attempt it counted is spent, and the turn is delivered again.
        def op(conn: psycopg.Connection[Any], retried: bool) -> Lease | None:
            while True:
                row = _one(conn, sql.CLAIM, params)
                if row is None:
                    return None
                if row["epoch"] is not None:
                    return sql.lease_of(row, owner)
                self._dead_letter(conn, row["turn_id"], force=False)

        return self._run("claim", op)

    def claim_turn(
        self, turn_id: str, owner: str, lease_seconds: float, force: bool = False
    ) -> Lease | None:
        params = {
            "turn_id": turn_id,
            "owner": owner,
            "lease": float(lease_seconds),
            "max": self.max_attempts,
            "force": force,
        }

        def op(conn: psycopg.Connection[Any], retried: bool) -> Lease | None:
            row = _one(conn, sql.CLAIM_TURN, params)
            if row is not None:
                return sql.lease_of(row, owner)
            if self._dead_letter(conn, turn_id, force=force):
                return None
            if _one(conn, sql.GET_TURN, (turn_id,)) is None:
                raise NotFound(f"no turn {turn_id!r}")
            return None  # finished, held by a live lease, or not visible yet

        return self._run("claim_turn", op)

    def _dead_letter(self, conn: psycopg.Connection[Any], turn_id: str, force: bool) -> bool:
        """Fail a deliverable turn that used up its deliveries; the epoch moves on too, so
        a zombie still holding its expired lease is fenced out. Idempotent."""
        params = {"turn_id": turn_id, "max": self.max_attempts, "force": force}
        return _one(conn, sql.DEAD_LETTER, params) is not None

    def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        params = {"turn_id": lease.turn_id, "epoch": lease.epoch, "lease": float(lease_seconds)}

        def op(conn: psycopg.Connection[Any], retried: bool) -> Lease:
            row = _one(conn, sql.RENEW, params)
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
            if _one(conn, sql.RELEASE, params) is not None:
                return
            turn = _one(conn, sql.GET_TURN, (lease.turn_id,))
            if retried and turn is not None and _is(turn, "queued", lease.epoch):
                return  # our release committed before the connection died
            raise self._fence_error(conn, lease.turn_id, lease.epoch)

        self._run("release", op)

    def complete_turn(self, lease: Lease, result: str) -> None:
        self._finish_turn(lease, TurnStatus.DONE, result=result, error=None)

    def fail_turn(self, lease: Lease, error: str) -> None:
        self._finish_turn(lease, TurnStatus.FAILED, result=None, error=error)

    def _finish_turn(
        self, lease: Lease, status: TurnStatus, result: str | None, error: str | None
    ) -> None:
        params = {
            "turn_id": lease.turn_id,
            "epoch": lease.epoch,
            "status": status.value,
            "result": result,
            "error": error,
        }

        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            if _one(conn, sql.FINISH_TURN, params) is not None:
                return
            turn = _one(conn, sql.GET_TURN, (lease.turn_id,))
            if retried and turn is not None and _is(turn, status.value, lease.epoch):
                return  # our write committed before the connection died
            raise self._fence_error(conn, lease.turn_id, lease.epoch)

        self._run(f"{status.value} turn", op)

    # -- durable waits -------------------------------------------------------------------
    def suspend(
        self, lease: Lease, wake_at: float, waiting_for: str, signal: str | None = None
    ) -> None:
        params = {
            "turn_id": lease.turn_id,
            "waiting_for": waiting_for,
            "signal": signal,
            "wake_at": float(wake_at),
        }

        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            with conn.transaction():
                if _one(conn, sql.LOCK_RUNNING_JOB, (lease.turn_id, lease.epoch)) is not None:
                    _one(conn, sql.SUSPEND, params)
                    return
            turn = _one(conn, sql.GET_TURN, (lease.turn_id,))
            if retried and turn is not None and _is(turn, "waiting", lease.epoch):
                return  # our suspend committed before the connection died
            raise self._fence_error(conn, lease.turn_id, lease.epoch)

        self._run("suspend", op)

    def send_signal(self, turn_id: str, name: str, payload: str) -> bool:
        def op(conn: psycopg.Connection[Any], retried: bool) -> bool:
            with conn.transaction():
                if _one(conn, sql.GET_TURN, (turn_id,)) is None:
                    raise NotFound(f"no turn {turn_id!r}")
                _one(conn, sql.LOCK_JOB, (turn_id,))  # none once the turn ended
                if _one(conn, sql.INSERT_SIGNAL, (turn_id, name, payload)) is None:
                    # A duplicate, unless it is our own insert whose reply was lost.
                    row = _one(conn, sql.GET_SIGNAL, (turn_id, name))
                    return bool(retried and row is not None and row["payload"] == payload)
                _one(conn, sql.WAKE, (turn_id,))
                return True

        return self._run("send_signal", op)

    def get_signal(self, turn_id: str, name: str) -> str | None:
        row = self._run("get_signal", lambda c, _: _one(c, sql.GET_SIGNAL, (turn_id, name)))
        return None if row is None else str(row["payload"])

    def _fence_error(self, conn: psycopg.Connection[Any], turn_id: str, epoch: int) -> Exception:
        """Why a fenced write on ``turn_id`` matched no row: LeaseLost, or NotFound."""
        turn = _one(conn, sql.GET_TURN, (turn_id,))
        if turn is None:
            return NotFound(f"no turn {turn_id!r}")
        return LeaseLost(
            f"turn {turn_id}: a write with lease epoch {epoch} was refused; the turn is "
            f"{turn['status']} at epoch {turn['epoch']} (another worker took it over)"
        )

    def wait_for_work(self, timeout: float) -> None:
        """Return when a turn was created, enqueued or released (``NOTIFY``), when the
        next delayed job or expiring lease becomes deliverable, or after ``timeout``.

        The first call only starts listening and returns at once, so that the caller
        looks at the queue again: a notification sent before ``LISTEN`` would be lost.
        """
        with self._listen_lock:
            listener = self._listener
            try:
                if listener is None or listener.closed:
                    self._listener = schema.connect(self._url, self.where)
                    self._listener.execute(f"LISTEN {CHANNEL}")
                    return
                # Nothing notifies when a lease runs out: sleep until it does (a dead
                # worker's turn is redelivered at its lease's end, not at the next poll).
                # The floor keeps a job that is visible but locked from causing a spin.
                row = listener.execute(sql.NEXT_VISIBLE).fetchone()
                if row is not None and row[0] is not None:
                    timeout = min(timeout, max(float(row[0]), MIN_WAIT_SECONDS))
                if any(True for _ in listener.notifies(timeout=timeout, stop_after=1)):
                    for _ in listener.notifies(timeout=0.0):  # drain: one wake-up is enough
                        pass
                return
            except (psycopg.Error, DurableHarnessError) as exc:
                log.warning("listening for new turns failed (%s); polling", _one_line(exc))
                if self._listener is not None:
                    self._listener.close()
                self._listener = None
        time.sleep(timeout)

    # -- journal ---------------------------------------------------------------------------
    def load_steps(self, turn_id: str) -> list[Step]:
        rows = self._run("load_steps", lambda c, _: _all(c, sql.LOAD_STEPS, (turn_id,)))
        if not rows:
            raise NotFound(f"no turn {turn_id!r}")
        return [sql.step_of(row) for row in rows if row["seq"] is not None]

    def insert_intent(self, step: Step) -> None:
        if step.status != StepStatus.INTENT:
            raise WorldError(f"insert_intent takes a step in status intent, got {step.status}")
        params = {
            "turn_id": step.turn_id,
            "seq": step.seq,
            "key": step.key,
            "kind": step.kind,
            "name": step.name,
            "input_hash": step.input_hash,
            "input": step.input,
            "attempts": step.attempts,
            "epoch": step.epoch,
            "started_at": step.started_at or time.time(),
            "meta": Jsonb(step.meta),
        }

        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            if _one(conn, sql.INSERT_INTENT, params) is not None:
                return
            fence = _one(conn, sql.FENCE, (step.turn_id, step.epoch))
            if fence is None:
                raise self._fence_error(conn, step.turn_id, step.epoch)
            taken = _one(conn, sql.CONFLICTING_STEP, (step.turn_id, step.seq, step.key))
            if taken is None:  # the conflicting row vanished: impossible, steps are kept
                raise WorldError(f"turn {step.turn_id}: step {step.seq} was not recorded")
            if retried and all(
                taken[k] == params[k] for k in ("seq", "key", "kind", "name", "input_hash", "epoch")
            ):
                # The connection died after the first try committed: the row is ours. While
                # we hold this epoch (just checked) nobody else writes it, and a row from an
                # earlier epoch would carry that epoch. Without a retry the same row is a
                # caller inserting one step twice: a bug to report, below.
                return
            raise StepConflict(
                f"turn {step.turn_id}: step seq {step.seq} / key {step.key!r} conflicts "
                f"with the recorded step seq {taken['seq']} / key {taken['key']!r}"
            )

        self._run("insert_intent", op)

    def restart_intent(self, turn_id: str, seq: int, epoch: int) -> int:
        # started_at stays the first start: a wait's deadline is measured from it.
        params = {"turn_id": turn_id, "seq": seq, "epoch": epoch}

        # Not made exact on retry: if the first try committed, attempts counts one more
        # run than happened (it only informs `show`; it never decides anything).
        def op(conn: psycopg.Connection[Any], retried: bool) -> int:
            row = _one(conn, sql.RESTART_INTENT, params)
            if row is not None:
                return int(row["attempts"])
            raise self._step_write_error(conn, turn_id, seq, epoch)

        return self._run("restart_intent", op)

    def record_outcome(self, turn_id: str, seq: int, epoch: int, outcome: Outcome) -> None:
        params = {
            "turn_id": turn_id,
            "seq": seq,
            "epoch": epoch,
            "status": outcome.status.value,
            "output": outcome.output,
            "output_blob": outcome.output_blob,
            "meta": Jsonb(outcome.meta),  # merged into the intent's meta: what it recorded stays
            "now": time.time(),
        }

        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            if _one(conn, sql.FINISH_STEP, params) is not None:
                return
            if retried:
                row = _one(conn, sql.GET_STEP, (turn_id, seq))
                if row is not None and all(
                    row[k] == params[k] for k in ("status", "output", "output_blob", "epoch")
                ):
                    return  # the first try committed; only its reply was lost
            raise self._step_write_error(conn, turn_id, seq, epoch)

        self._run("finish_step", op)

    def _step_write_error(
        self, conn: psycopg.Connection[Any], turn_id: str, seq: int, epoch: int
    ) -> Exception:
        """Why a fenced write of step ``seq`` matched no row, checked in the local World's
        order: the lease, then the step's existence, then its status."""
        if _one(conn, sql.FENCE, (turn_id, epoch)) is None:
            return self._fence_error(conn, turn_id, epoch)
        row = _one(conn, sql.GET_STEP, (turn_id, seq))
        if row is None:
            return NotFound(f"turn {turn_id} has no step {seq}")
        return StepConflict(f"turn {turn_id}: step {seq} already has an outcome ({row['status']})")

    # -- health ----------------------------------------------------------------------------
    def doctor(self) -> list[Check]:
        """Server and schema version, permissions, the queue, LISTEN/NOTIFY, then the
        default blob and turn round trips. Never raises: a failure is a failed check."""
        try:
            checks = self._run("doctor", lambda c, _: schema.doctor_checks(c, self.where))
        except DurableHarnessError as exc:
            checks = [Check("server", False, str(exc))]
        notify = schema.notify_check(
            self._url,
            self.where,
            lambda channel: self._run("doctor", lambda c, _: c.execute(f"NOTIFY {channel}")),
        )
        return [*checks, notify, *super().doctor()]


# -- helpers ------------------------------------------------------------------------------
def _configure(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        f"SET idle_in_transaction_session_timeout = '{schema.IDLE_IN_TRANSACTION_TIMEOUT}'"
    )


def _one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Row | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchone()


def _all(conn: psycopg.Connection[Any], query: str, params: Any = None) -> list[Row]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall()


def _is(turn: Row, status: str, epoch: int) -> bool:
    return bool(turn["status"] == status and turn["epoch"] == epoch)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
