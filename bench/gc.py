"""What ``durable-harness gc`` reclaims, and how long it takes: local and PostgreSQL Worlds.

Each World gets ``--turns`` finished turns (one session each, made "old" by a pause), then
``--kept`` newer finished turns that must stay. A turn is what a small coding turn leaves:
``--steps`` journal steps with outputs stored as blobs (unique per turn), a workspace
snapshot per tool step through the real :class:`SnapshotStore` (a 40-file repository of
which every turn changes one file: the rest are the same deduplicated blobs in every
turn), a transcript record and an event per step. Then ``gc --dry-run`` and ``gc`` run
with ``older_than`` and ``grace`` reaching back to the middle of the pause.

World bytes: local, the blob folder plus the SQLite pages in use (``page_count -
freelist_count``: the file keeps its size and reuses freed pages); PostgreSQL, the
``durable_harness`` tables' total size (TOAST and indexes too) after ``VACUUM FULL``, run
by this script before each measurement only, so the figures compare live data (a plain
VACUUM makes freed space reusable, not smaller).

Filling the Worlds is fsync-bound and is not what is measured, so the local World is in
``/dev/shm`` (tmpfs) and PostgreSQL runs with ``fsync=off``: gc's own deletes are then
not slowed by the disk either (on a disk, each removed session is one more commit).

Run: ``python bench/gc.py [--turns 1000] [--kept 100] [--steps 6]``. The last line of the
output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the server helper lives beside the tests' fixtures

from postgres_server import PostgresServer  # noqa: E402

from durable_harness.core.sandbox import SandboxState  # noqa: E402
from durable_harness.core.types import Step, StepStatus  # noqa: E402
from durable_harness.core.world import World  # noqa: E402
from durable_harness.harness.workspace import SnapshotStore  # noqa: E402
from durable_harness.runtime.gc import collect  # noqa: E402
from durable_harness.worlds.local import LocalWorld  # noqa: E402
from durable_harness.worlds.postgres import PostgresWorld  # noqa: E402

PAUSE = 1.0
REPO = {f"src/mod{i:02}.py": (f"# module {i}\n" + "x = 1\n" * 200).encode() for i in range(40)}


def fill(world: World, prefix: str, turns: int, steps: int) -> None:
    for n in range(turns):
        sid, tid = f"{prefix}{n}", f"{prefix}{n}-t"
        world.create_session(sid)
        world.create_turn(sid, tid, f"fix bug {n}", {})
        lease = world.claim_turn(tid, "bench", 60.0)
        assert lease is not None
        snapshots = SnapshotStore(world)
        files = dict(REPO)
        for seq in range(steps):
            world.insert_intent(
                Step(tid, seq, f"k{seq}", "tool", "bash", f"h{seq}", epoch=lease.epoch)
            )
            out = world.put_blob(json.dumps({"turn": tid, "seq": seq, "log": "y" * 3000}).encode())
            files[f"src/mod{seq:02}.py"] = f"# turn {tid} step {seq}\n".encode() * 20
            manifest = snapshots.save(SandboxState(files=dict(files), cwd="/workspace"))
            world.finish_step(
                tid, seq, lease.epoch, StepStatus.DONE, None, out, {"snapshot": manifest}
            )
            world.append_event(tid, f"step-{seq}", "step.end", {"seq": seq}, epoch=lease.epoch)
        world.put_session_record(
            sid, "transcript", world.put_blob(f"transcript of {tid}".encode() * 50)
        )
        world.complete_turn(lease, "done")


def measure(
    name: str, world: World, size: Callable[[], int], turns: int, kept: int, steps: int
) -> dict[str, Any]:
    started = time.monotonic()
    fill(world, "old", turns, steps)
    fill_s = time.monotonic() - started
    time.sleep(PAUSE / 2)
    mid = world.now()  # older than this: the old turns; newer: the kept ones
    time.sleep(PAUSE / 2)
    fill(world, "new", kept, steps)
    before = size()
    dry = collect(world, world.now() - mid, grace=world.now() - mid, dry_run=True)
    age = world.now() - mid
    report = collect(world, age, grace=age)
    after = size()
    left = len(world.list_sessions(limit=10**6))
    assert (report.sessions, left) == (turns, kept), (report, left)
    return {
        "world": name,
        "fill_s": round(fill_s, 2),
        "bytes_before": before,
        "bytes_after": after,
        "after_over_before": round(after / before, 3),
        "gc_s": round(report.seconds, 3),
        "dry_run_s": round(dry.seconds, 3),
        "gc_ms_per_removed_turn": round(1000 * report.seconds / max(report.turns, 1), 3),
        "removed": {k: v for k, v in vars(report).items() if k not in ("dry_run", "seconds")},
    }


def local_size(data_dir: Path) -> Callable[[], int]:
    import sqlite3

    def size() -> int:
        blobs = sum(p.stat().st_size for p in (data_dir / "blobs").rglob("*") if p.is_file())
        with sqlite3.connect(data_dir / "world.sqlite3") as conn:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            page = conn.execute("PRAGMA page_size").fetchone()[0]
        return int(blobs + (pages - free) * page)

    return size


def postgres_size(pg: PostgresServer, dbname: str) -> Callable[[], int]:
    def size() -> int:
        pg.admin("VACUUM FULL", dbname=dbname)
        rows = pg.admin(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'durable_harness' AND c.relkind = 'r'",
            dbname=dbname,
        )
        return int(rows[0][0])

    return size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000, help="old finished turns (1000)")
    parser.add_argument("--kept", type=int, default=100, help="newer turns that stay (100)")
    parser.add_argument("--steps", type=int, default=6, help="steps per turn (6)")
    args = parser.parse_args(argv)
    results = []
    # Filling is fsync-bound and not what is measured: tmpfs and fsync=off keep it short.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="dh-gc-bench-", dir=shm) as tmp:
        data_dir = Path(tmp) / "world"
        with LocalWorld(data_dir) as world:
            results.append(
                measure("local", world, local_size(data_dir), args.turns, args.kept, args.steps)
            )
        with PostgresServer(fsync=False) as pg:
            dbname = pg.create_database("gc")
            with PostgresWorld(pg.url(dbname)) as world:
                size = postgres_size(pg, dbname)
                results.append(measure("postgres", world, size, args.turns, args.kept, args.steps))
    result = {
        "date": datetime.date.today().isoformat(),
        "turns": args.turns,
        "kept": args.kept,
        "steps": args.steps,
        "results": results,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    print(f"gc, {result['date']}, {result['cpus']} CPUs: {args.turns} old finished turns")
    print(f"({args.steps} steps, a snapshot each) and {args.kept} newer ones kept")
    for r in results:
        print(
            f"  {r['world']:>8}: {r['bytes_before'] / 1e6:8.2f} MB -> {r['bytes_after'] / 1e6:7.2f}"
            f" MB ({r['after_over_before']:.3f}x); gc {r['gc_s']:.2f}s"
            f" ({r['gc_ms_per_removed_turn']:.2f} ms/turn), dry run {r['dry_run_s']:.2f}s"
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
