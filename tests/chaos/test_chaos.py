"""Chaos: real workers SIGKILLed at random while they drive turns of the built-in agent.

Four ``durable-harness worker`` processes (each its own process group) share one World;
every ~2 s one of those holding a turn's lease is SIGKILLed and a new one started, up to
:attr:`ChaosBackend.kills` kills; then the fleet finishes the turns undisturbed. A kill
needs a victim that holds a lease (one that has claimed a turn, not one still importing),
and the kills are counted, not timed: on a loaded machine a worker may take longer than
the kill interval to claim anything, and a kill per interval regardless would keep the
turns from ever finishing (a livelock of the test, not of the harness).
Each turn checks for its report, sends it with a ``never`` tool whose side effect is a
line in a ledger file, notes it in the workspace and replies (``tests/fixtures/chaos.toml``).

Counted at the end, across all turns:

* every turn is ``done`` with the reply of a clean run (``durable-harness ls --json``);
* each turn's report was sent exactly once (the ledger): an interrupted send is reported
  as *possibly ran*, and the scripted model checks before sending again;
* no model call was repeated for a finished step: every request in the fake model's log
  (JSONL, one line per request, written before the answer) matches a model step whose
  input hash is the request hash, was logged before that step's outcome was recorded,
  and no step saw more requests than its recorded attempts (a request repeats only when
  a worker died while it was in flight).

Adding a backend is one entry in :data:`CHAOS_BACKENDS` (its own turn count).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import postgres_server
import pytest
import services_s3
from support import FIXTURES, operator_policy

from durable_harness.core.settings import Settings
from durable_harness.core.types import StepStatus, Turn, TurnStatus
from durable_harness.core.world import World
from durable_harness.runtime.admission import grant
from durable_harness.runtime.turns import start_turn, turn_config
from durable_harness.testing.fake_model import FakeModelServer
from durable_harness.worlds import open_world

WORKERS = 4
KILL_EVERY = 2.0  # seconds, jittered +-25%
LEASE_SECONDS = "2"
# Idle, s3sqs takes ~65 s; with three busy loops beside it on 2 CPUs, ~165 s.
BUDGET_SECONDS = 330.0
POLL = 0.25  # seconds between looks at the turns (each look reads the unfinished ones)
CHAOS_TOOLS = f"{FIXTURES / 'chaos_tools.py'}:TOOLS"
CLEAN_PROMPT = "chaos job clean: send the report once."


@dataclass(frozen=True)
class ChaosBackend:
    """A World to torture: ``world`` yields ``open_world`` options of a fresh World (as
    tests/worlds/conftest.py's factories do); ``env`` turns them into the environment a
    ``durable-harness`` process needs to open the same World."""

    turns: int
    kills: int  # at most this many SIGKILLs, then the turns finish undisturbed
    world: Callable[[Path], contextlib.AbstractContextManager[dict[str, Any]]]
    env: Callable[[dict[str, Any]], dict[str, str]]


@contextlib.contextmanager
def postgres_world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    if postgres_server.find_bindir() is None:
        pytest.fail("PostgreSQL binaries not found: run scripts/setup (it installs them)")
    with postgres_server.fresh_world() as options:
        yield options


@contextlib.contextmanager
def s3sqs_world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """S3 and SQS on moto server; the AWS variables are in os.environ meanwhile."""
    server = services_s3.moto()
    with services_s3.s3sqs_env(server.url, server.url, max_receive_count=100) as options:
        yield options


CHAOS_BACKENDS: dict[str, ChaosBackend] = {
    "s3sqs": ChaosBackend(
        turns=20,
        kills=20,
        world=s3sqs_world,
        env=lambda o: {
            "DURABLE_HARNESS_WORLD": "s3sqs",
            "DURABLE_HARNESS_S3_BUCKET": o["bucket"],
            "DURABLE_HARNESS_SQS_QUEUE_URL": o["queue_url"],
        },
    ),
    "postgres": ChaosBackend(
        turns=50,
        kills=60,
        world=postgres_world,
        env=lambda o: {
            "DURABLE_HARNESS_WORLD": "postgres",
            "DURABLE_HARNESS_POSTGRES_URL": o["url"],
        },
    ),
}


class Fleet:
    """The worker processes: started, SIGKILLed as a group, replaced."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.started = 0
        self.kills = 0
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        self.started += 1
        with (self.logs / f"worker-{self.started:03d}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "durable_harness.cli", "worker"],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killed as a group
            )
        self.procs.append(proc)
        return proc

    def kill_one(self, rng: random.Random, holders: set[str]) -> bool:
        """SIGKILL one worker that holds a lease (its owner is ``host:pid``) and start
        another; False if none holds one now."""
        victims = [p for p in self.procs if any(h.endswith(f":{p.pid}") for h in holders)]
        if not victims:
            return False
        victim = rng.choice(victims)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        self.procs.remove(victim)
        self.kills += 1
        self.start()
        return True

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self.procs.clear()


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_harness.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.timeout(BUDGET_SECONDS + 120)
@pytest.mark.parametrize("backend_name", sorted(CHAOS_BACKENDS))
def test_chaos(backend_name: str, tmp_path: Path) -> None:
    backend = CHAOS_BACKENDS[backend_name]
    ledger, model_log = tmp_path / "ledger.txt", tmp_path / "fake-model.jsonl"
    (tmp_path / "logs").mkdir()
    with (
        backend.world(tmp_path) as options,
        FakeModelServer(FIXTURES / "chaos.toml", log_path=model_log) as model,
        open_world(backend_name, **options) as world,
    ):
        model.start()
        env = {
            **os.environ,
            **backend.env(options),
            "ANTHROPIC_BASE_URL": model.url,
            "DURABLE_HARNESS_LEASE_SECONDS": LEASE_SECONDS,
            "DURABLE_HARNESS_POLL_SECONDS": "0.2",
            # Redeliveries caused by the kills, and takeovers of a lease that a starved
            # worker could not renew in 2 s on a loaded machine, must not dead-letter a turn.
            "DURABLE_HARNESS_MAX_ATTEMPTS": "50",
            "CHAOS_LEDGER": str(ledger),
            **operator_policy(tmp_path),
        }
        clean = cli(env, "run", "-q", "--tools", CHAOS_TOOLS, CLEAN_PROMPT)
        assert clean.returncode == 0, clean.stderr
        clean_reply = clean.stdout.strip().splitlines()[-1]
        clean_turn = clean.stdout.split()[3]

        turn_ids = create_turns(world, env, backend.turns)
        started = time.monotonic()
        fleet = Fleet(env, tmp_path / "logs")
        rng = random.Random(int(os.environ.get("CHAOS_SEED", "0")) or None)
        try:
            for _ in range(WORKERS):
                fleet.start()
            next_kill = time.monotonic() + KILL_EVERY * rng.uniform(0.75, 1.25)
            pending = set(turn_ids)
            while pending:
                turns = {t: world.get_turn(t) for t in pending}
                pending = {t for t, turn in turns.items() if turn.status not in ENDED}
                elapsed = time.monotonic() - started
                assert elapsed < BUDGET_SECONDS, stuck(world, turns, fleet, elapsed)
                if fleet.kills < backend.kills and time.monotonic() >= next_kill:
                    holders = {
                        turn.lease_owner
                        for turn in turns.values()
                        if turn.status is TurnStatus.RUNNING and turn.lease_owner
                    }
                    if fleet.kill_one(rng, holders):
                        next_kill = time.monotonic() + KILL_EVERY * rng.uniform(0.75, 1.25)
                time.sleep(POLL)
        finally:
            fleet.stop()
        elapsed = time.monotonic() - started

        listed = cli(env, "ls", "--json", "--limit", str(backend.turns + 10))
        assert listed.returncode == 0, listed.stderr
        rows = {r["turn_id"]: r for r in json.loads(listed.stdout)}
        steps = {t: world.load_steps(t) for t in [*turn_ids, clean_turn]}

    totals, problems = tally(turn_ids, rows, steps, ledger, model_log, clean_reply)
    totals |= {"kills": fleet.kills, "workers started": fleet.started, "seconds": round(elapsed)}
    report = f"chaos [{backend_name}] " + ", ".join(f"{k}: {v}" for k, v in totals.items())
    print("\n" + report)
    assert problems == [], report + "\n" + "\n".join(problems[:20])
    assert fleet.kills >= 3 and totals["redelivered turns"] >= 1, report  # chaos happened


def create_turns(world: World, env: dict[str, str], n: int) -> list[str]:
    """``n`` turns, each in its own session, queued for the workers (as ``run --detach``)."""
    settings = Settings.load()
    config = turn_config(
        agent="builtin",
        workspace="virtual",
        tools=[CHAOS_TOOLS],
        model=None,
        base_url=env["ANTHROPIC_BASE_URL"],
        settings=settings,
    )
    grant(config)  # this test enqueues as its operator, as `run --detach` would
    return [
        start_turn(world, settings, f"chaos job {i}: send the report once.", config).turn_id
        for i in range(n)
    ]


ENDED = (TurnStatus.DONE, TurnStatus.FAILED)


def stuck(world: World, turns: dict[str, Turn], fleet: Fleet, elapsed: float) -> str:
    """What the unfinished turns look like when the time is up, for the failure message."""
    now = time.time()
    alive = {p.pid for p in fleet.procs if p.poll() is None}
    lines = [
        f"chaos did not finish in {elapsed:.0f}s: {fleet.kills} kills, "
        f"{fleet.started} workers started, alive now: {sorted(alive)}"
    ]
    for turn_id, turn in sorted(turns.items()):
        if turn.status in ENDED:
            continue
        lease = turn.lease_expires_at
        lines.append(
            f"  {turn_id}: {turn.status.value}, {turn.attempts} deliveries, "
            f"{len(world.load_steps(turn_id))} steps, lease owner {turn.lease_owner} "
            + (f"expires in {lease - now:.1f}s" if lease is not None else "(no lease)")
            + (f", error {turn.error!r}" if turn.error else "")
        )
    return "\n".join(lines)


def tally(
    turn_ids: list[str],
    rows: dict[str, dict[str, Any]],
    steps: dict[str, list[Any]],
    ledger: Path,
    model_log: Path,
    clean_reply: str,
) -> tuple[dict[str, int], list[str]]:
    """Totals across all turns, and every broken promise found."""
    problems: list[str] = []
    for t in turn_ids:
        row = rows.get(t)
        if row is None or row["status"] != "done":
            problems.append(f"turn {t} did not complete: {row}")
        elif row["result"] != clean_reply:
            problems.append(f"turn {t} replied {row['result']!r}, a clean run {clean_reply!r}")

    sends = Counter(line.split(" ", 1)[0] for line in ledger.read_text().splitlines())
    problems += [f"turn {t} sent its report {sends[t]} times" for t in turn_ids if sends[t] != 1]

    model_steps = {s.input_hash: s for ss in steps.values() for s in ss if s.kind == "model"}
    requests = [json.loads(line) for line in model_log.read_text().splitlines() if line]
    by_hash = Counter(r["request_hash"] for r in requests)
    repeated_for_finished = 0
    for r in requests:
        step = model_steps.get(r["request_hash"])
        sent_at = datetime.fromisoformat(r["time"]).timestamp()
        if step is None:
            problems.append(f"model request {r['request_hash'][:12]} matches no journal step")
        elif step.finished_at is not None and sent_at > step.finished_at:
            repeated_for_finished += 1
            problems.append(f"turn {step.turn_id} step {step.seq}: model called after it finished")
    for digest, n in by_hash.items():
        step = model_steps.get(digest)
        if step is not None and n > step.attempts:
            problems.append(
                f"turn {step.turn_id} step {step.seq}: {n} model requests, {step.attempts} runs"
            )

    chaos_steps = [s for t in turn_ids for s in steps[t]]
    totals = {
        "turns": len(turn_ids),
        "done": sum(rows.get(t, {}).get("status") == "done" for t in turn_ids),
        "deliveries": sum(int(rows[t]["deliveries"]) for t in turn_ids if t in rows),
        "redelivered turns": sum(int(rows[t]["deliveries"]) > 1 for t in turn_ids if t in rows),
        "steps": len(chaos_steps),
        "possibly_ran steps": sum(s.status is StepStatus.POSSIBLY_RAN for s in chaos_steps),
        "model requests": len(requests),
        "model requests repeated (interrupted in flight)": sum(n - 1 for n in by_hash.values()),
        "model requests repeated for finished steps": repeated_for_finished,
        "never side effects": sum(sends[t] for t in turn_ids),
        "duplicate side effects": sum(max(sends[t] - 1, 0) for t in turn_ids),
        "replies equal to the clean run's": sum(
            rows.get(t, {}).get("result") == clean_reply for t in turn_ids
        ),
    }
    return totals, problems
