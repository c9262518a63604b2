"""SIGKILL of a worker mid-turn to the turn running on another worker, with the default
30 s lease, on the local World and on PostgreSQL (a server this script starts itself:
``tests/postgres_server.py``).

Two real ``durable-harness worker`` processes share one World; the turn's tool sleeps until
its worker is killed. The worker holding the turn is SIGKILLed at a random moment; the time
is taken from the kill until the turn's epoch moves on (the other worker holds it), ``--kills``
times per World, and the median printed. Both Worlds detect the dead holder
(``worlds/local/holder.py``, ``worlds/postgres/holder.py``): target under 1 s, where waiting
for the lease would take 30 s. S3+SQS keeps the lease (lease + about 1 s; not measured here).

Run: ``python bench/takeover.py``. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the server helper lives beside the tests' fixtures
FIXTURES = ROOT / "tests" / "fixtures"

from postgres_server import PostgresServer  # noqa: E402

from durable_harness.core.world import World  # noqa: E402
from durable_harness.testing.fake_model import FakeModelServer  # noqa: E402
from durable_harness.worlds import open_world  # noqa: E402


def takeover(world_env: dict[str, str], lease: float, kills: int, tmp: Path) -> dict[str, Any]:
    """Median seconds from SIGKILL to the turn held by the other worker."""
    latencies: list[float] = []
    with FakeModelServer(FIXTURES / "slow.toml", log_path=tmp / "fake-model.jsonl") as model:
        model.start()
        env = {
            **os.environ,
            **world_env,
            "ANTHROPIC_BASE_URL": model.url,
            "DURABLE_HARNESS_LEASE_SECONDS": str(lease),
            "DURABLE_HARNESS_MAX_ATTEMPTS": str(kills + 5),
            "SLOW_TOOL_RUNS": str(tmp / "runs.txt"),
            "SLOW_TOOL_SECONDS": "3600",  # the turn runs until its worker is killed
            "DURABLE_HARNESS_TOOL_SETS": str(FIXTURES / "slow_tools.py"),
        }
        env.pop("ANTHROPIC_API_KEY", None)
        run = [sys.executable, "-m", "durable_harness.cli"]
        tools = f"{FIXTURES / 'slow_tools.py'}:TOOLS"
        out = subprocess.run(
            [*run, "run", "--detach", "--tools", tools, "look up everything"],
            env=env,
            cwd=tmp,  # not inside a repository: nothing to seed the workspace from
            capture_output=True,
            text=True,
            check=True,
        )
        turn_id = out.stdout.split()[3]
        with _world(world_env) as world:
            workers = [_worker(run, env, tmp) for _ in range(2)]
            try:
                for _ in range(kills):
                    holder = _wait(lambda: _held(world, turn_id), 60)
                    time.sleep(random.uniform(1.0, 3.0))  # the other worker is idle by now
                    victim = next(p for p in workers if str(p.pid) == holder.split(":")[-1])
                    epoch = world.get_turn(turn_id).epoch
                    os.killpg(victim.pid, signal.SIGKILL)
                    killed = time.monotonic()
                    _wait(lambda e=epoch: world.get_turn(turn_id).epoch > e or None, 60, 0.002)
                    latencies.append(time.monotonic() - killed)
                    victim.wait()
                    workers.remove(victim)
                    workers.append(_worker(run, env, tmp))
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


@contextmanager
def _world(world_env: dict[str, str]) -> Iterator[World]:
    if world_env["DURABLE_HARNESS_WORLD"] == "postgres":
        world = open_world("postgres", url=world_env["DURABLE_HARNESS_POSTGRES_URL"])
    else:
        world = open_world("local", data_dir=world_env["DURABLE_HARNESS_DATA_DIR"])
    with world:
        yield world


def _worker(run: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*run, "worker", "-q"],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _held(world: World, turn_id: str) -> str | None:
    turn = world.get_turn(turn_id)
    return turn.lease_owner if turn.status.value == "running" else None


def _wait(probe: Any, timeout: float, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lease", type=float, default=30.0, help="the lease (s), 30")
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs per World, 10")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"date": datetime.date.today().isoformat()}
    with tempfile.TemporaryDirectory(prefix="dh-takeover-") as tmp:
        local = Path(tmp) / "local"
        local.mkdir()
        env = {"DURABLE_HARNESS_WORLD": "local", "DURABLE_HARNESS_DATA_DIR": str(local / "w")}
        result["local"] = takeover(env, args.lease, args.kills, local)
        with PostgresServer(fsync=True) as pg:
            pgdir = Path(tmp) / "postgres"
            pgdir.mkdir()
            env = {
                "DURABLE_HARNESS_WORLD": "postgres",
                "DURABLE_HARNESS_POSTGRES_URL": pg.url(pg.create_database("takeover")),
            }
            result["postgres"] = takeover(env, args.lease, args.kills, pgdir)
    result.update(python=platform.python_version(), cpus=os.cpu_count())
    for name in ("local", "postgres"):
        r = result[name]
        print(
            f"{name:9} SIGKILL -> running on the other worker: median {r['median_s']:.3f} s,"
            f" max {r['max_s']:.3f} s ({r['kills']} kills, lease {r['lease_s']:.0f} s)"
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
