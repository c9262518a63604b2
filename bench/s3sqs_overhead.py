"""Per-step cost and turn-resume latency of the S3+SQS World, beside the local World.

Both are measured in one run on this machine, against local servers started here:

* **s3sqs (moto)**: S3 and SQS on ``moto_server`` (in-memory, no disk);
* **s3sqs (SeaweedFS)**: S3 on ``weed mini`` (a real S3 server writing to disk), SQS on
  moto;
* **local**: the local World (SQLite WAL, ``synchronous=FULL``) in a temp folder.

**Per step**: a turn of ``--steps`` trivial ``safe`` tool steps through ``Journal.run``
(the intent, the call, the outcome), timed from the first step to the last, median of
``--turns`` turns after an untimed warm-up (``bench/journal_overhead.py``'s
``LocalBench`` does the driving for every World). Also the replay of a finished turn
(``replay_only``: one journal load, no writes).

**Resume**: a worker process claims a turn (lease ``--lease`` seconds, renewed), runs
slow steps, and is SIGKILLed after its third step. A standby worker in this process
polls ``claim`` every ``--poll`` seconds; the figure is the time from the SIGKILL to the
standby running the turn's next new step (claim + seal + journal load + replay of the
recorded steps). The lease has to run out first; the time from the lease's end (its last
renewal plus the lease) to that step is what the World adds. Median of ``--rounds``
rounds.

Run: ``python bench/s3sqs_overhead.py [--steps 200] [--turns 3] [--rounds 3]``. The last
line of the output is one JSON object with every figure. The Postgres World (its own
server, fsync on) is measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import services_s3  # noqa: E402  (tests/services_s3.py: the local servers)
from journal_overhead import LocalBench  # noqa: E402
from postgres_server import PostgresServer  # noqa: E402  (tests/postgres_server.py)

from durable_harness.core.world import World  # noqa: E402
from durable_harness.harness.journal import Journal, Outcome  # noqa: E402
from durable_harness.worlds import open_world  # noqa: E402

CHILD = r"""
import json, sys, time
from durable_harness.harness.journal import Journal, Outcome  # noqa: E402
from durable_harness.harness.lease import LeaseKeeper  # noqa: E402
from durable_harness.worlds import open_world  # noqa: E402

spec = json.loads(sys.argv[1])
world = open_world(spec["name"], **spec["options"])
lease = world.claim_turn(spec["turn_id"], "doomed", spec["lease"])
assert lease is not None
with LeaseKeeper(world, lease, spec["lease"]):
    journal = Journal(world, lease)
    for i in range(10_000):
        journal.run(kind="tool", name="slow", key=f"k{i}", input={"i": i},
                    call=lambda seq, i=i: (time.sleep(0.05), Outcome({"ok": i}))[1],
                    replay="safe")
        print(f"step {i}", flush=True)
"""


@dataclass
class WorldUnderTest:
    label: str
    name: str
    options: dict[str, Any]
    env: dict[str, str]

    def open(self) -> World:
        with services_s3.patched_environ(self.env):
            return open_world(self.name, **self.options)


class WorldBench(LocalBench):
    """``LocalBench``'s turns (``run_turn``, ``replay_turn``) over any World."""

    def __init__(self, world: World, steps: int) -> None:
        self.world = world  # type: ignore[assignment]
        self.steps = steps
        self.turn_ids = []


def per_step(target: WorldUnderTest, steps: int, turns: int) -> dict[str, float]:
    with target.open() as world:
        bench = WorldBench(world, steps)
        bench.run_turn(-1)  # warm-up: connections, caches
        live = [bench.run_turn(n) for n in range(turns)]
        replay = [bench.replay_turn(t) for t in bench.turn_ids[1:]]
    return {
        "us_per_step": round(statistics.median(live) / steps * 1e6, 1),
        "replay_us_per_step": round(statistics.median(replay) / steps * 1e6, 1),
    }


