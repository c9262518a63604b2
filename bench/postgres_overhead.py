"""The PostgreSQL World measured on one PostgreSQL server (``fsync`` on) that this script
starts itself (``tests/postgres_server.py``: initdb into a temp folder, 127.0.0.1 only):

1. **Per-step journal cost** of a 200-step turn, beside DBOS Transact 3.x on the same
   server. durable-harness: ``Journal.run`` over a :class:`PostgresWorld`, each step an
   intent commit, a trivial call, an outcome commit (two durable commits: invariant 1).
   DBOS: a ``@DBOS.workflow`` calling trivial ``@DBOS.step`` functions with
   ``system_database_url`` on a database of the same server. As in
   ``bench/journal_overhead.py``, only the step loop is timed (the median of ``--turns``
   turns after a warm-up, the two systems alternating).
2. **Claim + ack throughput** with 1, 4 and 16 worker processes: turns are queued first,
   then every process loops ``claim`` -> ``complete_turn`` until the queue is empty.
3. **Redelivery latency**: a real ``durable-harness worker`` drives a turn (a slow tool
   under the fake model) and is SIGKILLed; another, idle, worker waits. Timed from the
   kill until the turn's epoch moves on (the other worker holds it), ``--kills`` times,
   with a lease of ``--lease`` seconds. Target: at most lease + 1 s.

Run: ``python bench/postgres_overhead.py``. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the server helper lives beside the tests' fixtures

from journal_overhead import (  # noqa: E402  (bench/ is on sys.path when run as a script)
    DBOS,
    DBOS_VERSION,
    _noop,
    dbos_run,
    fsync_latency_us,
    median_us_per_step,
)
from postgres_server import PostgresServer  # noqa: E402

from durable_harness.harness.journal import Journal  # noqa: E402
from durable_harness.testing.fake_model import FakeModelServer  # noqa: E402
from durable_harness.worlds.postgres import PostgresWorld  # noqa: E402

LEASE_SECONDS = 600.0
FIXTURES = ROOT / "tests" / "fixtures"


# -- 1. per-step cost ---------------------------------------------------------------------
class PostgresBench:
    def __init__(self, url: str, steps: int) -> None:
        self.world = PostgresWorld(url)
        self.steps = steps

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
                call=lambda seq, i=i: _noop(i, seq),  # type: ignore[misc]
                replay="safe",
            )
            if result.value != {"ok": i}:
                raise RuntimeError(f"step {i} returned {result.value!r}")
        elapsed = time.perf_counter() - started
        self.world.complete_turn(lease, "done")
        return elapsed


def per_step(pg: PostgresServer, steps: int, turns: int) -> dict[str, Any]:
    bench = PostgresBench(pg.url(pg.create_database("world")), steps)
    dbos_url = pg.url(pg.create_database("dbos"))
    DBOS(
        config={
            "name": "postgres-overhead-bench",
            "system_database_url": dbos_url,
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    try:
        bench.run_turn(-1)  # warm-up, untimed
        dbos_run("warmup", steps)
        # WAL flushes per step (pg_stat_wal.wal_sync): what fsync costs each side.
        syncs = wal_syncs(pg, lambda: bench.run_turn(-2)) / steps
        dbos_syncs = wal_syncs(pg, lambda: dbos_run("syncs", steps)) / steps
        ours, theirs = [], []
        for n in range(turns):
            ours.append(bench.run_turn(n))
            theirs.append(dbos_run(f"wf-{n}", steps)[0])
    finally:
        DBOS.destroy()
        bench.world.close()
    ours_us, theirs_us = median_us_per_step(ours, steps), median_us_per_step(theirs, steps)
    return {
        "pg_us_per_step": round(ours_us, 1),
        "pg_steps_per_s": round(1e6 / ours_us),
        "dbos_pg_us_per_step": round(theirs_us, 1),
        "dbos_pg_steps_per_s": round(1e6 / theirs_us),
        "ratio": round(ours_us / theirs_us, 3),
        "pg_wal_syncs_per_step": round(syncs, 2),
        "dbos_wal_syncs_per_step": round(dbos_syncs, 2),
        "pg_us_spread": [round(min(ours) / steps * 1e6), round(max(ours) / steps * 1e6)],
        "dbos_us_spread": [round(min(theirs) / steps * 1e6), round(max(theirs) / steps * 1e6)],
    }


def wal_syncs(pg: PostgresServer, run: Any) -> int:
    """WAL fsyncs the server did during ``run()``. An idle backend reports its statistics
    up to 10 s late (PGSTAT_IDLE_INTERVAL), hence the waits."""

    def count() -> int:
        time.sleep(11.0)
        return int(pg.admin("SELECT wal_sync FROM pg_stat_wal")[0][0])

    before = count()
    run()
    return count() - before


# -- 2. claim + ack throughput ------------------------------------------------------------
def _claimer(url: str, owner: str, ready: Any, go: Any, out: Any) -> None:
    world = PostgresWorld(url)
    ready.put(owner)
    go.wait()
    done = 0
    while (lease := world.claim(owner, 60)) is not None:
        world.complete_turn(lease, "ok")
        done += 1
    out.put((done, time.monotonic()))
    world.close()


def throughput(pg: PostgresServer, workers: int, turns: int) -> dict[str, Any]:
    """Turns per second claimed and acked by ``workers`` processes, each with its own World,
    timed from the moment all of them are connected until the queue is empty."""
    url = pg.url(pg.create_database(f"queue{workers}"))
    with PostgresWorld(url) as world:
        world.create_session("s")
        for n in range(turns):
            world.create_turn("s", f"t{n:06d}", "queued", {})
    ctx = multiprocessing.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_claimer, args=(url, f"w{i}", ready, go, out)) for i in range(workers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    started = time.monotonic()  # CLOCK_MONOTONIC is system-wide: comparable across processes
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    total = sum(done for done, _ in results)
    if total != turns:
        raise RuntimeError(f"{workers} workers claimed {total} of {turns} turns")
    elapsed = max(end for _, end in results) - started
    return {
        "workers": workers,
        "turns": turns,
        "seconds": round(elapsed, 2),
        "per_s": round(turns / elapsed),
    }


# -- 3. SIGKILL to running again ----------------------------------------------------------
def redelivery(pg: PostgresServer, lease: float, kills: int, tmp: Path) -> dict[str, Any]:
    url = pg.url(pg.create_database("kill"))
    log = tmp / "fake-model.jsonl"
    latencies: list[float] = []
    with FakeModelServer(FIXTURES / "slow.toml", log_path=log) as model, PostgresWorld(url) as w:
        model.start()
        env = {
            **os.environ,
            "ANTHROPIC_BASE_URL": model.url,
            "DURABLE_HARNESS_WORLD": "postgres",
            "DURABLE_HARNESS_POSTGRES_URL": url,
            "DURABLE_HARNESS_LEASE_SECONDS": str(lease),
            "DURABLE_HARNESS_MAX_ATTEMPTS": str(kills + 5),
            "SLOW_TOOL_RUNS": str(tmp / "runs.txt"),
            "SLOW_TOOL_SECONDS": "3600",  # the turn runs until its worker is killed
            "DURABLE_HARNESS_TOOL_SETS": str(FIXTURES / "slow_tools.py"),  # the workers run it
        }
        env.pop("ANTHROPIC_API_KEY", None)
        run = [sys.executable, "-m", "durable_harness.cli"]
        tools = f"{FIXTURES / 'slow_tools.py'}:TOOLS"
        out = subprocess.run(
            [*run, "run", "--detach", "--tools", tools, "look up everything"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        turn_id = out.stdout.split()[3]
        workers = [_worker(run, env) for _ in range(2)]
        try:
            for _ in range(kills):
                holder = _wait(lambda: _held(w, turn_id), 60)
                # After a renewal or two, at a random point of the renewal cycle.
                time.sleep(lease * random.uniform(1.0, 2.0))
                victim = next(p for p in workers if str(p.pid) == holder.split(":")[-1])
                epoch = w.get_turn(turn_id).epoch
                os.killpg(victim.pid, signal.SIGKILL)
                killed = time.monotonic()
                _wait(lambda e=epoch: w.get_turn(turn_id).epoch > e or None, 60, 0.002)
                latencies.append(time.monotonic() - killed)
                victim.wait()
                workers.remove(victim)
                workers.append(_worker(run, env))
                _wait(lambda: _listening(w, len(workers) - 1), 60)
        finally:
            for p in workers:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return {
        "lease_s": lease,
        "kills": kills,
        "median_s": round(statistics.median(latencies), 3),
        "max_s": round(max(latencies), 3),
        "all_s": [round(x, 3) for x in latencies],
    }


def _worker(run: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*run, "worker", "-q"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _held(world: PostgresWorld, turn_id: str) -> str | None:
    turn = world.get_turn(turn_id)
    return turn.lease_owner if turn.status.value == "running" else None


def _listening(world: PostgresWorld, at_least: int) -> bool | None:
    from durable_harness.worlds.postgres import sql

    row = world._run(
        "bench",
        lambda c, _: c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%%' OR query = %s",
            (sql.NEXT_VISIBLE,),
        ).fetchone(),
    )
    return True if row and row[0] >= at_least else None


def _wait(probe: Any, timeout: float, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout}s")


# -- main -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per turn (200)")
    parser.add_argument("--turns", type=int, default=5, help="timed turns per system (5)")
    parser.add_argument("--queue", type=int, default=2000, help="turns per throughput run")
    parser.add_argument("--workers", default="1,4,16", help="throughput worker counts")
    parser.add_argument("--lease", type=float, default=2.0, help="lease for the kill test (s)")
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLs to time")
    args = parser.parse_args(argv)
    if DBOS is None:
        print("DBOS is not installed: pip install 'dbos>=3'", file=sys.stderr)
        return 2
    with (
        tempfile.TemporaryDirectory(prefix="dh-pg-bench-") as tmp,
        PostgresServer(fsync=True) as pg,
    ):
        settings = dict(
            pg.admin(
                "SELECT name, setting FROM pg_settings WHERE name IN"
                " ('fsync', 'synchronous_commit', 'wal_sync_method', 'server_version')"
            )
        )
        fsync_us = fsync_latency_us(pg.root) if os.access(pg.root, os.W_OK) else None
        result: dict[str, Any] = {
            "date": datetime.date.today().isoformat(),
            "steps": args.steps,
            "turns": args.turns,
            **per_step(pg, args.steps, args.turns),
            "throughput": [throughput(pg, int(n), args.queue) for n in args.workers.split(",")],
            "redelivery": redelivery(pg, args.lease, args.kills, Path(tmp)),
            "postgres": settings,
            "fsync_us": None if fsync_us is None else round(fsync_us, 1),
            "dbos_version": DBOS_VERSION,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        }
    print_table(result)
    print(json.dumps(result))
    return 0


def print_table(r: dict[str, Any]) -> None:
    pg = r["postgres"]
    print(
        f"PostgreSQL World, {r['date']}, {r['cpus']} CPUs, PostgreSQL {pg.get('server_version')}"
        f" (fsync={pg.get('fsync')}, synchronous_commit={pg.get('synchronous_commit')},"
        f" wal_sync_method={pg.get('wal_sync_method')}), dbos {r['dbos_version']}"
    )
    if r["fsync_us"] is not None:
        print(f"fsync of 4 KiB in the data folder's file system: {r['fsync_us']:.0f} us")
    print(f"\nper step, {r['steps']}-step turn, median of {r['turns']}:")
    print(f"  durable-harness PostgresWorld  {r['pg_us_per_step']:8.1f} us")
    print(f"  DBOS Transact on PostgreSQL    {r['dbos_pg_us_per_step']:8.1f} us")
    print(f"  ratio {r['ratio']:.2f}x (target <= 0.5x)")
    print(
        f"  WAL fsyncs per step: durable-harness {r['pg_wal_syncs_per_step']},"
        f" DBOS {r['dbos_wal_syncs_per_step']}"
    )
    print("\nclaim + ack throughput:")
    for t in r["throughput"]:
        print(
            f"  {t['workers']:>3} workers: {t['per_s']:>6} turns/s"
            f" ({t['turns']} in {t['seconds']} s)"
        )
    d = r["redelivery"]
    print(
        f"\nSIGKILL to running again on another worker (lease {d['lease_s']} s,"
        f" {d['kills']} kills): median {d['median_s']} s, max {d['max_s']} s"
        f" (target <= {d['lease_s'] + 1} s)"
    )


if __name__ == "__main__":
    sys.exit(main())
