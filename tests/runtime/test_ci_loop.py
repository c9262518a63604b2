"""The CI loop with ordered signals: push, wait, fix, push again, wait again.

The built-in agent (scripted model, ci_loop.toml) pushes commit A; fake GitHub Actions
reports it failed, by a signed ``workflow_run`` webhook to a real signal-server, before
the agent starts its first wait. The agent pushes commit B and waits again. The worker
is SIGKILLed during that second wait; meanwhile GitHub redelivers the first result and
a re-run of A reports success (neither may end the second wait). CI then reports
B; a new worker resumes the turn, whose second wait gets the second result, not
the first. Local and Postgres Worlds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import FIXTURES, Harness, ids_of, make_harness, wait_for

from durable_harness.core.types import StepStatus
from durable_harness.core.world import World
from durable_harness.worlds import open_world

TOOLS = f"{FIXTURES / 'ci_loop_tools.py'}:TOOLS"
SECRET = "operator-github-secret"
#: The two commits the agent pushes (full ids: a watch takes only those), as in ci_loop.toml.
SHA_A, SHA_B = "aaaa1111" * 5, "bbbb2222" * 5


@pytest.fixture(params=["local", "postgres"])
def ci(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with contextlib.ExitStack() as stack:
        world_env: dict[str, str] = {}
        if request.param == "postgres":
            url = stack.enter_context(request.getfixturevalue("postgres").database())
            world_env = {"DURABLE_HARNESS_WORLD": "postgres", "DURABLE_HARNESS_POSTGRES_URL": url}
        for h in make_harness(tmp_path, FIXTURES / "ci_loop.toml", lease="2"):
            h.env.update(world_env)
            h.env["DURABLE_HARNESS_GITHUB_WEBHOOK_SECRET"] = SECRET
            h.env["CI_RUNS"] = str(tmp_path / "ci-runs.txt")
            hold = tmp_path / "ci-hold"
            h.env["CI_PLAN"] = json.dumps(
                {
                    SHA_A: {"conclusion": "failure"},
                    SHA_B: {"conclusion": "success", "hold": str(hold)},
                }
            )
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
                        os.killpg(int(pid), signal.SIGKILL)  # CI jobs still holding


def world_of(h: Harness) -> World:
    if h.env.get("DURABLE_HARNESS_WORLD") == "postgres":
        return open_world("postgres", url=h.env["DURABLE_HARNESS_POSTGRES_URL"])
    return open_world("local", data_dir=h.env["DURABLE_HARNESS_DATA_DIR"])


def github_ci(h: Harness, sha: str, conclusion: str, delivery: str) -> None:
    """One more report from fake GitHub Actions, at once."""
    script = str(FIXTURES / "github_ci.py")
    url = h.env["DURABLE_HARNESS_SIGNAL_URL"]
    args = [url, SECRET, "acme/shop", sha, conclusion, delivery]
    subprocess.run([sys.executable, script, *args], check=True, timeout=60)


def test_second_wait_gets_the_second_ci_result_across_a_sigkill(ci: Harness) -> None:
    out = ci.cli("run", "--detach", "--tools", TOOLS, "Loop CI")
    assert out.returncode == 0, out.stderr
    turn_id = ids_of(out)["turn"]
    worker = ci.popen("worker")
    with world_of(ci) as world:

        def at_second_wait() -> bool:
            turn = world.get_turn(turn_id)
            waits = [s for s in world.load_steps(turn_id) if s.name == "wait_for_signal"]
            return turn.status.value == "waiting" and len(waits) == 2

        wait_for(at_second_wait, 90, "the second wait")
        os.killpg(worker.pid, signal.SIGKILL)  # the worker dies during the second wait
        worker.communicate()
        assert world.get_turn(turn_id).lease_owner is None

        # The first result was recorded before the first wait began (push returned after).
        first = world.list_signals(turn_id, "ci")
        assert len(first) == 1 and json.loads(first[0].payload)["sha"] == SHA_A
        # GitHub redelivers the first result; a re-run of A goes green. Neither is
        # for the commit the turn now waits on: nothing is recorded, the turn stays parked.
        github_ci(ci, SHA_A, "failure", f"delivery-{SHA_A}")
        github_ci(ci, SHA_A, "success", f"rerun-{SHA_A}")
        assert len(world.list_signals(turn_id, "ci")) == 1
        assert world.get_turn(turn_id).status.value == "waiting"

        (ci.tmp / "ci-hold").touch()  # CI reports B now, with no worker alive
        wait_for(lambda: len(world.list_signals(turn_id, "ci")) == 2, 90, "two CI signals")
        done = ci.cli("worker", "--until-idle", timeout=180)
        assert done.returncode == 0, done.stderr

        data = ci.show(turn_id)
        assert data["turn"]["status"] == "done", data["turn"]
        assert data["turn"]["result"] == f"CI is green on {SHA_B}."
        steps = world.load_steps(turn_id)
        tools = [s for s in steps if s.kind == "tool"]
        assert [s.name for s in tools] == ["push", "wait_for_signal", "push", "wait_for_signal"]
        assert all(s.status is StepStatus.DONE for s in tools)
        waits = [s for s in tools if s.name == "wait_for_signal"]
        assert SHA_A in str(waits[0].output) and "failure" in str(waits[0].output)
        assert SHA_B in str(waits[1].output) and "success" in str(waits[1].output)
        # Each wait took its own signal, recorded by the wait's seq; in push order.
        signals = world.list_signals(turn_id, "ci")
        assert [json.loads(s.payload)["sha"] for s in signals] == [SHA_A, SHA_B]
        assert [s.claimed_by for s in signals] == [waits[0].seq, waits[1].seq]
    # Each commit was pushed once; no model call was repeated.
    assert Path(ci.env["CI_RUNS"]).read_text().split() == [SHA_A, SHA_B]
    assert ci.repeated_requests() == {}
