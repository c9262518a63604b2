"""Named schema migrations, shared by the SQL backends (local SQLite, PostgreSQL)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

__all__ = ["Migration", "apply_migrations"]

Migration = tuple[str, tuple[str, ...]]
"""A named schema migration: its name and its statements, run in order."""


def apply_migrations(
    migrations: Sequence[Migration], current: int, execute: Callable[..., object], record: str
) -> None:
    """Run the append-only ``migrations`` after version ``current`` (a migration's version
    is its 1-based position), each followed by ``execute(record, (version, name, now))``,
    the statement that records it in the backend's ``schema_version`` table. The caller
    holds the transaction and the lock that make two processes migrate once."""
    for version, (name, statements) in enumerate(migrations, start=1):
        if version <= current:
            continue
        for statement in statements:
            execute(statement)
        execute(record, (version, name, time.time()))
