"""The PostgreSQL World's schema, its migrations, and its connection errors.

Everything lives in the schema ``durable_harness`` (created on first start), so the World
shares a database with other applications without touching their tables::

    sessions         session_id, created_at, meta (jsonb)
    turns            the durable record of a turn: prompt, config, final status/result/error
    jobs             the queue: one row per unfinished turn, holding its lease and epoch
    steps            the journal: PRIMARY KEY (turn_id, seq), UNIQUE (turn_id, key)
    signal_log       (turn_id, name, idx) -> payload, delivery id, the wait that took it
    watches          (scope, turn_id, name) -> the ref (commit or branch) webhooks match
    events           the event log: PRIMARY KEY (turn_id, seq), UNIQUE (turn_id, key)
    event_heads      turn_id -> the last event seq: the row lock that orders appends
    api_tokens       serve's tokens: token_id -> tenant, sha256 of the secret, revoked_at
    owners           (kind, item_id) -> the tenant owning a session or turn
    rate_counts      (bucket, window_s, window_no) -> uses counted in that window
    blobs            content-addressed payloads (bytea), PRIMARY KEY digest, touched_at
    session_records  (session_id, name) -> blob digest
    turn_view        turns joined with their job: what ``get_turn`` returns
    schema_version   one row per applied migration

Migrations are append-only and numbered by position; a start applies the missing ones in
one transaction under an advisory lock, so workers starting at once migrate exactly once,
and a database whose schema is newer than this code is refused rather than misread.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import conninfo

from durable_harness.core.errors import ConfigError, DurableHarnessError, WorldError
from durable_harness.core.migrations import apply_migrations
from durable_harness.core.types import Check

SCHEMA = "durable_harness"
#: NOTIFY channel: a turn may have become claimable (created, enqueued, released).
CHANNEL = "durable_harness_work"
#: NOTIFY channel: an event was appended (the payload is its turn id). Apart from
#: :data:`CHANNEL`, so idle workers are not woken by every piece of streamed text.
EVENTS_CHANNEL = "durable_harness_events"
#: Key of the transaction-level advisory lock that serializes migrations.
MIGRATION_LOCK = 0x6475726162_6C65  # "durable" in ASCII: any fixed bigint would do
MIN_SERVER_VERSION = 120000  # PostgreSQL 12
#: Seconds a client may sit idle inside a transaction before the server ends its session:
#: a worker frozen mid-transaction (SIGSTOP, a paused VM) must not hold row locks forever.
IDLE_IN_TRANSACTION_TIMEOUT = "10s"

# Append-only: a migration that shipped is never edited, only followed by a new entry.
# Its position (1-based) is the schema version recorded in `schema_version`.
MIGRATIONS: list[tuple[str, tuple[str, ...]]] = [
    (
        "initial schema",
        (
            # The server's clock, in Unix seconds: leases and visibility are compared with
            # one clock however many machines the workers run on. STABLE (now() is the
            # transaction's start), so comparisons with it can use an index.
            """CREATE FUNCTION durable_harness.epoch_now() RETURNS double precision
               LANGUAGE sql STABLE AS $$ SELECT extract(epoch FROM now())::double precision $$""",
            """CREATE TABLE durable_harness.sessions (
                session_id text PRIMARY KEY,
                created_at double precision NOT NULL,
                meta jsonb NOT NULL DEFAULT '{}',
                id bigint GENERATED ALWAYS AS IDENTITY UNIQUE)""",
            "CREATE INDEX sessions_newest ON durable_harness.sessions (created_at DESC, id DESC)",
            # status: 'open' while the turn has a job; 'done' or 'failed' once it ended, when
            # attempts and epoch are copied here from the job that is deleted.
            """CREATE TABLE durable_harness.turns (
                turn_id text PRIMARY KEY,
                session_id text NOT NULL REFERENCES durable_harness.sessions (session_id),
                idx integer NOT NULL,
                prompt text NOT NULL,
                status text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'done', 'failed')),
                config jsonb NOT NULL DEFAULT '{}',
                created_at double precision NOT NULL,
                attempts integer NOT NULL DEFAULT 0,
                epoch bigint NOT NULL DEFAULT 0,
                result text,
                error text,
                finished_at double precision,
                id bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
                UNIQUE (session_id, idx))""",
            "CREATE INDEX turns_newest ON durable_harness.turns (created_at DESC, id DESC)",
            # The queue holds only unfinished turns, so claims never wade through history.
            # A row is deliverable when visible_at has passed: a queued message, a parked
            # turn whose timer fired or signal came, or a running turn whose lease ran out
            # (visible_at follows lease_expires_at, as SQS's visibility timeout does). The
            # one index is on the claim order; renewals change only unindexed columns, so
            # they are HOT updates (hence the low fillfactor). Deliveries up to the last
            # deliberate suspend (attempt_floor) do not count toward dead-lettering.
            """CREATE TABLE durable_harness.jobs (
                turn_id text PRIMARY KEY REFERENCES durable_harness.turns (turn_id),
                turn_no bigint NOT NULL,
                status text NOT NULL CHECK (status IN ('queued', 'running', 'waiting')),
                visible_at double precision NOT NULL,
                attempts integer NOT NULL DEFAULT 0,
                attempt_floor integer NOT NULL DEFAULT 0,
                epoch bigint NOT NULL DEFAULT 0,
                lease_owner text,
                lease_expires_at double precision,
                waiting_for text) WITH (fillfactor = 50)""",
            "CREATE INDEX jobs_claim_order ON durable_harness.jobs (turn_no)",
            """CREATE TABLE durable_harness.steps (
                turn_id text NOT NULL REFERENCES durable_harness.turns (turn_id),
                seq integer NOT NULL,
                key text NOT NULL,
                kind text NOT NULL,
                name text NOT NULL,
                input_hash text NOT NULL,
                input text,
                status text NOT NULL,
                output text,
                output_blob text,
                attempts integer NOT NULL DEFAULT 1,
                epoch bigint NOT NULL,
                started_at double precision NOT NULL,
                finished_at double precision,
                meta jsonb NOT NULL DEFAULT '{}',
                PRIMARY KEY (turn_id, seq),
                UNIQUE (turn_id, key))""",
            """CREATE TABLE durable_harness.blobs (
                digest text PRIMARY KEY,
                data bytea NOT NULL)""",
            # Signals for durable waits: the first payload of a name wins.
            """CREATE TABLE durable_harness.signals (
                turn_id text NOT NULL REFERENCES durable_harness.turns (turn_id),
                name text NOT NULL,
                payload text NOT NULL,
                received_at double precision NOT NULL,
                PRIMARY KEY (turn_id, name))""",
            """CREATE TABLE durable_harness.session_records (
                session_id text NOT NULL REFERENCES durable_harness.sessions (session_id),
                name text NOT NULL,
                digest text NOT NULL,
                PRIMARY KEY (session_id, name))""",
            """CREATE VIEW durable_harness.turn_view AS
               SELECT t.turn_id, t.session_id, t.idx, t.prompt,
                      COALESCE(j.status, t.status) AS status, t.config, t.created_at,
                      COALESCE(j.attempts, t.attempts) AS attempts,
                      COALESCE(j.epoch, t.epoch) AS epoch,
                      j.lease_owner, j.lease_expires_at, j.visible_at, j.waiting_for,
                      t.result, t.error, t.finished_at, t.id
               FROM durable_harness.turns t LEFT JOIN durable_harness.jobs j USING (turn_id)""",
        ),
    ),
    (
        "ordered signals and webhook watches",
        (
            # Every delivery of a name is kept, in order; a wait takes the first one no
            # earlier wait took (claimed_by: its step's seq). The one signal an older World
            # kept per name becomes the first of its name.
            """CREATE TABLE durable_harness.signal_log (
                turn_id text NOT NULL REFERENCES durable_harness.turns (turn_id),
                name text NOT NULL,
                idx integer NOT NULL,
                delivery_id text NOT NULL,
                payload text NOT NULL,
                received_at double precision NOT NULL,
                claimed_by integer,
                PRIMARY KEY (turn_id, name, idx),
                UNIQUE (turn_id, name, delivery_id))""",
            """INSERT INTO durable_harness.signal_log
                   (turn_id, name, idx, delivery_id, payload, received_at)
               SELECT turn_id, name, 0, 'legacy', payload, received_at
               FROM durable_harness.signals""",
            "DROP TABLE durable_harness.signals",
            """CREATE TABLE durable_harness.watches (
                scope text NOT NULL,
                turn_id text NOT NULL REFERENCES durable_harness.turns (turn_id),
                name text NOT NULL,
                ref text NOT NULL,
                PRIMARY KEY (scope, turn_id, name))""",
            "CREATE INDEX watches_ref ON durable_harness.watches (scope, ref)",
        ),
    ),
    (
        "event log, api tokens, owners, rate counters, cancelled turns",
        (
            # The name PostgreSQL gave the inline CHECK of the initial schema.
            """ALTER TABLE durable_harness.turns DROP CONSTRAINT turns_status_check,
               ADD CONSTRAINT turns_status_check
               CHECK (status IN ('open', 'done', 'failed', 'cancelled'))""",
            # One row per turn with events: the last seq handed out. Each append bumps it,
            # so the row lock it takes serializes a turn's appends (seq n commits before
            # n + 1 is numbered: readers see the log in seq order, without gaps). A table of
            # its own, narrow and with its one index on turn_id, keeps those updates HOT
            # and off the wide, many-indexed turns row.
            """CREATE TABLE durable_harness.event_heads (
                turn_id text PRIMARY KEY REFERENCES durable_harness.turns (turn_id),
                seq bigint NOT NULL) WITH (fillfactor = 50)""",
            # data is canonical JSON in a text column, not jsonb: jsonb refuses the escapes
            # of NUL and of a lone surrogate, which a model's streamed text may hold. No
            # foreign key: its check would lock the turn's row at every event; the head
            # row, which every append updates first, references the turn.
            """CREATE TABLE durable_harness.events (
                turn_id text NOT NULL,
                seq bigint NOT NULL,
                key text NOT NULL,
                kind text NOT NULL,
                data text NOT NULL,
                at double precision NOT NULL,
                epoch bigint,
                PRIMARY KEY (turn_id, seq),
                CONSTRAINT events_once_per_key UNIQUE (turn_id, key))""",
            # Only the sha256 of a token's secret is stored.
            """CREATE TABLE durable_harness.api_tokens (
                token_id text PRIMARY KEY,
                tenant text NOT NULL,
                digest text NOT NULL,
                created_at double precision NOT NULL,
                operator boolean NOT NULL DEFAULT false,
                label text NOT NULL DEFAULT '',
                revoked_at double precision)""",
            # COLLATE "C": ids page in code point order, as in every other World, whatever
            # the database's collation.
            """CREATE TABLE durable_harness.owners (
                kind text NOT NULL,
                item_id text COLLATE "C" NOT NULL,
                tenant text NOT NULL,
                created_at double precision NOT NULL,
                PRIMARY KEY (kind, item_id))""",
            """CREATE INDEX owners_newest
               ON durable_harness.owners (tenant, kind, created_at DESC, item_id DESC)""",
            # One row per bucket and window (window_no: the database clock divided by
            # window_s); a bucket's earlier windows are deleted when it counts in a new one.
            """CREATE TABLE durable_harness.rate_counts (
                bucket text NOT NULL,
                window_s double precision NOT NULL,
                window_no bigint NOT NULL,
                count integer NOT NULL,
                PRIMARY KEY (bucket, window_s, window_no))""",
        ),
    ),
    (
        "lease holders",
        # The advisory lock key of the claiming process's holder connection
        # (worlds/postgres/holder.py): a turn whose holder's lock is free is taken over.
        ("ALTER TABLE durable_harness.jobs ADD COLUMN IF NOT EXISTS holder_key bigint",),
    ),
    (
        "blob touch times",
        # When put_blob last wrote or reused the blob (worlds/postgres/retention.py): gc
        # sweeps only blobs untouched since its cutoff. Blobs from before are 0: old.
        (
            """ALTER TABLE durable_harness.blobs
               ADD COLUMN touched_at double precision NOT NULL DEFAULT 0""",
        ),
    ),
]


@dataclass(frozen=True)
class Where:
    """Where the World is, for messages: never the password."""

    host: str
    port: str
    dbname: str
    user: str

    @classmethod
    def of(cls, url: str) -> Where:
        try:
            params = conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            reason = _one_line(str(exc))
            password = _password_in(url)
            if password:
                reason = reason.replace(password, "***")
            raise ConfigError(
                f"DURABLE_HARNESS_POSTGRES_URL is not a valid PostgreSQL URL ({reason}); "
                "write it as postgresql://USER:PASSWORD@HOST:5432/DBNAME"
            ) from None
        return cls(
            host=str(params.get("host") or "localhost"),
            port=str(params.get("port") or "5432"),
            dbname=str(params.get("dbname") or params.get("user") or "postgres"),
            user=str(params.get("user") or "(default user)"),
        )

    @property
    def server(self) -> str:
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.server}/{self.dbname}"


def connect_error(exc: psycopg.Error, where: Where) -> DurableHarnessError:
    """One line saying what is wrong with the URL or the server, and what to do."""
    message = str(exc)
    reason = _one_line(message.rsplit("failed: ", 1)[-1].removeprefix("FATAL:").strip())
    if "password authentication failed" in message or "no password supplied" in message:
        return ConfigError(
            f"PostgreSQL at {where.server} refused user {where.user}: {reason}; check the user "
            "and password in DURABLE_HARNESS_POSTGRES_URL"
        )
    if re.search(r'database ".*" does not exist', message):
        return ConfigError(
            f"database {where.dbname} does not exist on PostgreSQL at {where.server}; create "
            f"it with createdb {where.dbname} (or CREATE DATABASE {where.dbname})"
        )
    if re.search(r'role ".*" does not exist', message):
        return ConfigError(
            f"PostgreSQL at {where.server} has no user {where.user}; create it with "
            f"createuser --pwprompt {where.user}, or fix DURABLE_HARNESS_POSTGRES_URL"
        )
    if "permission denied" in message or "not permitted" in message:
        return ConfigError(
            f"PostgreSQL at {where.server} does not let {where.user} connect to "
            f"{where.dbname}: {reason}; GRANT CONNECT ON DATABASE {where.dbname} TO {where.user}"
        )
    return WorldError(
        f"cannot reach PostgreSQL at {where.server}: {reason}; check "
        "DURABLE_HARNESS_POSTGRES_URL and that the server is running"
    )


def connection_kwargs(url: str) -> dict[str, Any]:
    """What every connection of the World sets, unless the URL already says otherwise."""
    given = conninfo.conninfo_to_dict(url)
    kwargs: dict[str, Any] = {"autocommit": True}
    if "application_name" not in given:
        kwargs["application_name"] = "durable-harness"  # names our sessions in pg_stat_activity
    if "connect_timeout" not in given:
        kwargs["connect_timeout"] = 10
    return kwargs


def connect(url: str, where: Where) -> psycopg.Connection[Any]:
    """A new autocommit connection; a failure becomes a one-line :func:`connect_error`."""
    try:
        conn = psycopg.connect(url, **connection_kwargs(url))
    except psycopg.OperationalError as exc:
        raise connect_error(exc, where) from None
    if conn.info.server_version < MIN_SERVER_VERSION:
        version = conn.info.parameter_status("server_version") or conn.info.server_version
        conn.close()
        raise ConfigError(
            f"PostgreSQL at {where.server} is version {version!s}; durable-harness needs "
            "PostgreSQL 12 or newer"
        )
    conn.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}'")
    return conn


def schema_version(conn: psycopg.Connection[Any]) -> int | None:
    """The applied schema version, or ``None`` when the World was never created here."""
    row = conn.execute(
        "SELECT to_regclass('durable_harness.schema_version') IS NOT NULL"
    ).fetchone()
    if row is None or not row[0]:
        return None
    row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM durable_harness.schema_version")
    found = row.fetchone()
    return int(found[0]) if found is not None else 0


def migrate(conn: psycopg.Connection[Any], where: Where) -> int:
    """Bring the schema up to date; return its version. Safe when workers start at once.

    An up-to-date schema costs one query and takes no lock, so a user without DDL rights
    can run workers once an administrator (or the first worker) created the schema.
    """
    current = schema_version(conn)
    _refuse_newer(current, where)
    if current == len(MIGRATIONS):
        return current
    try:
        with conn.transaction():
            # Transaction-level: released by COMMIT or ROLLBACK, even if we die here.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            if conn.execute("SELECT to_regnamespace(%s)", (SCHEMA,)).fetchone() == (None,):
                conn.execute("CREATE SCHEMA durable_harness")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS durable_harness.schema_version ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at double precision NOT NULL)"
            )
            current = schema_version(conn) or 0
            _refuse_newer(current, where)
            apply_migrations(
                MIGRATIONS,
                current,
                conn.execute,
                "INSERT INTO durable_harness.schema_version (version, name, applied_at)"
                " VALUES (%s, %s, %s)",
            )
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ConfigError(
            f"user {where.user} may not create the durable_harness schema in database "
            f"{where.dbname} ({_one_line(str(exc))}); run GRANT CREATE ON DATABASE "
            f"{where.dbname} TO {where.user}, or start one worker once as the database owner"
        ) from None
    return len(MIGRATIONS)


def _refuse_newer(current: int | None, where: Where) -> None:
    if current is not None and current > len(MIGRATIONS):
        raise WorldError(
            f"the PostgreSQL World at {where} has schema version {current}, but this "
            f"durable-harness knows only up to {len(MIGRATIONS)}: upgrade durable-harness "
            "(on every machine that runs a worker) to use it"
        )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _password_in(url: str) -> str | None:
    match = re.match(r"^[a-z]+://[^:/@]*:([^@]*)@", url)
    return match.group(1) if match else None


def doctor_checks(conn: psycopg.Connection[Any], where: Where) -> list[Check]:
    """Server version, schema version, table permissions and the queue's state."""
    checks: list[Check] = []
    number = conn.info.server_version
    version = conn.info.parameter_status("server_version") or str(number)
    ok = number >= MIN_SERVER_VERSION
    checks.append(
        Check(
            "server",
            ok,
            f"PostgreSQL {version} at {where} as {where.user}"
            + ("" if ok else "; durable-harness needs PostgreSQL 12 or newer"),
        )
    )
    current = schema_version(conn)
    if current == len(MIGRATIONS):
        checks.append(Check("schema", True, f"schema version {current} (up to date)"))
    elif current is None or current < len(MIGRATIONS):
        checks.append(
            Check(
                "schema",
                False,
                f"schema version {current or 0}, this durable-harness needs "
                f"{len(MIGRATIONS)}: start one worker (as a user allowed to create tables) "
                "to migrate it",
            )
        )
    else:
        checks.append(
            Check(
                "schema",
                False,
                f"schema version {current} is newer than this durable-harness "
                f"({len(MIGRATIONS)}): upgrade durable-harness",
            )
        )
    checks.append(_permissions(conn, where))
    checks.append(_queue(conn))
    return checks


