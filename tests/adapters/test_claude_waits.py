# ruff: noqa: E501  (the fake model script below keeps one rule per line)
"""Durable waits with the real Claude Code: the CLI leaves the turn at a wait, no worker
holds the turn while it waits (and a worker killed meanwhile loses nothing), and a later
delivery resumes the CLI with the wait's result.

The turn: Claude starts CI (the host tool ``start_ci``, ``never``), waits for the signal
``ci`` (``mcp__durable-harness__wait_for_signal``), reads that test_price failed, writes
``price.py`` and ends with the scripted reply."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from claude_cases import container_text, wait_for
from support import FIXTURES, Harness, ids_of, make_harness

from durable_harness.adapters.cli.host import UNSAFE_HOST_ENV
from durable_harness.core.world import World
from durable_harness.worlds import open_world

CI_TOOLS = f"{FIXTURES / 'ci_tools.py'}:TOOLS"
FINAL = "CI failed on test_price; fixed price.py."
TIMED_OUT = "CI did not report in time."

_SCRIPT = """
[[rule]]
name = "wait for ci"
when.last_tool_name = "mcp__durable-harness__start_ci"
reply.text = "CI is running. Waiting for its result."
reply.tool_use = [{{ name = "mcp__durable-harness__wait_for_signal", input = {{ name = "ci", timeout_seconds = 120 }} }}]

[[rule]]
name = "ci failed: fix it"
when.last_tool_name = "mcp__durable-harness__wait_for_signal"
when.last_tool_result = "test_price"
reply.text = "CI failed in test_price. Fixing the price."
reply.tool_use = [{{ name = "Write", input = {{ file_path = "{ws}/price.py", content = "PRICE = 42\\n" }} }}]

[[rule]]
name = "ci timed out"
when.last_tool_name = "mcp__durable-harness__wait_for_signal"
when.last_tool_result = "timed out"
reply.text = "{timed_out}"

[[rule]]
name = "done"
when.last_tool_name = "Write"
reply.text = "{final}"

[[rule]]
name = "timeout path"
when.last_user_text = "Wait briefly"
reply.tool_use = [{{ name = "mcp__durable-harness__wait_for_signal", input = {{ name = "never-comes", timeout_seconds = 2 }} }}]

[[rule]]
name = "start"
when.last_user_text = "Make CI green"
reply.tool_use = [{{ name = "mcp__durable-harness__start_ci", input = {{}} }}]
"""


@pytest.fixture(params=["local", "postgres", "docker"])
def ci(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """A local World with the CLI on a host folder, a Postgres one, or a local one with the
    CLI in the session's Docker container."""
    if request.param == "docker":
        request.getfixturevalue("docker_host")
        ws = Path("/workspace")
    else:
        ws = tmp_path / "ws"
        ws.mkdir()
    script = tmp_path / "script.toml"
    script.write_text(_SCRIPT.format(ws=ws, final=FINAL, timed_out=TIMED_OUT))
    with contextlib.ExitStack() as stack:
        world_env: dict[str, str] = {}
        if request.param == "postgres":
            url = stack.enter_context(request.getfixturevalue("postgres").database())
            world_env = {"DURABLE_HARNESS_WORLD": "postgres", "DURABLE_HARNESS_POSTGRES_URL": url}
        for h in _harness(tmp_path, script, world_env):
            if request.param == "docker":
                h.env["DH_TEST_WORKSPACE"] = "docker"
                del h.env[UNSAFE_HOST_ENV]
            yield h


def _harness(tmp_path: Path, script: Path, world_env: dict[str, str]) -> Iterator[Harness]:
    for h in make_harness(tmp_path, script, lease="2"):
        h.env.update(world_env)
        h.env[UNSAFE_HOST_ENV] = "1"  # the CLI on a host folder: fast; Docker is tested apart
        h.env["CI_RUNS"] = str(tmp_path / "ci-runs.txt")
        h.env["CI_RESULT"] = json.dumps({"status": "failed", "failing": "test_price"})
        # CI reports only once the test has killed the worker during the wait
        # (release_ci): on a slow machine a result that came first would never park the turn.
        h.env["CI_HOLD"] = str(tmp_path / "ci-may-report")
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


