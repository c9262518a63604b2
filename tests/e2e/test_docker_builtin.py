"""The built-in agent with ``--workspace docker``: the demo turn in the session's
container, crashes, a container lost mid-turn, and bad input."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import DEMO, DEMO_PROMPT, DEMO_REPLY, DEMO_TOOLS, Harness, ids_of, make_harness

from durable_harness.harness.crash import CRASH_EXIT_CODE
from durable_harness.harness.journal import decode_output
from durable_harness.sandbox.docker import DockerSandbox
from durable_harness.worlds import open_world

NOTE = "- order 42: refunded\n"
BASH_SEQ = 7  # the demo's `cat refunds.md && wc -l < refunds.md`, after write (seq 5)


@pytest.fixture
def harness(docker_host: str, tmp_path: Path) -> Iterator[Harness]:
    yield from make_harness(tmp_path, DEMO / "script.toml")


def _session_box(h: Harness, session_id: str) -> DockerSandbox:
    return DockerSandbox(session_id)


def _tool_output(h: Harness, turn_id: str, seq: int) -> str:
    with open_world("local", data_dir=h.tmp / "world") as world:
        step = world.load_steps(turn_id)[seq]
        return str(decode_output(world, step)["content"])


def test_demo_turn_in_a_container(harness: Harness) -> None:
    out = harness.cli("run", "--workspace", "docker", "--tools", DEMO_TOOLS, DEMO_PROMPT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == DEMO_REPLY
    ids = ids_of(out)
    steps = harness.show(ids["turn"])["steps"]
    bash = next(s for s in steps if s["name"] == "bash")
    assert bash["status"] == "done"
    assert len(harness.ledger_lines()) == 1
    with _session_box(harness, ids["session"]) as box:
        try:
            assert box.read("refunds.md") == NOTE
            assert box.snapshot_mark() is not None
        finally:
            box.remove()
    replay = harness.cli("replay", ids["turn"], ANTHROPIC_BASE_URL="http://127.0.0.1:9")
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == DEMO_REPLY


def test_bash_interrupted_in_a_container_is_never_rerun(harness: Harness) -> None:
    h = harness
    crashed = h.cli(
        "run",
        "--workspace",
        "docker",
        "--tools",
        DEMO_TOOLS,
        DEMO_PROMPT,
        DURABLE_HARNESS_CRASH_AT=f"{BASH_SEQ}:after_intent",
    )
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    ids = ids_of(crashed)
    resumed = h.cli("resume", ids["turn"])
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == DEMO_REPLY
    steps = h.show(ids["turn"])["steps"]
    assert steps[BASH_SEQ]["name"] == "bash" and steps[BASH_SEQ]["status"] == "possibly_ran"
    with _session_box(h, ids["session"]) as box:
        box.remove()


def test_container_lost_mid_turn_is_restored_from_the_world(harness: Harness) -> None:
    """The worker dies after the note was written and snapshotted; the container and its
    volumes are then removed (the machine is gone). A new worker finishes the turn on a
    new container whose workspace comes from the World's snapshot."""
    h = harness
    crashed = h.cli(
        "run",
        "--workspace",
        "docker",
        "--tools",
        DEMO_TOOLS,
        DEMO_PROMPT,
        DURABLE_HARNESS_CRASH_AT=f"{BASH_SEQ}:before_intent",
    )
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    ids = ids_of(crashed)
    with _session_box(h, ids["session"]) as box:
        old_container = box.container_id()
        box.remove()
    resumed = h.cli("resume", ids["turn"])
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == DEMO_REPLY
    steps = h.show(ids["turn"])["steps"]
    assert [s["status"] for s in steps] == ["done"] * 9
    # The command ran on the new container and saw the restored note.
    assert _tool_output(h, ids["turn"], BASH_SEQ) == f"exit code 0\n{NOTE}1\n"
    with _session_box(h, ids["session"]) as box:
        try:
            assert box.container_id() != old_container
            assert box.read("refunds.md") == NOTE
        finally:
            box.remove()
    assert len(h.ledger_lines()) == 1


def test_docker_not_running_is_one_clear_error(harness: Harness) -> None:
    out = harness.cli(
        "run",
        "--workspace",
        "docker",
        DEMO_PROMPT,
        DOCKER_HOST="unix:///nonexistent/docker.sock",
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "Docker is not reachable at unix:///nonexistent/docker.sock" in lines[0]
    assert "DOCKER_HOST" in lines[0]


def test_image_missing_is_one_clear_error(harness: Harness) -> None:
    out = harness.cli(
        "run",
        "--workspace",
        "docker",
        DEMO_PROMPT,
        DURABLE_HARNESS_DOCKER_IMAGE="durable-harness/agent:not-built",
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "durable-harness/agent:not-built is not built" in lines[0]
    assert "durable-harness sandbox build" in lines[0]


def test_doctor_and_sandbox_commands(harness: Harness) -> None:
    agents = harness.tmp / "acp-agents.toml"
    agents.write_text('[acp.agents.mine]\ncommand = ["/bin/true"]\ndocker_only = true\n')
    doctor = harness.cli("doctor", DURABLE_HARNESS_ACP_AGENTS=str(agents))
    assert doctor.returncode == 0, doctor.stderr
    assert "[ok] docker: Docker " in doctor.stdout
    assert "[ok] agent image: durable-harness/agent:" in doctor.stdout
    # The ACP rows: ready, the version (claude-code-acp and codex-acp: their package.json,
    # they have no --version), the pin, docker only, the model endpoint; the operator's.
    rows = {
        line.split()[0]: line.split()[1:6] for line in doctor.stdout.splitlines() if "acp:" in line
    }
    assert rows["acp:opencode"] == ["yes", "1.18.33", "1.18.33", "no", "proxy"], doctor.stdout
    assert rows["acp:claude-code"] == ["yes", "0.16.2", "0.16.2", "yes", "proxy"], doctor.stdout
    assert rows["acp:codex"] == ["yes", "0.16.0", "0.16.0", "yes", "proxy"], doctor.stdout
    assert rows["acp:mine"][:4] == ["yes", "at", "launch", "-"], doctor.stdout
    missing = harness.cli("doctor", DURABLE_HARNESS_DOCKER_IMAGE="durable-harness/agent:nope")
    assert "[--] agent image: durable-harness/agent:nope is not built" in missing.stdout
    build = harness.cli("sandbox", "build", "--offline")
    assert build.returncode == 0, build.stderr
    assert build.stdout.startswith("durable-harness/agent:") and "up to date" in build.stdout
    with DockerSandbox("test-cli-ls") as box:
        box.write("x", "y")
    listed = harness.cli("sandbox", "ls")
    assert "test-cli-ls" in listed.stdout and "running" in listed.stdout
    removed = harness.cli("sandbox", "rm", "test-cli-ls", "test-none")
    assert removed.stdout.splitlines() == ["test-cli-ls: removed", "test-none: no sandbox"]
    assert "test-cli-ls" not in harness.cli("sandbox", "ls").stdout
