"""OpenCode's session record in the World: its SQLite database, saved as page deltas.

OpenCode keeps every session in one SQLite database (``$XDG_DATA_HOME/opencode/
opencode.db``, WAL mode; tables ``session``, ``message``, ``part`` …). Continuing a
session (``opencode run --session ses_…``) needs that database and nothing else (its
snapshot git repository only serves undo). The adapter saves the database before every
tool intent and after each launch, and restores it into a fresh private HOME.

A save reads a consistent copy through SQLite's backup API (OpenCode may be writing), and
stores only the pages that changed since the previous save: a node ``{"prev", "pages":
{index: blob}, "count", "page_size"}``. OpenCode mostly appends rows, so a save costs a
few pages and the World grows linearly with a conversation (invariant 7), not with the
number of saves times the database size.

Saves are pointed at by session records ``opencode/<turn_id>/<epoch>``: one name per lease
epoch, so a zombie worker can only write a name no newer worker reads. The final database
of a turn is kept in the outcome of its last launch step, where the next turn finds it.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_harness.adapters.cli.records import TranscriptFacts, latest_turn_transcript
from durable_harness.core.canonical import parse_json
from durable_harness.core.errors import DurableHarnessError
from durable_harness.core.keys import session_record_name
from durable_harness.core.types import Step, StepStatus
from durable_harness.core.world import World

__all__ = [
    "DatabaseStore",
    "Saved",
    "database_facts",
    "latest_turn_save",
    "read_snapshot",
    "root_session_id",
    "snapshot",
    "tool_call_ids",
]

RECORD_PREFIX = "opencode"
#: OpenCode's result for a tool call it was killed during; not a real result.
INTERRUPTED_TEXT = "Tool execution was interrupted"


@dataclass(frozen=True)
class Saved:
    digest: str  # the node blob
    size: int  # bytes of database it stands for


def snapshot(path: Path) -> bytes:
    """A consistent copy of the SQLite database at ``path`` (empty if there is none)."""
    if not path.exists():
        return b""
    return _serialized(f"file:{path}?mode=ro", f" {path}")


def _serialized(database: str, where: str) -> bytes:
    """The SQLite database ``database`` (a path or a ``file:`` URI) copied whole, with
    what its WAL holds, as the bytes of one database file."""
    try:
        source = sqlite3.connect(database, uri=database.startswith("file:"), timeout=10)
        try:
            target = sqlite3.connect(":memory:")
            try:
                source.backup(target)
                return target.serialize()
            finally:
                target.close()
        finally:
            source.close()
    except sqlite3.Error as exc:
        raise DurableHarnessError(f"cannot read OpenCode's session database{where}: {exc}") from exc


def read_snapshot(read: Callable[[str], bytes | None], path: str) -> bytes:
    """A consistent copy of the database at ``path`` where only whole files can be read
    (``read``: :meth:`~.cli.host.CliHost.read_file`, e.g. in a container): the main file
    and its WAL, taken again if a checkpoint rewrote the main file between the two reads
    (a WAL frame cut off at the end is ignored by SQLite's checksums)."""
    main: bytes | None = None
    wal: bytes | None = None
    for _ in range(5):
        main = read(path)
        if main is None:
            return b""
        wal = read(f"{path}-wal")
        if read(path) == main:
            break
    assert main is not None
    with tempfile.TemporaryDirectory(prefix="durable-harness-opencode-db-") as tmp:
        copy = Path(tmp) / "opencode.db"
        copy.write_bytes(main)
        if wal:
            Path(f"{copy}-wal").write_bytes(wal)
        return _serialized(str(copy), "")  # opened read-write: it may read the WAL


class DatabaseStore:
    """Page-delta saves of the database (see the module docstring)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._last: tuple[Saved, bytes] | None = None

    def save(self, data: bytes) -> Saved:
        previous = self._last
        if previous is not None and previous[1] == data:
            return previous[0]
        page_size = _page_size(data)
        old = previous[1] if previous is not None else b""
        pages: dict[str, str] = {}
        for index in range(0, (len(data) + page_size - 1) // page_size):
            page = data[index * page_size : (index + 1) * page_size]
            if old[index * page_size : (index + 1) * page_size] != page:
                pages[str(index)] = self.world.put_blob(page)
        node = {
            "prev": previous[0].digest if previous is not None else None,
            "pages": pages,
            "size": len(data),
            "page_size": page_size,
        }
        saved = Saved(self.world.put_blob(json.dumps(node, sort_keys=True).encode()), len(data))
        self._last = (saved, data)
        return saved

    def load(self, digest: str) -> bytes:
        """The database a save stands for; also primes the next :meth:`save`'s delta."""
        nodes = []
        cursor: str | None = digest
        while cursor is not None:
            node = json.loads(self.world.get_blob(cursor))
            nodes.append(node)
            cursor = node["prev"]
        size = nodes[0]["size"]
        data = bytearray()
        for node in reversed(nodes):
            page_size = int(node["page_size"])
            for index, blob in sorted(node["pages"].items(), key=lambda kv: int(kv[0])):
                start = int(index) * page_size
                page = self.world.get_blob(blob)
                if len(data) < start:
                    data.extend(b"\0" * (start - len(data)))
                data[start : start + len(page)] = page
        result = bytes(data[:size])
        self._last = (Saved(digest, len(result)), result)
        return result

    def point(self, session_id: str, turn_id: str, epoch: int, saved: Saved) -> None:
        name = session_record_name(RECORD_PREFIX, turn_id, epoch)
        self.world.put_session_record(session_id, name, saved.digest)


def latest_turn_save(world: World, session_id: str, turn_id: str, epoch: int) -> str | None:
    """The newest database save of the turn by an earlier lease epoch, or None."""
    return latest_turn_transcript(world, session_id, turn_id, epoch, RECORD_PREFIX)


def _page_size(data: bytes) -> int:
    if len(data) >= 18 and data.startswith(b"SQLite format 3\0"):
        size = int.from_bytes(data[16:18], "big")
        return 65536 if size == 1 else size
    return 4096


def _connect(data: bytes) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    if len(data) >= 20:
        # An in-memory database cannot be in WAL mode: read the copy as a rollback-journal
        # database (header bytes 18-19 are the read/write format versions).
        conn.deserialize(data[:18] + b"\x01\x01" + data[20:])
    return conn


def root_session_id(data: bytes) -> str | None:
    """The id of the newest top-level OpenCode session in a saved database."""
    conn = _connect(data)
    try:
        row = conn.execute(
            "SELECT id FROM session WHERE parent_id IS NULL ORDER BY time_created DESC LIMIT 1"
        ).fetchone()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return str(row[0]) if row else None


def tool_call_ids(data: bytes) -> dict[str, str]:
    """``callID -> state.status`` of every tool part in a saved database."""
    conn = _connect(data)
    found: dict[str, str] = {}
    try:
        rows = conn.execute("SELECT data FROM part").fetchall()
    except sqlite3.Error:
        rows = []
    finally:
        conn.close()
    for (text,) in rows:
        try:
            part = parse_json(text)
        except ValueError:
            continue
        if not isinstance(part, dict) or part.get("type") != "tool":
            continue
        state = _dict(part.get("state"))
        status = str(state.get("status"))
        if status == "error" and INTERRUPTED_TEXT in str(state.get("error")):
            status = "interrupted"
        found[str(part.get("callID"))] = status
    return found


def database_facts(data: bytes, steps: list[Step]) -> TranscriptFacts:
    """What a saved database already tells OpenCode, in the terms of
    :func:`~.cli.records.resume_message_from_facts`.

    OpenCode does not keep the provider's message ids, so a recorded model reply counts
    as known when the database holds one of its tool calls, or when it has none (a text
    reply the resumed CLI does not need quoted).
    """
    calls = tool_call_ids(data)
    results = {cid for cid, status in calls.items() if status in ("completed", "error")}
    messages = set()
    for step in steps:
        if step.kind != "model" or step.status is not StepStatus.DONE:
            continue
        ids = step.meta.get("tool_use_ids") or []
        if not ids or any(i in calls for i in ids):
            messages.add(str(step.meta.get("message_id")))
    return TranscriptFacts(frozenset(calls), frozenset(results), frozenset(messages))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
