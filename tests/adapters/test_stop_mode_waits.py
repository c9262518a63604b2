# ruff: noqa: E501  (the fake model scripts below keep one rule per line)
"""Durable waits with the real Codex, Pi and OpenCode CLIs (a host folder, and the
session's Docker container) and OpenCode as an ACP agent (a host folder), none of which
has a ``defer`` hook decision: the wait gate's stop mode (cli_waits) stops the CLI at a
pending wait, the worker parks the turn (no lease, no process), and the next delivery
records the wait's outcome before resuming the CLI's session, whose resume message
quotes it. (Claude Code defers instead:
test_claude_waits.py.)

The turn: the CLI starts CI (the host tool ``start_ci``, ``never``), waits for the signal
``ci`` (``wait_for_signal``: Codex's MCP tool in the namespace ``mcp__durable_harness``,
a Pi tool the extension registers, or OpenCode's MCP tool
``durable-harness_wait_for_signal``), reads that test_price failed, writes ``price.py``
with its shell tool and ends with the scripted reply."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from claude_cases import container_text, launch_processes, wait_for
from codex_cases import AGENT_CONFIG as CODEX_CONFIG
from support import FIXTURES, Harness, ids_of
from test_claude_waits import _harness, _status, ci_once_then_replay, release_ci

from durable_harness.adapters.cli.host import UNSAFE_HOST_ENV
from durable_harness.core.world import World
from durable_harness.harness.journal import decode_output
from durable_harness.worlds import open_world

CI_TOOLS = f"{FIXTURES / 'ci_tools.py'}:TOOLS"
FINAL = "CI failed on test_price; fixed price.py."
TIMED_OUT = "CI did not report in time."


@dataclass(frozen=True)
class _Cli:
    """What differs between the CLIs in these tests."""

    tool: str  # how the model's tool_use names a host tool {name} (the fake model's TOML)
    shell: str  # the model's tool_use of the CLI's shell tool running {command}
    shell_step: str  # the journal's name of that shell tool
    launch_mark: str  # every process of a host launch names its private HOME so
    container_mark: str  # a command line only the CLI's process in the container has
    host_opt_in: bool = False  # a host folder needs the developer opt-in (Codex)


_COMMAND = "printf 'PRICE = 42\\\\n' > price.py && echo FIXED-$((40+2))"
_CLIS = {
    "codex": _Cli(
        tool='name = "{name}", namespace = "mcp__durable_harness"',
        shell=f'name = "exec_command", input = {{ cmd = "{_COMMAND}", yield_time_ms = 30000 }}',
        shell_step="Bash",
        launch_mark="durable-harness-codex-",
        container_mark="--skip-git-repo-check",
        host_opt_in=True,
    ),
    "pi": _Cli(
        tool='name = "{name}"',
        shell=f'name = "bash", input = {{ command = "{_COMMAND}" }}',
        shell_step="bash",
        launch_mark="durable-harness-pi-",
        container_mark="--mode json",
    ),
    "opencode": _Cli(
        tool='name = "durable-harness_{name}"',
        shell=f'name = "bash", input = {{ command = "{_COMMAND}", description = "fix the price" }}',
        shell_step="bash",
        launch_mark="durable-harness-opencode-",
        container_mark="--format json",
    ),
    # OpenCode as an ACP agent: the harness is its client; the same tools and turn.
    "acp:opencode": _Cli(
        tool='name = "durable-harness_{name}"',
        shell=f'name = "bash", input = {{ command = "{_COMMAND}", description = "fix the price" }}',
        shell_step="bash",
        launch_mark="durable-harness-acp-opencode-",
        container_mark="dh-acp.js",
    ),
}


def _script(cli: str) -> str:
    c = _CLIS[cli]
    wait_ci = c.tool.format(name="wait_for_signal")
    return f"""
[[rule]]
name = "title"
when.system = "You are a title generator"
reply.text = "Make CI green"

