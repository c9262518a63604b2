"""The local World's SQLite schema (append-only migrations) and row decoding.

Kept apart from the modules beside it (the World's behaviour): what is stored, and how a stored row
becomes a :class:`Session`, :class:`Turn` or :class:`Step` (or a :class:`CorruptJournal`
naming the row when it cannot).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, TypeVar

from durable_harness.core.errors import CorruptJournal
from durable_harness.core.types import Session, Step, StepStatus, Turn, TurnStatus

# Append-only: a migration that shipped is never edited, only followed by a new entry.
# Its position (1-based) is the schema version recorded in `schema_version`.
MIGRATIONS: list[tuple[str, tuple[str, ...]]] = [
    (
        "initial schema",
        (
            """CREATE TABLE sessions (
                session_id TEXT PRIMARY KEY, created_at REAL NOT NULL,
                meta TEXT NOT NULL DEFAULT '{}')""",
            """CREATE TABLE turns (
                turn_id TEXT PRIMARY KEY,
                session_id TEXT NOT NULL REFERENCES sessions(session_id),
                idx INTEGER NOT NULL, prompt TEXT NOT NULL, status TEXT NOT NULL,
                config TEXT NOT NULL DEFAULT '{}', created_at REAL NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0, epoch INTEGER NOT NULL DEFAULT 0,
                lease_owner TEXT, lease_expires_at REAL, visible_at REAL,
                result TEXT, error TEXT, finished_at REAL,
                UNIQUE (session_id, idx))""",
            # Finished turns pile up; these keep `claim` from scanning them.
            "CREATE INDEX turns_queued ON turns(status, visible_at)",
            "CREATE INDEX turns_leased ON turns(status, lease_expires_at)",
            "CREATE INDEX turns_created ON turns(created_at)",
            """CREATE TABLE steps (
                turn_id TEXT NOT NULL REFERENCES turns(turn_id), seq INTEGER NOT NULL,
                key TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
                input_hash TEXT NOT NULL, input TEXT, status TEXT NOT NULL,
                output TEXT, output_blob TEXT, attempts INTEGER NOT NULL DEFAULT 1,
                epoch INTEGER NOT NULL, started_at REAL NOT NULL, finished_at REAL,
                meta TEXT NOT NULL DEFAULT '{}',
                PRIMARY KEY (turn_id, seq), UNIQUE (turn_id, key))""",
            """CREATE TABLE session_records (
                session_id TEXT NOT NULL REFERENCES sessions(session_id),
                name TEXT NOT NULL, digest TEXT NOT NULL,
                PRIMARY KEY (session_id, name))""",
        ),
    ),
    (
        "durable waits",
        (
            "ALTER TABLE turns ADD COLUMN waiting_for TEXT",
            # Deliveries up to the last deliberate suspend do not count toward dead-lettering.
            "ALTER TABLE turns ADD COLUMN attempt_floor INTEGER NOT NULL DEFAULT 0",
            """CREATE TABLE signals (
                turn_id TEXT NOT NULL REFERENCES turns(turn_id), name TEXT NOT NULL,
                payload TEXT NOT NULL, received_at REAL NOT NULL,
                PRIMARY KEY (turn_id, name))""",
        ),
    ),
    (
        "ordered signals and webhook watches",
        (
            # Every delivery of a name is kept, in order; a wait takes the first one no
            # earlier wait took (claimed_by: its step's seq). The one signal an older World
            # kept per name becomes the first of its name.
            """CREATE TABLE signal_log (
                turn_id TEXT NOT NULL REFERENCES turns(turn_id), name TEXT NOT NULL,
                idx INTEGER NOT NULL, delivery_id TEXT NOT NULL, payload TEXT NOT NULL,
                received_at REAL NOT NULL, claimed_by INTEGER,
                PRIMARY KEY (turn_id, name, idx), UNIQUE (turn_id, name, delivery_id))""",
            """INSERT INTO signal_log (turn_id, name, idx, delivery_id, payload, received_at)
               SELECT turn_id, name, 0, 'legacy', payload, received_at FROM signals""",
            "DROP TABLE signals",
            """CREATE TABLE watches (
                scope TEXT NOT NULL, turn_id TEXT NOT NULL REFERENCES turns(turn_id),
                name TEXT NOT NULL, ref TEXT NOT NULL, PRIMARY KEY (scope, turn_id, name))""",
            "CREATE INDEX watches_ref ON watches(scope, ref)",
        ),
    ),
    (
        "event log, API tokens, owners, rate counters",
        (
            # A turn's event log (core/world.py EventLog): seq 1, 2, ... per turn, key once.
            """CREATE TABLE events (
                turn_id TEXT NOT NULL REFERENCES turns(turn_id), seq INTEGER NOT NULL,
                key TEXT NOT NULL, kind TEXT NOT NULL, data TEXT NOT NULL,
                at REAL NOT NULL, epoch INTEGER,
                PRIMARY KEY (turn_id, seq), UNIQUE (turn_id, key))""",
            """CREATE TABLE api_tokens (
                token_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, digest TEXT NOT NULL,
                created_at REAL NOT NULL, operator INTEGER NOT NULL, label TEXT NOT NULL,
                revoked_at REAL)""",
            """CREATE TABLE owners (
                kind TEXT NOT NULL, item_id TEXT NOT NULL, tenant TEXT NOT NULL,
                created_at REAL NOT NULL, PRIMARY KEY (kind, item_id))""",
            "CREATE INDEX owners_page ON owners(tenant, kind, created_at DESC, item_id DESC)",
            """CREATE TABLE rate_counters (
                bucket TEXT NOT NULL, window INTEGER NOT NULL, used INTEGER NOT NULL,
                PRIMARY KEY (bucket, window))""",
        ),
    ),
    (
        "lease holders",
        # <boot id>:<pid>:<start time> of the process holding a running turn's lease
        # (worlds/local/holder.py): a dead holder's turn is taken over at once.
        ("ALTER TABLE turns ADD COLUMN holder TEXT",),
    ),
]

_E = TypeVar("_E", TurnStatus, StepStatus)


def json_object(text: Any, where: str, column: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise CorruptJournal(f"{where}: column {column} is not valid JSON") from exc
    if not isinstance(value, dict):
        raise CorruptJournal(f"{where}: column {column} is not a JSON object")
    return value


def session_from_row(row: sqlite3.Row) -> Session:
    meta = json_object(row["meta"], f"session {row['session_id']}", "meta")
    return Session(session_id=row["session_id"], created_at=row["created_at"], meta=meta)


def turn_from_row(row: sqlite3.Row) -> Turn:
    where = f"turn {row['turn_id']}"
    hidden = ("idx", "visible_at", "attempt_floor", "holder")
    columns = {k: row[k] for k in row.keys() if k not in hidden}  # noqa: SIM118
    columns["status"] = enum_value(TurnStatus, row["status"], where)
    columns["config"] = json_object(row["config"], where, "config")
    return Turn(index=row["idx"], **columns)


def step_from_row(row: sqlite3.Row) -> Step:
    where = f"turn {row['turn_id']} step {row['seq']}"
    columns = {k: row[k] for k in row.keys()}  # noqa: SIM118 - sqlite3.Row is not a Mapping
    columns["status"] = enum_value(StepStatus, row["status"], where)
    columns["meta"] = json_object(row["meta"], where, "meta")
    return Step(**columns)


def enum_value(kind: type[_E], value: Any, where: str) -> _E:
    try:
        return kind(value)
    except ValueError as exc:
        raise CorruptJournal(f"{where}: unknown status {value!r}") from exc
