"""Durable waits: a turn waits for CI or a timer without holding any worker, survives
every worker's death meanwhile, and continues when the signal or the timer comes.
Each test runs on the local World and on the Postgres World."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import FIXTURES, Harness, ids_of, make_harness, wait_for

from durable_harness.core.world import World
from durable_harness.worlds import open_world

CI_TOOLS = f"{FIXTURES / 'ci_tools.py'}:TOOLS"


@pytest.fixture(params=["local", "postgres"])
def ci(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with contextlib.ExitStack() as stack:
        world_env: dict[str, str] = {}
        if request.param == "postgres":
            server = request.getfixturevalue("postgres")
            url = stack.enter_context(server.database())
            world_env = {"DURABLE_HARNESS_WORLD": "postgres", "DURABLE_HARNESS_POSTGRES_URL": url}
        yield from _ci_harness(tmp_path, world_env)


def _ci_harness(tmp_path: Path, world_env: dict[str, str]) -> Iterator[Harness]:
    for h in make_harness(tmp_path, FIXTURES / "ci.toml", lease="2"):
        h.env.update(world_env)
        h.env["CI_RUNS"] = str(tmp_path / "ci-runs.txt")
        h.env["CI_RESULT"] = json.dumps({"status": "failed", "failing": "test_price"})
        server = h.popen("signal-server", "--port", "0")
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("signal server listening on "), line
        h.env["DURABLE_HARNESS_SIGNAL_URL"] = line.split()[-1]
        try:
            yield h
        finally:
            os.killpg(server.pid, signal.SIGKILL)
            server.communicate()
            pids = Path(h.env["CI_RUNS"]).with_suffix(".pids")
            for pid in pids.read_text().split() if pids.exists() else []:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(pid), signal.SIGKILL)  # CI jobs still sleeping


def open_world_of(h: Harness) -> World:
    """The World the harness's CLI processes use, opened here to look inside it."""
    if h.env.get("DURABLE_HARNESS_WORLD") == "postgres":
        return open_world("postgres", url=h.env["DURABLE_HARNESS_POSTGRES_URL"])
    return open_world("local", data_dir=h.env["DURABLE_HARNESS_DATA_DIR"])


def status(h: Harness, turn_id: str) -> str:
    return str(h.show(turn_id)["turn"]["status"])


def test_ci_wait_holds_no_worker_and_survives_its_death(ci: Harness) -> None:
    out = ci.cli("run", "--detach", "--tools", CI_TOOLS, "Make CI green")
    assert out.returncode == 0, out.stderr
    turn_id = ids_of(out)["turn"]
    worker = ci.popen("worker")
    wait_for(lambda: status(ci, turn_id) == "waiting")
    os.killpg(worker.pid, signal.SIGKILL)  # the worker dies during the wait
    worker.communicate()

    # Nobody holds the turn: parked in the World, no lease, no process.
    turn = ci.show(turn_id)["turn"]
    assert turn["status"] == "waiting" and turn["lease_owner"] is None
    assert "signal 'ci'" in turn["waiting_for"]
    listed = json.loads(ci.cli("ls", "--json").stdout)
    assert listed[0]["waiting_for"] == turn["waiting_for"]

    # CI reports through the webhook while no worker runs.
    with open_world_of(ci) as world:
        wait_for(lambda: world.get_signal(turn_id, "ci") is not None)

    done = ci.cli("worker", "--until-idle")
    assert done.returncode == 0, done.stderr
    data = ci.show(turn_id)
    assert data["turn"]["status"] == "done"
    assert data["turn"]["result"] == "CI failed on test_price; fixed price.py."
    names = [s["name"] for s in data["steps"] if s["kind"] == "tool"]
    assert names == ["start_ci", "wait_for_signal", "write"]
    # Every model call was made once; CI was started once.
    assert ci.repeated_requests() == {}
    assert len(Path(ci.env["CI_RUNS"]).read_text().splitlines()) == 1


def test_duplicate_signal_and_cli_signal(ci: Harness) -> None:
    out = ci.cli("run", "--tools", CI_TOOLS, "Make CI green", CI_SECONDS="3600")
    turn_id = ids_of(out)["turn"]
    assert out.returncode == 0 and status(ci, turn_id) == "waiting"  # `run` parks and exits
    data = json.dumps({"status": "failed", "failing": "test_price"})
    first = ci.cli("signal", turn_id, "ci", "--data", data)
    assert first.returncode == 0 and "delivered" in first.stdout
    again = ci.cli("signal", turn_id, "ci", "--data", data)  # no id: the payload is the id
    assert again.returncode == 0 and "already delivered" in again.stdout
    passed = '{"status": "passed"}'
    later = ci.cli("signal", turn_id, "ci", "--data", passed, "--id", "run-2")
    assert later.returncode == 0 and "delivered to" in later.stdout  # queued for a 2nd wait
    repeat = ci.cli("signal", turn_id, "ci", "--data", passed, "--id", "run-2")
    assert repeat.returncode == 0 and "already delivered" in repeat.stdout
    bad = ci.cli("signal", turn_id, "ci", "--data", "{not json")
    assert bad.returncode == 2 and "JSON" in bad.stderr
    done = ci.cli("worker", "--until-idle")
    assert done.returncode == 0, done.stderr
    assert ci.show(turn_id)["turn"]["result"] == "CI failed on test_price; fixed price.py."


def test_webhook_needs_the_turn_secret(ci: Harness) -> None:
    import urllib.error
    import urllib.request

    out = ci.cli("run", "--tools", CI_TOOLS, "Make CI green", CI_SECONDS="3600")
    turn_id = ids_of(out)["turn"]
    url = f"{ci.env['DURABLE_HARNESS_SIGNAL_URL']}/v1/turns/{turn_id}/signals/ci"
    request = urllib.request.Request(
        url, data=b"{}", method="POST", headers={"Authorization": "Bearer wrong"}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=5)
    assert err.value.code == 401
    with open_world_of(ci) as world:
        assert world.get_signal(turn_id, "ci") is None


def test_timer_wait_survives_restart_of_every_worker(ci: Harness) -> None:
    out = ci.cli("run", "--detach", "Sleep")
    turn_id = ids_of(out)["turn"]
    workers = [ci.popen("worker") for _ in range(2)]
    wait_for(lambda: status(ci, turn_id) == "waiting")
    for w in workers:  # every worker dies
        os.killpg(w.pid, signal.SIGKILL)
        w.communicate()
    done = ci.cli("worker", "--until-idle")  # new workers, after the restart
    assert done.returncode == 0, done.stderr
    data = ci.show(turn_id)
    assert data["turn"]["result"] == "Woke up after the timer."
    assert ci.repeated_requests() == {}


def test_wait_past_its_deadline_ends_with_a_timeout_the_model_sees(ci: Harness) -> None:
    out = ci.cli("run", "Wait briefly")
    turn_id = ids_of(out)["turn"]
    assert status(ci, turn_id) == "waiting"
    done = ci.cli("worker", "--until-idle")
    assert done.returncode == 0, done.stderr
    data = ci.show(turn_id)
    assert data["turn"]["result"] == "CI did not report in time."
    assert ci.repeated_requests() == {}
