"""``serve``'s event stream: events per second one ``serve`` streams to many clients, and
the latency from a step's journal write to its event reaching a client, beside polling.

One machine, loopback, one run: a PostgreSQL server this script starts itself
(``tests/postgres_server.py``: initdb into a temp folder, ``fsync`` on), one real
``durable-harness serve`` process on that World, the clients in a process of their own
(asyncio, one ``httpx2`` SSE stream each) and the writers in this one:

1. **replay**: ``--clients`` finished turns with ``--events`` events each in the log;
   every client reads one turn's stream from the start to ``turn.ended``, all at once:
   events per second delivered by the one ``serve``.
2. **live**: ``--clients`` running turns, claimed and driven by this script as a worker
   drives a turn (``Journal`` with ``TurnEvents``: every ``--interval`` seconds a no-op
   tool step, i.e. an intent commit, ``step.started``, an outcome commit,
   ``step.finished``), each followed by one client. The latency of a step is from the
   return of its outcome commit (the journal write) to the client's receipt of its
   ``step.finished`` (one clock: one machine). Beside it, on the same steps:

   * **poll, in process**: one thread reads every turn's journal (``load_steps``) once a
     second: the best case of polling, latency from the outcome commit to the first read
     that saw it;
   * **poll, ``show --json``**: ``durable-harness show TURN --json`` run once a second
     for one turn, as a script polling the CLI would.

Run: ``python bench/api_stream.py [--clients 100] [--events 200] [--steps 20]``. The last
line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the server helper lives beside the tests' fixtures

from postgres_server import PostgresServer  # noqa: E402

from durable_harness.core import events as ev  # noqa: E402
from durable_harness.core.types import Lease  # noqa: E402
from durable_harness.harness.events import TurnEvents  # noqa: E402
from durable_harness.harness.journal import Journal, Outcome  # noqa: E402
from durable_harness.server.auth import create_token  # noqa: E402
from durable_harness.worlds.postgres import PostgresWorld  # noqa: E402

LEASE_SECONDS = 3600.0


# -- the clients (a process of their own) -------------------------------------------------
async def _follow(
    http: httpx2.AsyncClient, turn_id: str, out: list[tuple[str, int, str, int, float]]
) -> None:
    """Read one turn's stream to ``turn.ended``: (turn, seq, kind, step seq, received)."""
    async with http.sse(f"/v1/turns/{turn_id}/events", timeout=None) as source:
        if source.response.status_code != 200:
            await source.response.aread()
            raise RuntimeError(f"{turn_id}: {source.response.status_code} {source.response.text}")
        async for sse in source:
            if not sse.id:
                continue
            data = json.loads(sse.data)
            out.append(
                (turn_id, data["seq"], data["kind"], data["data"].get("seq", -1), time.time())
            )
            if data["kind"] == ev.TURN_ENDED:
                return


async def _clients(url: str, token: str, turns: list[str]) -> dict[str, Any]:
    out: list[tuple[str, int, str, int, float]] = []
    limits = httpx2.Limits(max_connections=len(turns) + 10)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(base_url=url, headers=headers, limits=limits) as http:
        started = time.time()
        await asyncio.gather(*(_follow(http, t, out) for t in turns))
        ended = time.time()
    return {"received": out, "started": started, "ended": ended}


def _client_process(url: str, token: str, turns: list[str], queue: Any) -> None:
    queue.put(asyncio.run(_clients(url, token, turns)))


