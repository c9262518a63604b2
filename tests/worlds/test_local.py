"""What only the local World promises: its files, its schema versions, its row decoding."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from durable_harness.core.errors import ConfigError, CorruptJournal, NotFound, WorldError
from durable_harness.core.types import Step
from durable_harness.worlds import open_world
from durable_harness.worlds.local import DB_NAME, MIGRATIONS, LocalWorld


def raw(tmp_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)


def journal_with_one_step(tmp_path: Path) -> LocalWorld:
    world = LocalWorld(tmp_path)
    world.create_session("s1")
    world.create_turn("s1", "t1", "hi", {})
    lease = world.claim("w", 30)
    assert lease is not None
    world.insert_intent(
        Step(turn_id="t1", seq=3, key="k", kind="tool", name="n", input_hash="h", epoch=1)
    )
    return world


def test_bad_json_in_step_meta_is_corrupt_journal(tmp_path: Path) -> None:
    with journal_with_one_step(tmp_path) as world:
        raw(tmp_path).execute("UPDATE steps SET meta = '{not json' WHERE turn_id = 't1'")
        with pytest.raises(CorruptJournal, match=r"turn t1 step 3"):
            world.load_steps("t1")


def test_unknown_step_status_is_corrupt_journal(tmp_path: Path) -> None:
    with journal_with_one_step(tmp_path) as world:
        raw(tmp_path).execute("UPDATE steps SET status = 'halfway' WHERE turn_id = 't1'")
        with pytest.raises(CorruptJournal, match=r"turn t1 step 3.*halfway"):
            world.load_steps("t1")


def test_bad_turn_config_is_corrupt_journal(tmp_path: Path) -> None:
    with journal_with_one_step(tmp_path) as world:
        raw(tmp_path).execute("UPDATE turns SET config = '[1]' WHERE turn_id = 't1'")
        with pytest.raises(CorruptJournal, match="turn t1"):
            world.get_turn("t1")


def test_database_settings(tmp_path: Path) -> None:
    world = LocalWorld(tmp_path)
    with world:
        conn = world._db.connection()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_version")]
        assert versions == list(range(1, len(MIGRATIONS) + 1))


def test_reopening_does_not_migrate_again(tmp_path: Path) -> None:
    LocalWorld(tmp_path).close()
    with LocalWorld(tmp_path) as world:
        world.create_session("s1")
    assert raw(tmp_path).execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == len(
        MIGRATIONS
    )


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    LocalWorld(tmp_path).close()
    raw(tmp_path).execute(
        "INSERT INTO schema_version (version, name, applied_at) VALUES (999, 'future', 0)"
    )
    with pytest.raises(WorldError, match="upgrade durable-harness"):
        LocalWorld(tmp_path)


def test_blobs_are_files_by_digest(tmp_path: Path) -> None:
    with LocalWorld(tmp_path) as world:
        digest = world.put_blob(b"payload")
        path = tmp_path / "blobs" / digest[:2] / digest[2:]
        assert path.read_bytes() == b"payload"
        assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp")]


def test_a_damaged_blob_is_corrupt(tmp_path: Path) -> None:
    with LocalWorld(tmp_path) as world:
        digest = world.put_blob(b"payload")
        (tmp_path / "blobs" / digest[:2] / digest[2:]).write_bytes(b"tampered")
        with pytest.raises(CorruptJournal):
            world.get_blob(digest)


def test_a_digest_cannot_escape_the_blob_folder(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"x")
    with LocalWorld(tmp_path / "w") as world, pytest.raises(NotFound):
        world.get_blob("../../secret")


def test_sqlite_errors_are_mapped_to_world_error(tmp_path: Path) -> None:
    world = LocalWorld(tmp_path)
    world.close()
    with pytest.raises(WorldError):
        world.get_turn("t1")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / DB_NAME).write_bytes(b"this is not a database" * 100)
    with pytest.raises(WorldError) as info:
        LocalWorld(tmp_path / "other")
    assert isinstance(info.value.__cause__, sqlite3.Error)


def test_open_world_by_name_url_and_path(tmp_path: Path) -> None:
    for world in (
        open_world("local", data_dir=tmp_path / "a"),
        open_world(f"file://{tmp_path / 'b'}"),
        open_world(str(tmp_path / "c")),
        open_world("local", data_dir=tmp_path / "d", max_attempts=2),
    ):
        assert isinstance(world, LocalWorld)
        world.close()
    assert (tmp_path / "b" / DB_NAME).exists() and (tmp_path / "c" / DB_NAME).exists()


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("postgres", {}, "set DURABLE_HARNESS_POSTGRES_URL"),
        ("postgresql://u@h/db", {"colour": "red"}, "colour"),
        ("s3sqs", {}, "set DURABLE_HARNESS_S3_BUCKET"),
        ("s3sqs://bucket/prefix", {}, "set DURABLE_HARNESS_SQS_QUEUE_URL"),
        ("s3sqs", {"bucket": "b", "queue_url": "q", "colour": "red"}, "colour"),
        ("mongo", {}, "known Worlds: local, postgres, s3sqs"),
        ("mongo://x", {}, "unknown World URL scheme"),
        ("local", {}, "needs a folder"),
        ("local", {"data_dir": "x", "colour": "red"}, "colour"),
    ],
)
def test_open_world_errors(name: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_world(name, **options)


def test_failed_blob_write_is_a_world_error_and_leaves_nothing(tmp_path: Path) -> None:
    data = b"cannot land"
    digest = hashlib.sha256(data).hexdigest()
    with LocalWorld(tmp_path) as world:
        # A file where the blob's shard folder must go: the write fails even as root.
        (tmp_path / "blobs" / digest[:2]).write_bytes(b"in the way")
        with pytest.raises(WorldError):
            world.put_blob(data)
        with pytest.raises(WorldError):  # nothing half-written was left to read
            world.get_blob(digest)


def test_a_signal_of_an_older_world_becomes_the_first_of_its_name(tmp_path: Path) -> None:
    # A World made before ordered signals (schema version 2): one signal per name.
    conn = raw(tmp_path)
    conn.execute(
        "CREATE TABLE schema_version ("
        " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    for version, (name, statements) in enumerate(MIGRATIONS[:2], start=1):
        for statement in statements:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version VALUES (?, ?, 0)", (version, name))
    conn.execute("INSERT INTO sessions (session_id, created_at) VALUES ('s1', 0)")
    conn.execute(
        "INSERT INTO turns (turn_id, session_id, idx, prompt, status, created_at)"
        " VALUES ('t1', 's1', 0, 'hi', 'waiting', 0)"
    )
    conn.execute("INSERT INTO signals VALUES ('t1', 'ci', '{\"status\": \"failed\"}', 0)")
    conn.close()
    with LocalWorld(tmp_path) as world:
        assert world.get_signal("t1", "ci") == '{"status": "failed"}'
        [old] = world.list_signals("t1", "ci")
        assert (old.index, old.delivery_id, old.claimed_by) == (0, "legacy", None)
        assert world.send_signal("t1", "ci", '{"status": "passed"}') is True
        assert [s.index for s in world.list_signals("t1", "ci")] == [0, 1]