def ci_once_then_replay(
    ci: Harness, turn_id: str, data: dict[str, Any], launches: list[str], final: str
) -> None:
    """CI started once, no model call made twice, the launches' statuses; then the
    finished turn replays from the journal: 0 upstream calls, CI not started again."""
    assert len(Path(ci.env["CI_RUNS"]).read_text().splitlines()) == 1
    assert ci.repeated_requests() == {}
    assert [s["status"] for s in data["steps"] if s["kind"] == "agent"] == launches
    calls = len(ci.requests())
    replay = ci.cli("replay", turn_id)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == final
    assert len(ci.requests()) == calls
    assert len(Path(ci.env["CI_RUNS"]).read_text().splitlines()) == 1


def release_ci(h: Harness) -> None:
    """Let the CI job started by the turn report (see ``CI_HOLD``)."""
    Path(h.env["CI_HOLD"]).touch()


def _run_args(h: Harness, prompt: str) -> list[str]:
    return [
        "run", "--agent", "claude-code", "--workspace", h.env.get("DH_TEST_WORKSPACE") or str(h.tmp / "ws"),
        "--tools", CI_TOOLS, "--detach", prompt,
    ]  # fmt: skip


def _open_world(h: Harness) -> World:
    if h.env.get("DURABLE_HARNESS_WORLD") == "postgres":
        return open_world("postgres", url=h.env["DURABLE_HARNESS_POSTGRES_URL"])
    return open_world("local", data_dir=h.env["DURABLE_HARNESS_DATA_DIR"])


def _status(h: Harness, turn_id: str) -> str:
    return str(h.show(turn_id)["turn"]["status"])


def test_claude_code_waits_for_ci_without_a_worker(ci: Harness) -> None:
    out = ci.cli(*_run_args(ci, "Make CI green"))
    assert out.returncode == 0, out.stderr
    turn_id = ids_of(out)["turn"]
    worker = ci.popen("worker")
    wait_for(lambda: _status(ci, turn_id) == "waiting", 120, "the turn to park")
    os.killpg(worker.pid, signal.SIGKILL)  # a worker dies during the wait
    worker.communicate()

    turn = ci.show(turn_id)["turn"]
    assert turn["lease_owner"] is None, turn  # nobody holds the turn
    assert "signal 'ci'" in turn["waiting_for"]
    release_ci(ci)  # CI reports now, while no worker runs
    with _open_world(ci) as world:
        wait_for(lambda: world.get_signal(turn_id, "ci") is not None, 60, "CI's webhook")

    done = ci.cli("worker", "--until-idle", timeout=300)
    assert done.returncode == 0, done.stderr
    data = ci.show(turn_id)
    assert data["turn"]["status"] == "done", json.dumps(data, indent=1)
    assert data["turn"]["result"] == FINAL
    if ci.env.get("DH_TEST_WORKSPACE") == "docker":
        price = container_text(ids_of(out)["session"], "/workspace/price.py")
    else:
        price = (ci.tmp / "ws" / "price.py").read_text()
    assert price == "PRICE = 42\n"
    tools = [(s["name"], s["status"]) for s in data["steps"] if s["kind"] == "tool"]
    assert tools == [("start_ci", "done"), ("wait_for_signal", "done"), ("Write", "done")]
    # Stopped at the wait (deferred, so journaled done), resumed after it.
    ci_once_then_replay(ci, turn_id, data, ["done", "done"], FINAL)


def test_wait_past_its_deadline_ends_with_a_timeout_claude_sees(ci: Harness) -> None:
    out = ci.cli(*_run_args(ci, "Wait briefly"))
    turn_id = ids_of(out)["turn"]
    done = ci.cli("worker", "--until-idle", timeout=300)
    assert done.returncode == 0, done.stderr
    data = ci.show(turn_id)
    assert data["turn"]["result"] == TIMED_OUT, json.dumps(data, indent=1)
    assert ci.repeated_requests() == {}
