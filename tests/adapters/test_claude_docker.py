"""Claude Code in the Docker sandbox: the real CLI 2.1.332 in the session's container,
against the fake model, through the proxy's unix socket and the in-container bridge.

The kill matrix with the CLI in Docker is ``test_claude_kill_matrix.py`` (parametrized
``docker``); this file has the plain turn, re-attach after the container is lost, bad
input, and the provider key's absence from the container.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import (
    FINAL,
    SECOND_PROMPT,
    SECOND_REPLY,
    bash_runs,
    claude_harness,
    container_text,
    dump,
    model_keys,
    notify_runs,
    run_args,
    tool_rows,
    upstream_keys,
    wait_for,
)
from support import Harness, ids_of

from durable_harness.adapters.cli.host import UNSAFE_HOST_ENV
from durable_harness.harness.crash import CRASH_EXIT_CODE
from durable_harness.sandbox.docker import DockerSandbox


@pytest.fixture
def h(tmp_path: Path, docker_host: str) -> Iterator[Harness]:
    yield from claude_harness(tmp_path, where="docker")


def test_turn_in_docker(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    ids = ids_of(out)
    show = h.show(ids["turn"])
    assert tool_rows(show) == [
        ("Bash", "done"),
        ("Write", "done"),
        ("notify", "done"),
    ], dump(show)
    assert bash_runs(h, ids["session"]) == 1 and notify_runs(h) == 1
    assert h.repeated_requests() == {}

    # The session's next turn resumes the CLI's transcript; the container was lost
    # between the turns, so a new one gets the workspace back from the World.
    _remove_sandbox(ids["session"])
    second = h.cli(*run_args(h, "--session", ids["session"], prompt=SECOND_PROMPT))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == SECOND_REPLY
    assert container_text(ids["session"], "/workspace/site/pricing.html") == "<h1>Pricing</h1>\n"

    # A finished turn replays in the container with 0 upstream calls and no tool run.
    calls = len(h.requests())
    replay = h.cli("replay", ids["turn"])
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == FINAL and len(h.requests()) == calls
    assert bash_runs(h, ids["session"]) == 1 and notify_runs(h) == 1


def test_worker_dies_after_the_cli_before_the_launch_is_journaled(h: Harness) -> None:
    """The CLI finished in the container, the worker died (os._exit) before recording the
    launch: the next worker re-attaches to the ended job, reads its output and its
    transcript (still in the launch's HOME) and records the launch; nothing runs twice
    and the session's next turn sees the first."""
    crashed = h.cli(*run_args(h), DURABLE_HARNESS_CRASH_AT="0:after_run")
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    ids = ids_of(crashed)
    done = h.cli("worker", "--until-idle", timeout=300)
    assert done.returncode == 0, done.stderr
    show = h.show(ids["turn"])
    assert show["turn"]["result"] == FINAL, dump(show)
    launches = [s["status"] for s in show["steps"] if s["kind"] == "agent"]
    assert launches == ["done"]  # the same launch, re-attached
    assert bash_runs(h, ids["session"]) == 1 and notify_runs(h) == 1
    assert h.repeated_requests() == {}
    second = h.cli(*run_args(h, "--session", ids["session"], prompt=SECOND_PROMPT))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == SECOND_REPLY


def test_container_lost_mid_turn(tmp_path: Path, docker_host: str) -> None:
    """The container (and its volumes) vanish while the final reply streams: the next
    delivery makes a new container, restores the workspace and the CLI's transcript from
    the World, resumes the CLI and finishes; nothing runs twice."""
    for h in claude_harness(tmp_path, where="docker", final_delay_ms=300):
        proc = h.popen(*run_args(h))
        assert proc.stdout is not None
        session = proc.stdout.readline().split()[1]
        turn_id = proc.stdout.readline().split()[1]
        final_asked = lambda h=h: any(r["rule"] == "final" for r in h.requests())  # noqa: E731
        wait_for(final_asked, what="the final reply")
        first = _container_id(session)
        _remove_sandbox(session)
        proc.communicate(timeout=120)  # the delivery is released: the sandbox is gone
        before = h.show(turn_id)
        done_before = set(model_keys(before, "done"))
        calls_before = len(h.requests())

        resumed = h.cli("resume", turn_id)
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip().splitlines()[-1] == FINAL
        after = h.show(turn_id)
        assert _container_id(session) != first
        assert [s["kind"] for s in after["steps"]].count("agent") == 2, dump(after)
        repeated = [k for k in upstream_keys(h, since=calls_before) if k in done_before]
        assert repeated == [], dump(after)
        # The new container holds the workspace the tools made, restored, not made again.
        assert bash_runs(h, session) == 1 and notify_runs(h) == 1
        assert container_text(session, "/workspace/site/index.html") == "PRICING-42\n"
        assert container_text(session, "/workspace/site/pricing.html") == "<h1>Pricing</h1>\n"
        # One Bash step: the command was not run again on the new container.
        assert tool_rows(after) == [("Bash", "done"), ("Write", "done"), ("notify", "done")]


def _container_id(session: str) -> str:
    box = DockerSandbox(session)
    try:
        return box.container_id()
    finally:
        box.close()


def _remove_sandbox(session: str) -> None:
    box = DockerSandbox(session)
    try:
        box.remove()
    finally:
        box.close()


def test_provider_key_never_enters_the_container(tmp_path: Path, docker_host: str) -> None:
    """While Claude Code runs in the container (its Bash command sleeping), no process
    environment and no file there holds the provider key; the CLI holds the proxy token."""
    secret = "sk-ant-test-" + "K3Y" * 8
    for h in claude_harness(tmp_path, where="docker", sleep=6):
        h.env["ANTHROPIC_API_KEY"] = secret
        proc = h.popen(*run_args(h))
        assert proc.stdout is not None
        session = proc.stdout.readline().split()[1]
        running = lambda h=h, s=session: bash_runs(h, s) == 1  # noqa: E731
        wait_for(running, what="the Bash command")
        box = DockerSandbox(session)
        try:
            scan = box.exec(
                "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' > /tmp/envs; "
                'echo "keys=$(grep -c "^ANTHROPIC_API_KEY=" /tmp/envs)"; '
                'echo "secret=$(grep -c -F "$1" /tmp/envs)"; '
                'echo "files=$(grep -rlF "$1" /workspace /home/agent /tmp 2>/dev/null'
                ' | grep -v "^/tmp/envs$" | wc -l)"; rm -f /tmp/envs',
                secret,
            )
        finally:
            box.close()
        found = dict(line.split("=", 1) for line in scan.stdout.decode().split())
        assert int(found["keys"]) >= 1, found  # the CLI is there, with a key: the token
        assert found["secret"] == "0" and found["files"] == "0", found
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip().splitlines()[-1] == FINAL


def one_line_error(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    err = out.stderr.strip()
    assert out.returncode == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("durable-harness: error: "), err
    for needle in needles:
        assert needle in err, err


def no_turns(h: Harness) -> None:
    out = h.cli("ls", "--json")
    assert out.returncode == 0 and json.loads(out.stdout) == []


def test_docker_not_running(h: Harness, tmp_path: Path) -> None:
    out = h.cli(*run_args(h), DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    one_line_error(out, "Docker is not reachable", "DOCKER_HOST")
    no_turns(h)


def test_image_missing(h: Harness) -> None:
    out = h.cli(*run_args(h), DURABLE_HARNESS_DOCKER_IMAGE="durable-harness/agent:absent")
    one_line_error(out, "durable-harness/agent:absent", "durable-harness sandbox build")
    no_turns(h)


@pytest.mark.parametrize("workspace", ["virtual", "host folder"])
def test_other_sandboxes_refused(h: Harness, tmp_path: Path, workspace: str) -> None:
    """Without the developer opt-in, Claude Code runs only in Docker."""
    spec = "virtual" if workspace == "virtual" else str(tmp_path / "site")
    args = ["run", "--agent", "claude-code", "--workspace", spec, "add a pricing page"]
    out = h.cli(*args)
    one_line_error(out, "--workspace docker", "claude-code", UNSAFE_HOST_ENV)
    no_turns(h)
    # With the opt-in, a host folder runs; the virtual workspace never hosts the CLI.
    if workspace == "virtual":
        out = h.cli(*args, **{UNSAFE_HOST_ENV: "1"})
        one_line_error(out, "--workspace docker")
        no_turns(h)
