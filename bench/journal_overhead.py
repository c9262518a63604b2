"""Per-step journal overhead: durable-harness's local World beside DBOS Transact on SQLite.

Both run in this one process, on this machine, against SQLite files in one folder:

* **durable-harness**: ``Journal.run`` over a :class:`LocalWorld` (WAL, ``synchronous=FULL``).
  Each step commits its intent, runs a trivial call, then commits its outcome: two durable
  commits per step (invariant 1 puts the intent on disk before the call).
* **DBOS**: a ``@DBOS.workflow`` calling trivial ``@DBOS.step`` functions, system database
  ``sqlite:///…``. DBOS checks for a recorded output, runs the step and records its output:
  one durable commit per step. Measured twice: with the file switched to WAL and
  ``synchronous=FULL`` (the same durability settings as the local World: the headline
  ratio) and as DBOS ships it (rollback journal, SQLite's compiled-in ``synchronous``).

Only the steps are timed: World/DBOS start-up, session/turn creation, the lease claim and
DBOS's workflow start/finish rows are outside the clock (DBOS's loop is timed inside the
workflow body; its whole-workflow time is printed too). Each figure is the median over
``--turns`` turns/workflows, after one untimed warm-up each; local turns and DBOS workflows
alternate so that drift in disk latency hits both alike.

Replay: a recorded turn read back with ``Journal(..., replay_only=True)`` (what
``durable-harness replay`` does), timed from loading the journal to the last step. DBOS's
per-step equivalent is ``DBOS.fork_workflow(id, start_step=steps + 1)``: the fork copies
every recorded step output and runs the workflow again, each step returning its recorded
output without running (checked). Calling a *finished* workflow again by its id runs no
step at all in DBOS 3.x (it returns the stored workflow output), so that is printed only as
a single lookup time.

Run: ``python bench/journal_overhead.py [--steps 200] [--turns 5]``. The last line of the
output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.metadata
import json
import logging
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from durable_harness.core.types import Lease
from durable_harness.harness.journal import Journal, Outcome
from durable_harness.worlds.local import LocalWorld

try:
    import sqlalchemy as sa
    from dbos import DBOS, SetWorkflowID

    DBOS_VERSION = importlib.metadata.version("dbos")
except ImportError:  # reported by main(), which names the package to install
    DBOS = None  # type: ignore[assignment,misc]
    DBOS_VERSION = "not installed"

LEASE_SECONDS = 600.0
_SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


# -- helpers -----------------------------------------------------------------------------
def median_us_per_step(seconds: list[float], steps: int) -> float:
    return statistics.median(seconds) / steps * 1e6


def fsync_latency_us(folder: Path, rounds: int = 200) -> float:
    """Median time of one 4 KiB write + fsync in ``folder``: the floor of a durable commit."""
    path = folder / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    times = []
    try:
        for _ in range(rounds):
            os.write(fd, b"\0" * 4096)
            started = time.perf_counter()
            os.fsync(fd)
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times) * 1e6


def sqlite_settings(execute: Callable[[str], Any]) -> dict[str, str]:
    """journal_mode and synchronous as seen by the connection that does the writes."""
    mode = str(execute("PRAGMA journal_mode")).lower()
    sync = int(execute("PRAGMA synchronous"))
    return {"journal_mode": mode, "synchronous": _SYNC_NAMES.get(sync, str(sync))}


# -- durable-harness ---------------------------------------------------------------------
class LocalBench:
    """Turns of trivial ``safe`` tool steps through ``Journal.run`` on a LocalWorld."""

    def __init__(self, folder: Path, steps: int) -> None:
        self.world = LocalWorld(folder)
        self.steps = steps
        self.turn_ids: list[str] = []

    def settings(self) -> dict[str, str]:
        # Reads the World's own connection: synchronous is per connection, so a second
        # connection to the same file would report its own default, not the World's.
        conn = self.world._connection()
        return sqlite_settings(lambda sql: conn.execute(sql).fetchone()[0])

    def run_turn(self, n: int) -> float:
        session_id, turn_id = f"bench-session-{n}", f"bench-turn-{n}"
        self.world.create_session(session_id)
        self.world.create_turn(session_id, turn_id, "benchmark", {"agent": "builtin"})
        lease = self.world.claim_turn(turn_id, "bench", LEASE_SECONDS)
        if lease is None:
            raise RuntimeError(f"could not claim {turn_id}")
        journal = Journal(self.world, lease)
        started = time.perf_counter()
        for i in range(self.steps):
            result = journal.run(
                kind="tool",
                name="noop",
                key=f"k{i}",
                input={"i": i},
                call=functools.partial(_noop, i),
                replay="safe",
            )
            if result.value != {"ok": i}:
                raise RuntimeError(f"step {i} returned {result.value!r}")
        elapsed = time.perf_counter() - started
        self.world.complete_turn(lease, "done")
        self.turn_ids.append(turn_id)
        return elapsed

    def replay_turn(self, turn_id: str) -> float:
        turn = self.world.get_turn(turn_id)
        # As turns.replay_turn builds it: the turn's current epoch, never expiring.
        lease = Lease(turn_id, turn.session_id, "replay", turn.epoch, turn.attempts, float("inf"))
        started = time.perf_counter()
        journal = Journal(self.world, lease, replay_only=True)
        for i in range(self.steps):
            result = journal.run(
                kind="tool",
                name="noop",
                key=f"k{i}",
                input={"i": i},
                call=_never_called,
                replay="safe",
            )
            if not result.replayed or result.value != {"ok": i}:
                raise RuntimeError(f"replayed step {i} returned {result!r}")
        return time.perf_counter() - started

    def close(self) -> None:
        self.world.close()


def _noop(i: int, seq: int) -> Outcome:
    return Outcome({"ok": i})


def _never_called(seq: int) -> Outcome:
    raise RuntimeError(f"replay ran step {seq}")


# -- DBOS --------------------------------------------------------------------------------
_dbos_step_runs = 0

if DBOS is not None:

    @DBOS.step()
    def dbos_noop(i: int) -> dict[str, int]:
        global _dbos_step_runs
        _dbos_step_runs += 1
        return {"ok": i}

    @DBOS.workflow()
    def dbos_turn(steps: int) -> float:
        """Runs ``steps`` trivial steps; returns the seconds the step loop took."""
        started = time.perf_counter()
        for i in range(steps):
            out = dbos_noop(i)
            if out != {"ok": i}:
                raise RuntimeError(f"DBOS step {i} returned {out!r}")
        return time.perf_counter() - started


@contextmanager
def launched_dbos(db_path: Path, wal: bool) -> Iterator[float]:
    """DBOS launched on a fresh SQLite system database; yields the launch time (s).

    ``wal``: switch the file to WAL before DBOS opens it (journal_mode is stored in the
    file) and have every connection DBOS opens set ``synchronous=FULL``, as LocalWorld
    does. Otherwise DBOS runs with its own defaults (it sets neither pragma).
    """
    listener = None
    if wal:
        with sqlite3.connect(db_path) as conn:
            conn.execute("PRAGMA journal_mode = WAL")

        def listener(dbapi_conn: Any, _record: Any) -> None:
            if isinstance(dbapi_conn, sqlite3.Connection):
                dbapi_conn.execute("PRAGMA synchronous = FULL")

        sa.event.listen(sa.engine.Engine, "connect", listener)
    started = time.perf_counter()
    DBOS(
        config={
            "name": "journal-overhead-bench",
            "system_database_url": f"sqlite:///{db_path}",
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    launch = time.perf_counter() - started
    try:
        yield launch
    finally:
        DBOS.destroy()
        if listener is not None:
            sa.event.remove(sa.engine.Engine, "connect", listener)


def dbos_settings() -> dict[str, str]:
    from dbos._dbos import _get_dbos_instance  # private: no public way to reach the engine

    with _get_dbos_instance()._sys_db.engine.connect() as conn:
        return sqlite_settings(lambda sql: conn.execute(sa.text(sql)).scalar())


def dbos_run(workflow_id: str, steps: int) -> tuple[float, float]:
    """(step-loop seconds, whole-workflow seconds) for one fresh workflow."""
    started = time.perf_counter()
    with SetWorkflowID(workflow_id):
        inner = dbos_turn(steps)
    return inner, time.perf_counter() - started


def dbos_replay(workflow_id: str, steps: int) -> float:
    """Step-loop seconds of a fork that reads every step back from the recorded outputs."""
    before = _dbos_step_runs
    handle = DBOS.fork_workflow(workflow_id, steps + 1)
    inner = float(handle.get_result())
    if _dbos_step_runs != before:
        raise RuntimeError(f"DBOS fork of {workflow_id} ran {_dbos_step_runs - before} steps")
    return inner


def dbos_recall_finished(workflow_id: str, steps: int) -> float:
    started = time.perf_counter()
    with SetWorkflowID(workflow_id):
        dbos_turn(steps)
    return time.perf_counter() - started


# -- main --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per turn (200)")
    parser.add_argument("--turns", type=int, default=5, help="timed turns per system (5)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="folder for the SQLite files (a temp folder)"
    )
    parser.add_argument(
        "--skip-dbos-default",
        action="store_true",
        help="skip DBOS with its default (rollback journal) settings",
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.turns < 1:
        parser.error("--steps and --turns must be at least 1")
    if DBOS is None:
        print("DBOS is not installed: pip install 'dbos>=3'", file=sys.stderr)
        return 2
    logging.getLogger("dbos").setLevel(logging.WARNING)

    steps, turns = args.steps, args.turns
    with tempfile.TemporaryDirectory(prefix="dh-bench-", dir=args.dir) as tmp:
        folder = Path(tmp)
        fsync_us = fsync_latency_us(folder)
        local = LocalBench(folder / "world", steps)
        local_s: list[float] = []
        dbos_inner: list[float] = []
        dbos_wall: list[float] = []
        with launched_dbos(folder / "dbos-wal.sqlite3", wal=True) as launch_s:
            dbos_cfg = dbos_settings()
            local.run_turn(-1)  # warm-up, untimed
            dbos_run("warmup", steps)
            for n in range(turns):
                local_s.append(local.run_turn(n))
                inner, wall = dbos_run(f"wf-{n}", steps)
                dbos_inner.append(inner)
                dbos_wall.append(wall)
            replay_s = [local.replay_turn(t) for t in local.turn_ids[1:]]
            dbos_replay_s = [dbos_replay(f"wf-{n}", steps) for n in range(turns)]
            recall_s = statistics.median(
                dbos_recall_finished(f"wf-{n}", steps) for n in range(turns)
            )
        local_cfg = local.settings()
        local.close()

        default_inner: list[float] = []
        default_cfg: dict[str, str] = {}
        if not args.skip_dbos_default:
            with launched_dbos(folder / "dbos-default.sqlite3", wal=False):
                default_cfg = dbos_settings()
                dbos_run("warmup", steps)
                default_inner = [dbos_run(f"wf-{n}", steps)[0] for n in range(turns)]

    local_us = median_us_per_step(local_s, steps)
    dbos_us = median_us_per_step(dbos_inner, steps)
    replay_us = median_us_per_step(replay_s, steps)
    dbos_replay_us = median_us_per_step(dbos_replay_s, steps)
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "steps": steps,
        "turns": turns,
        "local_us_per_step": round(local_us, 1),
        "local_steps_per_s": round(1e6 / local_us),
        "dbos_us_per_step": round(dbos_us, 1),
        "dbos_steps_per_s": round(1e6 / dbos_us),
        "ratio": round(local_us / dbos_us, 3),
        "replay_us_per_step": round(replay_us, 2),
        "replay_steps_per_s": round(1e6 / replay_us),
        "dbos_replay_us_per_step": round(dbos_replay_us, 2),
        "dbos_replay_steps_per_s": round(1e6 / dbos_replay_us),
        "dbos_workflow_us_per_step": round(median_us_per_step(dbos_wall, steps), 1),
        "dbos_recall_finished_ms": round(recall_s * 1e3, 2),
        "dbos_launch_s": round(launch_s, 2),
        "fsync_us": round(fsync_us, 1),
        "local_sqlite": local_cfg,
        "dbos_sqlite": dbos_cfg,
        "sqlite_version": sqlite3.sqlite_version,
        "dbos_version": DBOS_VERSION,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    if default_inner:
        default_us = median_us_per_step(default_inner, steps)
        result |= {
            "dbos_default_us_per_step": round(default_us, 1),
            "ratio_vs_dbos_default": round(local_us / default_us, 3),
            "dbos_default_sqlite": default_cfg,
        }
    print_table(result, local_s, dbos_inner, steps)
    print(json.dumps(result, sort_keys=False))
    return 0


def print_table(r: dict[str, Any], local_s: list[float], dbos_s: list[float], steps: int) -> None:
    def spread(seconds: list[float]) -> str:
        return f"{min(seconds) / steps * 1e6:.0f}-{max(seconds) / steps * 1e6:.0f}"

    def cfg(c: dict[str, str]) -> str:
        return f"journal_mode={c['journal_mode']}, synchronous={c['synchronous']}"

    print(
        f"journal overhead, {r['steps']} trivial steps per turn, median of {r['turns']} turns"
        f" ({r['date']}, {r['cpus']} CPUs, Python {r['python']}, SQLite {r['sqlite_version']},"
        f" dbos {r['dbos_version']})"
    )
    print(f"fsync of 4 KiB on this disk: {r['fsync_us']:.0f} us (median)")
    print(f"  durable-harness local World: {cfg(r['local_sqlite'])}; 2 commits/step")
    print(f"  DBOS (same settings):        {cfg(r['dbos_sqlite'])}; 1 commit/step")
    if "dbos_default_sqlite" in r:
        print(f"  DBOS (as shipped):           {cfg(r['dbos_default_sqlite'])}; 1 commit/step")
    print()
    rows = [
        ("durable-harness local, live", r["local_us_per_step"], spread(local_s)),
        ("DBOS sqlite WAL+FULL, live", r["dbos_us_per_step"], spread(dbos_s)),
        ("  (whole workflow incl. start/finish)", r["dbos_workflow_us_per_step"], ""),
    ]
    if "dbos_default_us_per_step" in r:
        rows.append(("DBOS sqlite as shipped, live", r["dbos_default_us_per_step"], ""))
    rows += [
        ("durable-harness replay_only", r["replay_us_per_step"], ""),
        ("DBOS fork replay (recorded outputs)", r["dbos_replay_us_per_step"], ""),
    ]
    print(f"{'':40} {'us/step':>9} {'steps/s':>9}  {'min-max us':>10}")
    for name, us, rng in rows:
        print(f"{name:40} {us:9.1f} {1e6 / us:9.0f}  {rng:>10}")
    print()
    print(f"ratio durable-harness / DBOS (same settings): {r['ratio']:.2f}x (target <= 0.5x)")
    if "ratio_vs_dbos_default" in r:
        print(f"ratio durable-harness / DBOS (as shipped):    {r['ratio_vs_dbos_default']:.2f}x")
    print(
        f"DBOS launch {r['dbos_launch_s']:.2f} s (excluded); calling a finished DBOS workflow "
        f"by id returns its stored output in {r['dbos_recall_finished_ms']:.2f} ms (no step runs)"
    )


if __name__ == "__main__":
    sys.exit(main())