def _permissions(conn: psycopg.Connection[Any], where: Where) -> Check:
    rows = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind = 'r' AND NOT ("
        "  has_table_privilege(c.oid, 'SELECT') AND has_table_privilege(c.oid, 'INSERT')"
        "  AND has_table_privilege(c.oid, 'UPDATE') AND has_table_privilege(c.oid, 'DELETE'))"
        " ORDER BY 1",
        (SCHEMA,),
    ).fetchall()
    if rows:
        tables = ", ".join(r[0] for r in rows)
        return Check(
            "permissions",
            False,
            f"{where.user} may not read and write {tables}: GRANT SELECT, INSERT, UPDATE, "
            f"DELETE ON ALL TABLES IN SCHEMA durable_harness TO {where.user}",
        )
    row = conn.execute(
        "SELECT has_database_privilege(current_database(), 'CREATE')"
        " OR pg_has_role(nspowner, 'USAGE') FROM pg_namespace WHERE nspname = %s",
        (SCHEMA,),
    ).fetchone()
    can_migrate = bool(row and row[0])
    return Check(
        "permissions",
        True,
        f"{where.user} reads and writes every durable_harness table"
        + (
            "; may create tables (future migrations)"
            if can_migrate
            else "; may not create tables: a future version's migration needs the schema owner"
        ),
    )


