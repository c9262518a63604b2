"""The PostgreSQL World: many workers on many machines sharing one database.

Self-hosting takes two environment variables, ``DURABLE_HARNESS_WORLD=postgres`` and
``DURABLE_HARNESS_POSTGRES_URL=postgresql://USER:PASSWORD@HOST:5432/DBNAME``; the schema
(:mod:`.schema`; the statements are in :mod:`.sql`) is created and migrated on start.

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
  :meth:`PostgresWorld.wait_for_work` ``LISTEN`` s on a connection of its own. Appending
  an event notifies :data:`EVENTS_CHANNEL` (its own, so workers sleep through streamed
  text), which :meth:`PostgresWorld.wait_for_events` hears the same way (:mod:`.listener`).
* **Events.** A turn's appends are serialized on its ``event_heads`` row, bumped in the
  statement that inserts the event, so seqs are gap-free and become visible in order
  (:mod:`.events`).
* **Reconnection.** A failed connection is replaced and the operation retried for up to
  :data:`RECONNECT_SECONDS` (a server restart cuts every pooled connection). A write whose
  connection died may or may not have committed: each write's retry recognizes its own
  committed row as success (see the ``retried`` branches).

The World is composed of its facets, one module each: :mod:`.connections` (the pool and
the retrying ``_run`` every facet's operation goes through), :mod:`.catalog` (blobs,
sessions, turns), :mod:`.queue` (jobs, leases, waits), :mod:`.journal` (steps),
:mod:`.events` (the event log), :mod:`.tenancy` (API tokens, owners, rate counters) and
:mod:`.retention` (what ``gc`` removes).

A World must not cross ``fork()``: open it in the process that uses it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from durable_harness.core.errors import (
    ConfigError,
    DurableHarnessError,
    WorldError,
)
from durable_harness.core.settings import (
    WorldSettings,
    refuse_unknown_options,
    take_max_attempts,
)
from durable_harness.core.types import Check
from durable_harness.core.world import World
from durable_harness.worlds.postgres import connections, schema
from durable_harness.worlds.postgres.catalog import BLOB_PROBE_BYTES, PostgresCatalog
from durable_harness.worlds.postgres.connections import RECONNECT_SECONDS
from durable_harness.worlds.postgres.events import PostgresEventLog
from durable_harness.worlds.postgres.holder import Holder
from durable_harness.worlds.postgres.journal import PostgresJournal
from durable_harness.worlds.postgres.listener import Listener
from durable_harness.worlds.postgres.queue import CHANNEL, MIN_WAIT_SECONDS, PostgresQueue
from durable_harness.worlds.postgres.retention import PostgresRetention
from durable_harness.worlds.postgres.schema import EVENTS_CHANNEL
from durable_harness.worlds.postgres.tenancy import PostgresTenancy

__all__ = [
    "BLOB_PROBE_BYTES",
    "CHANNEL",
    "EVENTS_CHANNEL",
    "MIN_WAIT_SECONDS",
    "POOL_MAX_SIZE",
    "RECONNECT_SECONDS",
    "PostgresSettings",
    "PostgresWorld",
]

POOL_MAX_SIZE = 8  # the turn's thread, the lease renewal thread, doctor, a few spare


class PostgresSettings(WorldSettings):
    """The database: ``DURABLE_HARNESS_POSTGRES_URL=postgresql://USER:PASSWORD@HOST/DB``."""

    postgres_url: str | None = None

    def world_options(self) -> dict[str, Any]:
        return {} if self.postgres_url is None else {"url": self.postgres_url}


class PostgresWorld(
    PostgresCatalog,
    PostgresQueue,
    PostgresJournal,
    PostgresEventLog,
    PostgresTenancy,
    PostgresRetention,
    World,
):
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
            reconnect_timeout=connections.RECONNECT_SECONDS,
        )
        try:
            self._pool.open(wait=True, timeout=15.0)
        except PoolTimeout as exc:
            self._pool.close()
            raise WorldError(f"cannot open connections to PostgreSQL at {self.where}") from exc
        self._holder = Holder(url, self.where)
        self._claimed_with = {}
        self._work_listener = Listener(url, self.where, CHANNEL)
        self._event_listener = Listener(url, self.where, EVENTS_CHANNEL)

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


def _configure(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        f"SET idle_in_transaction_session_timeout = '{schema.IDLE_IN_TRANSACTION_TIMEOUT}'"
    )
