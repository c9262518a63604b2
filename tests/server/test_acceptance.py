"""Issue 15's acceptance: a client follows a turn through ``serve`` while the worker running
it is SIGKILLed mid-stream and the ``serve`` it reads from is SIGKILLed too; the client's
own iterator reconnects (``Last-Event-ID``) and ends with every event once, in order,
gap-free, the abandoned attempt marked, and the demo's reply.

On PostgreSQL and S3+SQS: two ``serve`` processes and two workers on one World, the turn
started through one ``serve`` and read through the other. On the local World: one of each
(a worker is started again after the kill). Real processes, the fake model streaming each
reply slowly (``tests/fixtures/stream.toml``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import postgres_server
import pytest
import services_s3
from serve_cases import TOOL_SETS, token, world_of
from support import DEMO_PROMPT, DEMO_REPLY, FIXTURES, Harness, make_harness, start_serve

from durable_harness.client import Client, StreamEvent
from durable_harness.core import events as ev
from durable_harness.core.world import World
from durable_harness.harness.journal import decode_output


@contextlib.contextmanager
def local_world(tmp_path: Path) -> Iterator[dict[str, str]]:
    yield {"DURABLE_HARNESS_WORLD": "local", "DURABLE_HARNESS_DATA_DIR": str(tmp_path / "world")}


@contextlib.contextmanager
def postgres_world(tmp_path: Path) -> Iterator[dict[str, str]]:
    with postgres_server.fresh_world() as options:
        yield {"DURABLE_HARNESS_WORLD": "postgres", "DURABLE_HARNESS_POSTGRES_URL": options["url"]}


@contextlib.contextmanager
def s3sqs_world(tmp_path: Path) -> Iterator[dict[str, str]]:
    """S3 on SeaweedFS (a real S3 server), SQS on moto; AWS variables in os.environ."""
    with services_s3.s3sqs_env(services_s3.seaweedfs().url, services_s3.moto().url) as options:
        yield {
            "DURABLE_HARNESS_WORLD": "s3sqs",
            "DURABLE_HARNESS_S3_BUCKET": options["bucket"],
            "DURABLE_HARNESS_SQS_QUEUE_URL": options["queue_url"],
        }


WORLDS = {"local": local_world, "postgres": postgres_world, "s3sqs": s3sqs_world}


@pytest.fixture(params=sorted(WORLDS))
def stream_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with WORLDS[request.param](tmp_path) as world_env:
        for h in make_harness(tmp_path, FIXTURES / "stream.toml", lease="2"):
            h.env.update(world_env)
            h.env["DURABLE_HARNESS_TOOL_SETS"] = TOOL_SETS
            yield h


def kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def holder(world: World, turn_id: str, workers: list[subprocess.Popen[str]]) -> int:
    """The index of the worker holding the turn's lease (its owner is host:pid)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        owner = world.get_turn(turn_id).lease_owner or ""
        pids = [w.pid for w in workers]
        pid = owner.rsplit(":", 1)[-1]
        if pid.isdigit() and int(pid) in pids:
            return pids.index(int(pid))
        time.sleep(0.05)
    raise AssertionError(f"no worker of ours holds turn {turn_id}")


def model_text(world: World, turn_id: str, seq: int) -> str:
    [step] = [s for s in world.load_steps(turn_id) if s.seq == seq]
    message: dict[str, Any] = decode_output(world, step)
    return "".join(b.get("text", "") for b in message["content"] if b.get("type") == "text")


def test_a_client_reads_every_event_once_through_worker_and_serve_kills(
    stream_harness: Harness,
) -> None:
    h = stream_harness
    shared = h.env["DURABLE_HARNESS_WORLD"] != "local"
    world = world_of(h)
    procs: list[subprocess.Popen[str]] = []
    try:
        secret = token(world, "acme")
        front = start_serve(h)
        reader = start_serve(h) if shared else front
        workers = [h.popen("worker") for _ in range(2 if shared else 1)]
        procs += [front.proc, reader.proc, *workers]
        with Client(front.url, secret) as client:
            session = client.create_session("builtin", tools=["demo"])
            turn_id = client.start_turn(session.session_id, DEMO_PROMPT).turn_id

        seen: list[StreamEvent] = []
        killed_at: tuple[int, int] | None = None  # (step seq, attempt) cut mid-stream
        with Client(reader.url, secret) as client:
            for event in client.events(turn_id):
                seen.append(event)
                if killed_at is None and event.kind == ev.TEXT_DELTA:
                    # The model is still writing this step's text: kill the worker that
                    # runs it and the serve this client reads from, at once.
                    victim = holder(world, turn_id, workers)
                    kill_group(workers[victim])
                    kill_group(reader.proc)
                    killed_at = (event.data["seq"], event.data["attempt"])
                    reader = start_serve(h, port=reader.port)  # the same address, restarted
                    procs.append(reader.proc)
                    if not shared:
                        workers.append(h.popen("worker"))
                        procs.append(workers[-1])
        assert killed_at is not None, [e.kind for e in seen]

        # Every event once, in order, gap-free, and the same log the World holds.
        assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
        stored = world.read_events(turn_id, limit=10_000)
        assert [(e.seq, e.kind, e.data) for e in stored] == [(e.seq, e.kind, e.data) for e in seen]
        assert len({e.key for e in stored}) == len(stored)
        last = seen[-1]
        assert last.kind == ev.TURN_ENDED
        assert last.data["status"] == "done" and last.data["result"] == DEMO_REPLY

        # The cut attempt is marked abandoned before the step's next attempt starts, and
        # the dead worker's attempt is marked lost.
        kinds = [(e.kind, e.data.get("seq"), e.data.get("attempt")) for e in seen]
        seq, attempt = killed_at
        abandoned = kinds.index((ev.STEP_ABANDONED, seq, attempt))
        restarted = kinds.index((ev.STEP_STARTED, seq, attempt + 1))
        assert abandoned < restarted
        assert any(e.kind == ev.ATTEMPT_LOST for e in seen[:restarted])

        # Each model step's text, as the client assembles it from the attempt that
        # finished, is the text the journal recorded for it.
        finished = [e for e in seen if e.kind == ev.STEP_FINISHED and e.data["kind"] == "model"]
        assert finished
        for step in finished:
            pieces = [
                e.data["text"]
                for e in seen
                if e.kind == ev.TEXT_DELTA
                and (e.data["seq"], e.data["attempt"]) == (step.data["seq"], step.data["attempt"])
            ]
            assert "".join(pieces) == model_text(world, turn_id, step.data["seq"])

        # The side effect happened once; only the cut model call was paid twice.
        assert len(h.ledger_lines()) == 1, h.ledger_lines()
        assert list(h.repeated_requests().values()) == [2]
        turn = world.get_turn(turn_id)
        assert turn.status == "done" and turn.result == DEMO_REPLY
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_group(proc)
            proc.communicate(timeout=30)  # and close its pipes
        world.close()