def run_clients(url: str, token: str, turns: list[str]) -> tuple[Any, Any]:
    """Start the clients' process; return (process, result queue)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_client_process, args=(url, token, turns, queue))
    proc.start()
    return proc, queue


# -- the World side -------------------------------------------------------------------------
def new_turns(world: PostgresWorld, prefix: str, n: int) -> list[Lease]:
    leases = []
    for i in range(n):
        session_id, turn_id = f"{prefix}-s{i}", f"{prefix}-t{i}"
        world.create_session(session_id)
        world.create_turn(session_id, turn_id, "benchmark", {"agent": "builtin"})
        lease = world.claim_turn(turn_id, "bench", LEASE_SECONDS)
        if lease is None:
            raise RuntimeError(f"could not claim {turn_id}")
        leases.append(lease)
    return leases


def replay(world: PostgresWorld, url: str, token: str, clients: int, events: int) -> Any:
    leases = new_turns(world, "replay", clients)
    for lease in leases:
        writer = TurnEvents(world, lease.turn_id, lease.epoch, lease.attempt)
        writer.begin_attempt("bench")
        for n in range(events - 3):
            world.append_event(lease.turn_id, f"bench:{n}", "bench.filler", {"n": n})
        world.complete_turn(lease, "done")
        writer.ended("done", "done", None)
    proc, queue = run_clients(url, token, [lease.turn_id for lease in leases])
    result = queue.get(timeout=600)
    proc.join()
    received = result["received"]
    seconds = result["ended"] - result["started"]
    return {
        "clients": clients,
        "events": len(received),
        "seconds": round(seconds, 3),
        "events_per_s": round(len(received) / seconds),
    }


def _noop(i: int) -> Outcome:
    return Outcome({"ok": i})


def live(world: PostgresWorld, pg_url: str, url: str, token: str, args: argparse.Namespace) -> Any:
    leases = new_turns(world, "live", args.clients)
    committed: dict[tuple[str, int], float] = {}  # (turn, step seq) -> outcome commit returned
    polled: dict[tuple[str, int], float] = {}
    shown: dict[tuple[str, int], float] = {}
    lock = threading.Lock()
    stop = threading.Event()

    # Instrumentation, not a stand-in: the real World, with the time its outcome commit
    # returned noted per step.
    class Timed(PostgresWorld):
        def finish_step(self, turn_id: str, seq: int, *a: Any, **k: Any) -> None:
            super().finish_step(turn_id, seq, *a, **k)
            with lock:
                committed[(turn_id, seq)] = time.time()

    writers = Timed(pg_url)
    proc, queue = run_clients(url, token, [lease.turn_id for lease in leases])
    time.sleep(2.0)  # let every client connect before the first step

    def drive(lease: Lease, offset: float) -> None:
        events = TurnEvents(writers, lease.turn_id, lease.epoch, lease.attempt)
        events.begin_attempt("bench")
        journal = Journal(writers, lease, events=events)
        time.sleep(offset)
        for i in range(args.steps):
            journal.run(
                kind="tool",
                name="noop",
                key=f"k{i}",
                input={"i": i},
                call=lambda seq, i=i: _noop(i),  # type: ignore[misc]
                replay="safe",
            )
            time.sleep(args.interval)
        writers.complete_turn(lease, "done")
        events.ended("done", "done", None)
        events.close()

    def poll_in_process() -> None:
        while not stop.is_set():
            for lease in leases:
                for step in world.load_steps(lease.turn_id):
                    if step.status == "done":
                        polled.setdefault((lease.turn_id, step.seq), time.time())
            stop.wait(1.0)

    def poll_show(turn_id: str, env: dict[str, str]) -> None:
        while not stop.is_set():
            started = time.time()
            out = subprocess.run(
                [sys.executable, "-m", "durable_harness.cli", "show", turn_id, "--json"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode == 0:
                for step in json.loads(out.stdout)["steps"]:
                    if step["status"] == "done":
                        shown.setdefault((turn_id, step["seq"]), time.time())
            stop.wait(max(0.0, 1.0 - (time.time() - started)))

    env = pg_env(pg_url)
    pollers = [
        threading.Thread(target=poll_in_process, daemon=True),
        threading.Thread(target=poll_show, args=(leases[0].turn_id, env), daemon=True),
    ]
    for poller in pollers:
        poller.start()
    spread = args.interval / max(len(leases), 1)
    threads = [
        threading.Thread(target=drive, args=(lease, i * spread)) for i, lease in enumerate(leases)
    ]
    started = time.time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = queue.get(timeout=600)
    proc.join()
    stop.set()
    for poller in pollers:
        poller.join(timeout=30)
    writers.close()

    received = result["received"]
    got = {(t, step): at for t, _seq, kind, step, at in received if kind == ev.STEP_FINISHED}
    stream_ms = [(got[k] - committed[k]) * 1000 for k in committed if k in got]
    poll_ms = [(polled[k] - committed[k]) * 1000 for k in committed if k in polled]
    show_ms = [(shown[k] - committed[k]) * 1000 for k in committed if k in shown]
    seconds = result["ended"] - started
    return {
        "clients": len(leases),
        "steps_per_turn": args.steps,
        "interval_s": args.interval,
        "events": len(received),
        "events_per_s": round(len(received) / seconds),
        "missing": len(committed) - len(stream_ms),
        "stream_ms": _stats(stream_ms),
        "poll_in_process_ms": _stats(poll_ms),
        "poll_show_json_ms": _stats(show_ms),
    }


def _stats(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "median": round(statistics.median(ordered), 1),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
    }


def pg_env(pg_url: str) -> dict[str, str]:
    """The environment of a ``durable-harness`` process on the benchmark's World."""
    return {
        **os.environ,
        "DURABLE_HARNESS_WORLD": "postgres",
        "DURABLE_HARNESS_POSTGRES_URL": pg_url,
    }


