# ruff: noqa: E501  (the fake model script below keeps one rule per line)
"""Durable waits with the real Codex CLI (host folder, developer opt-in, and the session's
Docker container), which has no
``defer`` hook decision: the wait gate's stop mode (cli_waits) stops the CLI at a pending
wait, the worker parks the turn (no lease, no process), and the next delivery records the
wait's outcome before resuming the thread, whose resume message quotes it.

The turn: Codex starts CI (the host tool ``start_ci``, ``never``), waits for the signal
``ci`` (``wait_for_signal`` in the MCP namespace ``mcp__durable_harness``), reads that
test_price failed, writes ``price.py`` with its shell tool and ends with the scripted
reply."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import container_text, wait_for
from codex_cases import AGENT_CONFIG
from support import FIXTURES, Harness, ids_of
from test_claude_waits import _harness, _open_world, _status, release_ci

from durable_harness.adapters.cli_host import UNSAFE_HOST_ENV

CI_TOOLS = f"{FIXTURES / 'ci_tools.py'}:TOOLS"
FINAL = "CI failed on test_price; fixed price.py."
TIMED_OUT = "CI did not report in time."
NS = 'namespace = "mcp__durable_harness"'

_SCRIPT = f"""
[[rule]]
name = "done"
when.conversation = "FIXED-42"
reply.text = "{FINAL}"

[[rule]]
name = "ci failed: fix it"
when.conversation = "test_price"
reply.text = "CI failed in test_price. Fixing the price."
reply.tool_use = [{{ name = "exec_command", input = {{ cmd = "printf 'PRICE = 42\\\\n' > price.py && echo FIXED-$((40+2))", yield_time_ms = 30000 }} }}]

[[rule]]
name = "ci timed out"
when.conversation = "timed out: no signal"
reply.text = "{TIMED_OUT}"

[[rule]]
name = "wait for ci"
when.conversation = "CI started"
reply.text = "CI is running. Waiting for its result."
reply.tool_use = [{{ name = "wait_for_signal", {NS}, input = {{ name = "ci", timeout_seconds = 120 }} }}]

[[rule]]
name = "timeout path"
when.last_user_text = "Wait briefly"
reply.tool_use = [{{ name = "wait_for_signal", {NS}, input = {{ name = "never-comes", timeout_seconds = 2 }} }}]

[[rule]]
name = "start"
when.last_user_text = "Make CI green"
reply.tool_use = [{{ name = "start_ci", {NS}, input = {{}} }}]
"""


@pytest.fixture(params=["host", "docker"])
def ci(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """The CLI on a host folder (developer opt-in) or in the session's Docker container."""
    if request.param == "docker":
        request.getfixturevalue("docker_host")
    else:
        (tmp_path / "ws").mkdir()
    script = tmp_path / "script.toml"
    script.write_text(_SCRIPT)
    for h in _harness(tmp_path, script, {}):
        h.env["OPENAI_BASE_URL"] = h.server.url
        h.env.pop("OPENAI_API_KEY", None)
        if request.param == "docker":
            h.env["DH_TEST_WORKSPACE"] = "docker"
            del h.env[UNSAFE_HOST_ENV]
        yield h


def _run_args(h: Harness, prompt: str) -> list[str]:
    return [
        "run", "--agent", "codex", "--workspace", h.env.get("DH_TEST_WORKSPACE") or str(h.tmp / "ws"),
        "--agent-config", str(AGENT_CONFIG), "--tools", CI_TOOLS, "--detach", prompt,
    ]  # fmt: skip


def test_codex_waits_for_ci_without_a_worker(ci: Harness) -> None:
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
        stored = world.get_turn(turn_id)
        assert stored.lease_owner is None and stored.status.value == "waiting"
    docker = ci.env.get("DH_TEST_WORKSPACE") == "docker"
    if docker:  # the job was killed: no codex process is left in the container
        assert "--skip-git-repo-check" not in _container_processes(ids_of(out)["session"])
    else:
        assert not any("durable-harness-codex-" in _cmdline(p) for p in _pids()), "a CLI runs"

    done = ci.cli("worker", "--until-idle", timeout=300)
    assert done.returncode == 0, done.stderr
    data = ci.show(turn_id)
    assert data["turn"]["status"] == "done", json.dumps(data, indent=1)
    assert data["turn"]["result"] == FINAL
    if docker:
        price = container_text(ids_of(out)["session"], "/workspace/price.py")
    else:
        price = (ci.tmp / "ws" / "price.py").read_text()
    assert price == "PRICE = 42\n"
    tools = [(s["name"], s["status"]) for s in data["steps"] if s["kind"] == "tool"]
    assert tools == [("start_ci", "done"), ("wait_for_signal", "done"), ("Bash", "done")]
    wait = next(s for s in data["steps"] if s["name"] == "wait_for_signal")
    # Its outcome was recorded by the resuming delivery, before the CLI resumed, and Codex
    # read it (the resume message quotes it): the model's next rule needs "test_price".
    assert wait["recorded_by_delivery"] == 2, json.dumps(wait)
    rules = [r["rule"] for r in ci.requests()]
    assert rules == ["start", "wait for ci", "ci failed: fix it", "done"], rules
    # CI started once; no model call was made twice.
    assert len(Path(ci.env["CI_RUNS"]).read_text().splitlines()) == 1
    assert ci.repeated_requests() == {}
    launches = [s["status"] for s in data["steps"] if s["kind"] == "agent"]
    assert launches == ["intent", "done"]  # stopped at the wait, resumed after it

    # The finished turn replays from the journal: 0 upstream calls, CI not started again.
    calls = len(ci.requests())
    replay = ci.cli("replay", turn_id)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == FINAL
    assert len(ci.requests()) == calls
    assert len(Path(ci.env["CI_RUNS"]).read_text().splitlines()) == 1


def test_wait_past_its_deadline_ends_with_a_timeout_codex_sees(ci: Harness) -> None:
    out = ci.cli(*_run_args(ci, "Wait briefly"))
    turn_id = ids_of(out)["turn"]
    done = ci.cli("worker", "--until-idle", timeout=300)
    assert done.returncode == 0, done.stderr
    data = ci.show(turn_id)
    assert data["turn"]["result"] == TIMED_OUT, json.dumps(data, indent=1)
    wait = next(s for s in data["steps"] if s["name"] == "wait_for_signal")
    assert wait["status"] == "done", json.dumps(data, indent=1)
    assert [r["rule"] for r in ci.requests()][-1] == "ci timed out"
    assert ci.repeated_requests() == {}


def _pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _container_processes(session: str) -> str:
    from durable_harness.sandbox.docker import DockerSandbox

    box = DockerSandbox(session)
    try:
        result = box.exec("for c in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $c; echo; done")
    finally:
        box.close()
    return result.stdout.decode()
