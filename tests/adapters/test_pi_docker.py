"""Pi in the Docker sandbox: the real CLI 0.73.1 in the session's container, against the
fake model, through the proxy's unix socket and the in-container bridge.

The kill matrix with Pi in Docker is ``test_pi_kill_matrix.py`` (parametrized
``docker``); this file has the plain turn, the session's next turn after its container
was lost, replay, and the container lost in the middle of a turn.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import container_text, dump, model_keys, tool_rows, upstream_keys, wait_for
from pi_cases import (
    FINAL,
    SECOND_PROMPT,
    SECOND_REPLY,
    bash_runs,
    notify_runs,
    pi_harness,
    run_args,
)
from support import Harness, ids_of

from durable_harness.sandbox.docker import DockerSandbox


@pytest.fixture
def h(tmp_path: Path, docker_host: str) -> Iterator[Harness]:
    yield from pi_harness(tmp_path, where="docker")


def test_turn_in_docker(h: Harness) -> None:
    # No --workspace: a CLI agent's default is the session's container.
    args = run_args(h)
    del args[args.index("--workspace") : args.index("--workspace") + 2]
    out = h.cli(*args)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    ids = ids_of(out)
    show = h.show(ids["turn"])
    assert tool_rows(show) == [("bash", "done"), ("write", "done"), ("notify", "done")], dump(show)
    assert bash_runs(h, ids["session"]) == 1 and notify_runs(h) == 1
    assert container_text(ids["session"], "/workspace/site/pricing.html") == "<h1>Pricing</h1>\n"
    assert h.repeated_requests() == {}

    # The session's next turn continues Pi's session file; the container was lost
    # between the turns, so a new one gets the workspace back from the World.
    _remove(ids["session"])
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


def test_container_lost_mid_turn(tmp_path: Path, docker_host: str) -> None:
    """The container (and its volumes) vanish while the final reply streams: the next
    delivery makes a new container, restores the workspace from the journal's snapshot
    and Pi's session file from the World, resumes Pi and finishes; nothing runs twice."""
    for h in pi_harness(tmp_path, where="docker", final_delay_ms=300):
        proc = h.popen(*run_args(h))
        assert proc.stdout is not None
        session = proc.stdout.readline().split()[1]
        turn_id = proc.stdout.readline().split()[1]
        final_asked = lambda h=h: any(r["rule"] == "final" for r in h.requests())  # noqa: E731
        wait_for(final_asked, what="the final reply")
        _remove(session)
        proc.communicate(timeout=120)  # the delivery is released: the sandbox is gone
        before = h.show(turn_id)
        done_before = set(model_keys(before, "done"))
        calls_before = len(h.requests())

        resumed = h.cli("resume", turn_id)
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip().splitlines()[-1] == FINAL
        after = h.show(turn_id)
        assert [s["kind"] for s in after["steps"]].count("agent") == 2, dump(after)
        repeated = [k for k in upstream_keys(h, since=calls_before) if k in done_before]
        assert repeated == [], dump(after)
        # The new container holds the workspace the tools made, restored, not made again.
        assert bash_runs(h, session) == 1 and notify_runs(h) == 1
        assert container_text(session, "/workspace/site/index.html") == "PRICING-42\n"
        assert container_text(session, "/workspace/site/pricing.html") == "<h1>Pricing</h1>\n"
        assert tool_rows(after) == [("bash", "done"), ("write", "done"), ("notify", "done")]


def test_turn_on_a_toolchain_image(tmp_path: Path, docker_host: str, python_image: str) -> None:
    """``--image``: Pi runs in the session image derived from a toolchain image that has
    Python and no node (the harness added node and the pinned CLIs)."""
    import docker

    for h in pi_harness(tmp_path, where="docker"):
        out = h.cli(*run_args(h, "--image", python_image))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == FINAL
        ids = ids_of(out)
        assert tool_rows(h.show(ids["turn"])) == [
            ("bash", "done"),
            ("write", "done"),
            ("notify", "done"),
        ]
        assert (
            container_text(ids["session"], "/workspace/site/pricing.html") == "<h1>Pricing</h1>\n"
        )
        client = docker.DockerClient(base_url=docker_host)
        try:
            selector = {"label": f"durable-harness.session={ids['session']}"}
            (container,) = client.containers.list(filters=selector)
            assert container.image.labels["durable-harness.source-image"] == python_image
            ran = container.exec_run(["python3", "-c", "import pytest; print(pytest.__name__)"])
            assert ran.output == b"pytest\n" and ran.exit_code == 0
        finally:
            client.close()
        _remove(ids["session"])


def _remove(session: str) -> None:
    box = DockerSandbox(session)
    try:
        box.remove()
    finally:
        box.close()
