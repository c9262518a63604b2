"""OpenCode's session database in the World: consistent copies of a live WAL database,
page-delta saves that grow with the conversation (invariant 7), and what a copy says."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_harness.adapters.opencode.session import (
    DatabaseStore,
    root_session_id,
    snapshot,
    tool_call_ids,
)
from durable_harness.worlds.local import LocalWorld


@pytest.fixture
def world(tmp_path: Path) -> Iterator[LocalWorld]:
    w = LocalWorld(tmp_path / "world")
    yield w
    w.close()


def _database(path: Path) -> sqlite3.Connection:
    """A database shaped like OpenCode's (WAL mode, session and part tables)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE session (id TEXT PRIMARY KEY, parent_id TEXT, time_created INTEGER)")
    conn.execute("CREATE TABLE part (id TEXT PRIMARY KEY, data TEXT)")
    conn.execute("INSERT INTO session VALUES ('ses_root', NULL, 1), ('ses_child', 'ses_root', 2)")
    return conn


def _add_call(conn: sqlite3.Connection, n: int, status: str, error: str = "") -> None:
    state = {"status": status, "input": {"command": "x" * 2000}, "error": error}
    part = {"type": "tool", "tool": "bash", "callID": f"toolu_{n}", "state": state}
    conn.execute("INSERT INTO part VALUES (?, ?)", (f"prt_{n:04d}", json.dumps(part)))


def _blob_bytes(world: LocalWorld) -> int:
    return sum(p.stat().st_size for p in (world.data_dir / "blobs").rglob("*") if p.is_file())


def test_copy_of_a_live_wal_database(tmp_path: Path) -> None:
    conn = _database(tmp_path / "opencode.db")  # open, rows only in the WAL so far
    _add_call(conn, 1, "completed")
    _add_call(conn, 2, "running")
    _add_call(conn, 3, "error", "[Tool execution was interrupted]")
    _add_call(conn, 4, "error", "durable-harness denied this call")
    data = snapshot(tmp_path / "opencode.db")
    assert root_session_id(data) == "ses_root"
    assert tool_call_ids(data) == {
        "toolu_1": "completed",
        "toolu_2": "running",
        "toolu_3": "interrupted",
        "toolu_4": "error",
    }
    assert snapshot(tmp_path / "missing.db") == b""
    conn.close()


def test_saves_are_page_deltas_and_load_back(tmp_path: Path, world: LocalWorld) -> None:
    conn = _database(tmp_path / "opencode.db")
    store = DatabaseStore(world)
    saves = []
    sizes = []
    for n in range(60):
        _add_call(conn, n, "completed")
        data = snapshot(tmp_path / "opencode.db")
        saves.append((store.save(data), data))
        sizes.append(_blob_bytes(world))
    # Each save stores the pages that changed (a few pages: the row's leaf, the header),
    # not the whole database again: 30 saves of a ~260 KiB database cost ~0.5 MiB, where
    # 30 full copies would cost ~8 MiB.
    database = len(saves[-1][1])
    per_save = (sizes[-1] - sizes[29]) / 30
    assert database > 100_000
    assert per_save < 8 * 4096 and per_save < database / 8, (per_save, database)
    # Every save loads back to exactly the database it stood for, in a fresh store.
    for saved, data in (saves[0], saves[30], saves[-1]):
        assert DatabaseStore(world).load(saved.digest) == data
    conn.close()