def resume_latency(
    target: WorldUnderTest, lease: float, poll: float, round_: int
) -> tuple[float, float]:
    """Seconds from SIGKILL of the worker running a turn to its next new step elsewhere,
    and from the end of its lease (last renewal + lease) to that step."""
    with target.open() as world:
        session, turn_id = f"resume-{round_}", f"resume-turn-{round_}-{time.time_ns()}"
        world.create_session(session)
        world.create_turn(session, turn_id, "resume benchmark", {"agent": "builtin"})
        spec = {"name": target.name, "options": target.options, "turn_id": turn_id, "lease": lease}
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(spec)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **target.env},
        )
        assert child.stdout is not None
        for line in child.stdout:
            if line.strip() == "step 2":
                break
        os.kill(child.pid, signal.SIGKILL)
        killed = time.time()
        child.wait()
        expires_at = world.get_turn(turn_id).lease_expires_at or killed
        while (standby := world.claim("standby", 30)) is None:
            time.sleep(poll)
        journal = Journal(world, standby)
        resumed: list[float] = []

        def first_live(i: int, seq: int) -> Outcome:
            resumed.append(time.time())
            return Outcome({"ok": i})

        i = 0
        while not resumed:
            journal.run(
                kind="tool",
                name="slow",
                key=f"k{i}",
                input={"i": i},
                call=functools.partial(first_live, i),
                replay="safe",
            )
            i += 1
        world.complete_turn(standby, "done")
        return resumed[0] - killed, resumed[0] - expires_at


@contextmanager
def targets(folder: Path) -> Iterator[list[WorldUnderTest]]:
    moto = services_s3.moto()
    seaweed = services_s3.seaweedfs()
    pg = PostgresServer(fsync=True).start()  # benchmarks keep fsync on
    found = [
        WorldUnderTest("local", "local", {"data_dir": str(folder / "local")}, {}),
        WorldUnderTest("postgres", "postgres", {"url": pg.url(pg.create_database("bench"))}, {}),
    ]
    for label, s3 in (("s3sqs (moto)", moto.url), ("s3sqs (SeaweedFS)", seaweed.url)):
        env = services_s3.aws_env(s3, moto.url)
        bucket, queue_url, _ = services_s3.make_bucket_and_queue(env, max_receive_count=1000)
        found.append(
            WorldUnderTest(label, "s3sqs", {"bucket": bucket, "queue_url": queue_url}, env)
        )
    try:
        yield found
    finally:
        services_s3.stop_all()
        pg.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per turn (200)")
    parser.add_argument("--turns", type=int, default=3, help="timed turns per World (3)")
    parser.add_argument("--rounds", type=int, default=3, help="resume rounds per World (3)")
    parser.add_argument("--lease", type=float, default=2.0, help="lease seconds (2)")
    parser.add_argument("--poll", type=float, default=0.05, help="standby poll seconds (0.05)")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "steps": args.steps,
        "turns": args.turns,
        "lease_s": args.lease,
        "poll_s": args.poll,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "worlds": {},
    }
    with tempfile.TemporaryDirectory(prefix="dh-bench-s3-") as tmp, targets(Path(tmp)) as found:
        for target in found:
            figures = per_step(target, args.steps, args.turns)
            rounds = [resume_latency(target, args.lease, args.poll, r) for r in range(args.rounds)]
            figures["resume_s"] = round(statistics.median(r[0] for r in rounds), 3)
            figures["resume_after_expiry_s"] = round(statistics.median(r[1] for r in rounds), 3)
            result["worlds"][target.label] = figures
            print(f"  measured {target.label}", file=sys.stderr)
    print_table(result)
    print(json.dumps(result))
    return 0


def print_table(r: dict[str, Any]) -> None:
    print(
        f"S3+SQS World beside the local World ({r['date']}, {r['cpus']} CPUs, Python "
        f"{r['python']}): {r['steps']} trivial steps per turn, median of {r['turns']} turns; "
        f"resume after SIGKILL with a {r['lease_s']} s lease, standby polling every "
        f"{r['poll_s']} s"
    )
    print(f"{'':22} {'us/step':>9} {'steps/s':>8} {'replay us/step':>15} {'resume s':>9}"
          f" {'after expiry s':>15}")  # fmt: skip
    row: Callable[[str, dict[str, float]], str] = lambda name, f: (  # noqa: E731
        f"{name:22} {f['us_per_step']:9.0f} {1e6 / f['us_per_step']:8.0f}"
        f" {f['replay_us_per_step']:15.1f} {f['resume_s']:9.2f} {f['resume_after_expiry_s']:15.2f}"
    )
    for name, figures in r["worlds"].items():
        print(row(name, figures))


if __name__ == "__main__":
    sys.exit(main())