def _queue(conn: psycopg.Connection[Any]) -> Check:
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'queued'),"
        " count(*) FILTER (WHERE status = 'queued' AND visible_at <= durable_harness.epoch_now()),"
        " count(*) FILTER (WHERE status = 'running'),"
        " count(*) FILTER (WHERE status = 'running'"
        "   AND lease_expires_at <= durable_harness.epoch_now()),"
        " count(*) FILTER (WHERE status = 'waiting'),"
        " (SELECT count(*) FROM durable_harness.turns"
        "   WHERE status = 'failed' AND error LIKE 'dead-lettered%%')"
        " FROM durable_harness.jobs"
    ).fetchone()
    queued, ready, running, expired, parked, dead = row if row is not None else (0,) * 6
    return Check(
        "queue",
        True,
        f"{queued} queued ({ready} deliverable now), {running} running ({expired} with an "
        f"expired lease), {parked} parked in a durable wait, {dead} dead-lettered",
    )


def notify_check(url: str, where: Where, send: Callable[[str], object]) -> Check:
    """LISTEN on a connection of its own while ``send(channel)`` sends a NOTIFY."""
    channel = f"durable_harness_doctor_{os.getpid()}"
    try:
        with connect(url, where) as listener:
            listener.execute(f"LISTEN {channel}")
            send(channel)
            heard = any(True for _ in listener.notifies(timeout=2.0, stop_after=1))
    except (psycopg.Error, DurableHarnessError) as exc:
        return Check("notify", False, f"LISTEN/NOTIFY failed: {_one_line(str(exc))}")
    if heard:
        return Check("notify", True, "LISTEN/NOTIFY wakes idle workers at once")
    return Check(
        "notify",
        False,
        "a NOTIFY did not arrive within 2 s, so idle workers only poll; a connection pooler "
        "in transaction mode drops notifications: use session mode or connect directly",
    )