def start_serve(pg_url: str, clients: int) -> tuple[subprocess.Popen[str], str]:
    # One tenant holds every stream here: its cap is the clients' number.
    env = {**pg_env(pg_url), "DURABLE_HARNESS_API_MAX_STREAMS_PER_TENANT": str(clients + 10)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_harness.cli", "serve", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on " not in line:
        proc.kill()
        raise RuntimeError(f"serve did not start: {line!r}")
    return proc, line.split("listening on ", 1)[1].split(" ", 1)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100, help="concurrent clients (100)")
    parser.add_argument("--events", type=int, default=200, help="events per replayed turn")
    parser.add_argument("--steps", type=int, default=20, help="steps per live turn (20)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between steps")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dh-api-bench-"), PostgresServer(fsync=True) as pg:
        pg_url = pg.url(pg.create_database("world"))
        world = PostgresWorld(pg_url)
        token = create_token(world, "bench", operator=True)[1]
        serve, url = start_serve(pg_url, args.clients)
        try:
            result: dict[str, Any] = {
                "date": datetime.date.today().isoformat(),
                "replay": replay(world, url, token, args.clients, args.events),
                "live": live(world, pg_url, url, token, args),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
            }
        finally:
            serve.terminate()
            serve.wait(timeout=30)
            world.close()
    print_table(result)
    print(json.dumps(result))
    return 0


def print_table(r: dict[str, Any]) -> None:
    rep, liv = r["replay"], r["live"]
    print(f"serve's event stream, PostgreSQL World, {r['date']}, {r['cpus']} CPUs")
    print(
        f"  replay: {rep['clients']} clients, {rep['events']} events in {rep['seconds']} s:"
        f" {rep['events_per_s']} events/s"
    )
    print(
        f"  live:   {liv['clients']} running turns, {liv['events']} events,"
        f" {liv['events_per_s']} events/s, {liv['missing']} steps not seen"
    )
    for name, key in (
        ("SSE stream", "stream_ms"),
        ("poll load_steps 1/s", "poll_in_process_ms"),
        ("poll show --json 1/s", "poll_show_json_ms"),
    ):
        s = liv[key]
        if s.get("n"):
            print(f"    {name:<22} median {s['median']:>8} ms   p99 {s['p99']:>8} ms   n={s['n']}")


if __name__ == "__main__":
    raise SystemExit(main())