[[rule]]
name = "done"
when.conversation = "FIXED-42"
reply.text = "{FINAL}"

[[rule]]
name = "ci failed: fix it"
when.conversation = "test_price"
reply.text = "CI failed in test_price. Fixing the price."
reply.tool_use = [{{ {c.shell} }}]

[[rule]]
name = "ci timed out"
when.conversation = "timed out: no signal"
reply.text = "{TIMED_OUT}"

[[rule]]
name = "wait for ci"
when.conversation = "CI started"
reply.text = "CI is running. Waiting for its result."
reply.tool_use = [{{ {wait_ci}, input = {{ name = "ci", timeout_seconds = 120 }} }}]

[[rule]]
name = "timeout path"
when.last_user_text = "Wait briefly"
reply.tool_use = [{{ {wait_ci}, input = {{ name = "never-comes", timeout_seconds = 2 }} }}]

[[rule]]
name = "start"
when.last_user_text = "Make CI green"
reply.tool_use = [{{ {c.tool.format(name="start_ci")}, input = {{}} }}]
"""


@pytest.fixture(
    params=[
        ("codex", "local"),
        ("codex", "postgres"),
        ("codex", "docker"),
        ("pi", "local"),
        ("pi", "postgres"),
        ("pi", "docker"),
        ("opencode", "local"),
        ("opencode", "postgres"),
        ("opencode", "docker"),
        ("acp:opencode", "local"),
    ],
    ids=lambda p: "-".join(p),
)
def ci(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """The CLI on a host folder (a local or a Postgres World) or in the session's Docker
    container (a local World)."""
    cli, where = request.param
    if where == "docker":
        request.getfixturevalue("docker_host")
    else:
        (tmp_path / "ws").mkdir()
    script = tmp_path / "script.toml"
    script.write_text(_script(cli))
    with contextlib.ExitStack() as stack:
        world_env: dict[str, str] = {}
        if where == "postgres":
            url = stack.enter_context(request.getfixturevalue("postgres").database())
            world_env = {"DURABLE_HARNESS_WORLD": "postgres", "DURABLE_HARNESS_POSTGRES_URL": url}
        for h in _harness(tmp_path, script, world_env):
            if where == "docker" or not _CLIS[cli].host_opt_in:
                del h.env[UNSAFE_HOST_ENV]  # Pi and OpenCode need none for a host folder
            if cli == "codex":
                h.env["OPENAI_BASE_URL"] = h.server.url
                h.env.pop("OPENAI_API_KEY", None)
            h.env["DH_TEST_CLI"] = cli
            if where == "docker":
                h.env["DH_TEST_WORKSPACE"] = "docker"
            yield h


def _cli(h: Harness) -> str:
    return h.env["DH_TEST_CLI"]


def _docker(h: Harness) -> bool:
    return h.env.get("DH_TEST_WORKSPACE") == "docker"


def _run_args(h: Harness, prompt: str) -> list[str]:
    return [
        "run", "--agent", _cli(h), "--workspace", h.env.get("DH_TEST_WORKSPACE") or str(h.tmp / "ws"),
        *(["--agent-config", str(CODEX_CONFIG)] if _cli(h) == "codex" else []),
        "--tools", CI_TOOLS, "--detach", prompt,
    ]  # fmt: skip


def _open_world(h: Harness) -> World:
    if h.env.get("DURABLE_HARNESS_WORLD") == "postgres":
        return open_world("postgres", url=h.env["DURABLE_HARNESS_POSTGRES_URL"])
    return open_world("local", data_dir=h.env["DURABLE_HARNESS_DATA_DIR"])


def _rules(h: Harness) -> list[str]:
    return [r["rule"] for r in h.requests() if r["rule"] != "title"]


def test_waits_for_ci_without_a_worker(ci: Harness) -> None:
    out = ci.cli(*_run_args(ci, "Make CI green"))
    assert out.returncode == 0, out.stderr
    turn_id, session = ids_of(out)["turn"], ids_of(out)["session"]
    worker = ci.popen("worker")
    wait_for(lambda: _status(ci, turn_id) == "waiting", 180, "the turn to park")
    os.killpg(worker.pid, signal.SIGKILL)  # a worker dies during the wait
    worker.communicate()

    turn = ci.show(turn_id)["turn"]
    assert turn["lease_owner"] is None, turn  # nobody holds the turn
    assert "signal 'ci'" in turn["waiting_for"]
    if _docker(ci):  # the job was killed: no CLI process is left in the container
        assert _CLIS[_cli(ci)].container_mark not in _container_processes(session)
    else:
        # Only this test's (other tests may run the same CLI at the same time).
        mark = _CLIS[_cli(ci)].launch_mark
        assert not launch_processes(mark, under=ci.tmp), "a CLI runs"
    release_ci(ci)  # CI reports now, while no worker runs
    with _open_world(ci) as world:
        wait_for(lambda: world.get_signal(turn_id, "ci") is not None, 60, "CI's webhook")
        stored = world.get_turn(turn_id)
        assert stored.lease_owner is None and stored.status.value == "waiting"

    done = ci.cli("worker", "--until-idle", timeout=300)
    assert done.returncode == 0, done.stderr
    data = ci.show(turn_id)
    assert data["turn"]["status"] == "done", json.dumps(data, indent=1)
    assert data["turn"]["result"] == FINAL
    if _docker(ci):
        price = container_text(session, "/workspace/price.py")
    else:
        price = (ci.tmp / "ws" / "price.py").read_text()
    assert price == "PRICE = 42\n"
    tools = [(s["name"], s["status"]) for s in data["steps"] if s["kind"] == "tool"]
    shell = _CLIS[_cli(ci)].shell_step
    assert tools == [("start_ci", "done"), ("wait_for_signal", "done"), (shell, "done")]
    wait = next(s for s in data["steps"] if s["name"] == "wait_for_signal")
    # Its outcome was recorded by the resuming delivery, before the CLI resumed, and the
    # CLI read it (the resume message quotes it): the model's next rule needs "test_price".
    assert wait["recorded_by_delivery"] == 2, json.dumps(wait)
    assert _rules(ci) == ["start", "wait for ci", "ci failed: fix it", "done"], _rules(ci)
    # Stopped at the wait (its launch left an intent), resumed after it.
    ci_once_then_replay(ci, turn_id, data, ["intent", "done"], FINAL)


def test_wait_past_its_deadline_ends_with_a_timeout_the_cli_sees(ci: Harness) -> None:
    out = ci.cli(*_run_args(ci, "Wait briefly"))
    turn_id = ids_of(out)["turn"]
    done = ci.cli("worker", "--until-idle", timeout=300)
    assert done.returncode == 0, done.stderr
    data = ci.show(turn_id)
    assert data["turn"]["result"] == TIMED_OUT, json.dumps(data, indent=1)
    wait = next(s for s in data["steps"] if s["name"] == "wait_for_signal")
    assert wait["status"] == "done", json.dumps(data, indent=1)
    # Parked by the first delivery, timed out by the second (settled before the resume),
    # whose resumed CLI told the model (its rule needs "timed out: no signal").
    assert wait["recorded_by_delivery"] == 2, json.dumps(wait)
    with _open_world(ci) as world:
        step = next(s for s in world.load_steps(turn_id) if s.name == "wait_for_signal")
        assert "timed out: no signal 'never-comes'" in str(decode_output(world, step))
    assert _rules(ci) == ["timeout path", "ci timed out"], _rules(ci)
    launches = [s["status"] for s in data["steps"] if s["kind"] == "agent"]
    assert launches == ["intent", "done"]
    assert ci.repeated_requests() == {}


def _container_processes(session: str) -> str:
    from durable_harness.sandbox.docker import DockerSandbox

    box = DockerSandbox(session)
    try:
        result = box.exec("for c in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $c; echo; done")
    finally:
        box.close()
    return result.stdout.decode()
