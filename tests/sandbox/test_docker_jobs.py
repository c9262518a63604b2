"""Detached jobs: a command that outlives the worker that started it, found again by id."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from durable_harness.core.errors import SandboxError
from durable_harness.sandbox.docker import DockerSandbox

LIMITS = {"memory": "256m", "pids": 128, "cpus": 1.0}

# A worker process: start the job (unless some worker did), then follow it to its end.
WORKER = """
import sys
import threading
from durable_harness.sandbox.docker import DockerSandbox
box = DockerSandbox(sys.argv[1], memory="256m", pids=128, cpus=1.0)
started = box.jobs.start("cli-1", sys.argv[2])
print("started" if started else "existing", flush=True)
for chunk in box.jobs.follow("cli-1"):
    sys.stdout.write(chunk.decode())
    sys.stdout.flush()
status = box.jobs.status("cli-1")
print(f"status {status.state} {status.exit_code}", flush=True)
"""
TWENTY_SECONDS = (
    "echo run >> /workspace/runs; "
    'for i in $(seq 20); do echo "tick $i"; sleep 1; done; echo finished; exit 3'
)


@pytest.fixture
def session(docker_host: str) -> Iterator[str]:
    session_id = f"test-{uuid.uuid4().hex[:12]}"
    yield session_id
    with DockerSandbox(session_id, **LIMITS) as box:
        box.remove()


def _worker(session: str, command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, session, command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_a_job_survives_its_worker_and_runs_once(session: str) -> None:
    """The worker is SIGKILLed while the job runs a 20 s command; a new worker process
    re-attaches by session and job id, does not start it again, and reads it to the end."""
    first = _worker(session, TWENTY_SECONDS)
    assert first.stdout is not None
    assert first.stdout.readline() == "started\n"
    assert first.stdout.readline() == "tick 1\n"
    assert first.stdout.readline() == "tick 2\n"
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=10)

    second = _worker(session, TWENTY_SECONDS)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == "existing"
    assert lines[1:] == [f"tick {i}" for i in range(1, 21)] + ["finished", "status exited 3"]
    with DockerSandbox(session, **LIMITS) as box:
        assert box.read("runs") == "run\n"  # started exactly once
        assert box.jobs.list() == ["cli-1"]


def test_output_status_offsets_and_env(session: str) -> None:
    with DockerSandbox(session, **LIMITS) as box:
        script = 'echo "$TOKEN"; echo oops >&2; pwd; exit 5'
        assert box.jobs.start("j", script, env={"TOKEN": "per-turn"}, workdir="/tmp")
        assert not box.jobs.start("j", "echo never")
        status = box.jobs.wait("j", timeout=20)
        assert (status.state, status.exit_code) == ("exited", 5)
        assert box.jobs.read_output("j") == b"per-turn\n/tmp\n"
        assert box.jobs.read_output("j", 9) == b"/tmp\n"
        assert box.jobs.read_output("j", stream="stderr") == b"oops\n"
        assert b"".join(box.jobs.follow("j", 9)) == b"/tmp\n"  # finished: no waiting
        assert box.jobs.status("nope").state == "missing"
        with pytest.raises(SandboxError, match="no job"):
            list(box.jobs.follow("nope"))
        with pytest.raises(SandboxError, match="invalid job id"):
            box.jobs.start("../x", "true")


def test_kill_and_timeout(session: str) -> None:
    with DockerSandbox(session, **LIMITS) as box:
        box.jobs.start("long", "sleep 300 & sleep 300")
        box.jobs.kill("long")
        status = box.jobs.wait("long", timeout=20)
        assert (status.state, status.exit_code) == ("exited", 143)
        box.jobs.start("slow", "sleep 300", timeout=1)
        started = time.monotonic()
        status = box.jobs.wait("slow", timeout=20)
        assert (status.state, status.exit_code) == ("exited", 124)
        assert time.monotonic() - started < 10
        assert "sleep 300" not in box.bash("ps -eo args").stdout


def test_a_job_whose_container_restarted_is_lost_not_restarted(session: str) -> None:
    with DockerSandbox(session, **LIMITS) as box:
        box.jobs.start("cli", "echo run >> runs; sleep 300")
        assert box.jobs.status("cli").state == "running"
        box.client.containers.get(box.container_id()).restart(timeout=1)
        status = box.jobs.status("cli")
        assert status.state == "lost" and status.finished and status.exit_code is None
        assert list(box.jobs.follow("cli")) == []
        assert not box.jobs.start("cli", "echo run >> runs; sleep 300")
        assert box.read("runs") == "run\n"


# Leaves 40 daemons of its own for its end to kill (each in a session of its own).
LEAVES_DAEMONS = "for i in $(seq 40); do setsid sleep 600 & done; sleep 0.3"


def test_a_contained_jobs_end_spares_the_harness_execs_entering(session: str) -> None:
    """A contained job's end kills every process started during its life (its daemons here)
    but not a harness ``docker exec`` entering the container meanwhile: runc's init is not
    yet a session leader then (ppid 0, its session outside); a reap that killed it made
    the exec fail ("error executing setns process"). Two threads run execs back to back
    across ten such ends. The window is short: a guard, it did not catch the race before
    the fix on a loaded 2-CPU machine."""
    failed: list[str] = []
    ran = 0
    stop = threading.Event()
    with DockerSandbox(session, memory="256m", pids=256, cpus=1.0) as box:
        box.exec("true")

        def execs() -> None:
            nonlocal ran
            while not stop.is_set():
                result = box.exec("echo ok")
                ran += 1
                if result.exit_code != 0 or result.stdout != b"ok\n":
                    failed.append(f"{result.exit_code} {(result.stdout + result.stderr)!r}")

        threads = [threading.Thread(target=execs) for _ in range(2)]
        for thread in threads:
            thread.start()
        try:
            for n in range(10):
                box.jobs.start(f"daemons-{n}", LEAVES_DAEMONS, contain=True)
                assert box.jobs.wait(f"daemons-{n}", timeout=30).exit_code == 0
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        assert "sleep 600" not in box.bash("ps -eo args").stdout  # every daemon was killed
    assert ran > 20 and failed == [], (ran, failed)
