"""``run --image``: the session's container runs the repository's toolchain image with the
agent's parts added (sandbox/session_image.py), built on first use with progress."""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from support import FIXTURES, Harness, ids_of, make_harness

from durable_harness.harness.journal import decode_output
from durable_harness.sandbox.docker import DockerSandbox
from durable_harness.sandbox.docker_image import LABEL_SESSION, SOURCE_LABEL
from durable_harness.worlds import open_world


@pytest.fixture
def harness(docker_host: str, tmp_path: Path) -> Iterator[Harness]:
    yield from make_harness(tmp_path, FIXTURES / "toolchain.toml")


@pytest.fixture
def fresh_image(docker_host: str, python_image: str) -> Iterator[str]:
    """The Python test image under a new id (one label added), so its session image is not
    built yet: the run builds it on first use. Both are removed afterwards."""
    client = docker.DockerClient(base_url=docker_host, timeout=300)
    tag = f"dh-test/toolchain:{uuid.uuid4().hex[:12]}"
    dockerfile = f"FROM {python_image}\nLABEL dh-test.nonce={tag.split(':')[1]}\n".encode()
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    context.seek(0)
    client.images.build(fileobj=context, custom_context=True, tag=tag, network_mode="none")
    try:
        yield tag
    finally:
        for image in client.images.list(filters={"label": f"{SOURCE_LABEL}={tag}"}):
            client.images.remove(image.id, force=True)
        client.images.remove(tag, force=True)
        client.close()


def _outputs(h: Harness, turn_id: str) -> list[str]:
    with open_world("local", data_dir=h.tmp / "world") as world:
        steps = [s for s in world.load_steps(turn_id) if s.kind == "tool"]
        return [str(decode_output(world, s)["content"]) for s in steps]


@pytest.mark.timeout(600)  # builds a session image (~50 s here, more on a loaded machine)
def test_builtin_agent_runs_pytest_on_a_toolchain_image(
    harness: Harness, fresh_image: str, python_image: str
) -> None:
    h = harness
    out = h.cli(
        "run", "--workspace", "docker", "--image", fresh_image, "run the tests", timeout=600
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "The suite ran: one test fails."
    # Built on first use, with progress on stderr.
    assert "building the session image durable-harness/session:" in out.stderr
    assert f"from {fresh_image} (once per Docker host)" in out.stderr
    assert "Successfully built" in out.stderr
    ids = ids_of(out)
    pytest_out, probe = _outputs(h, ids["turn"])
    # The real pytest of the image ran the project's suite in the sandbox.
    assert pytest_out.startswith("exit code 0\n1 failed, 1 passed in "), pytest_out
    # The container is the sandbox as ever: user 1000, the agent CLIs and node added, no
    # network but loopback.
    assert "uid=1000\n" in probe, probe
    for path in (
        "/opt/agent-clis/node_modules/.bin/claude",
        "/opt/agent-clis/node_modules/.bin/pi",
        "/opt/agent-clis/node_modules/.bin/opencode",
        "/opt/agent-node/bin/node",
        "/usr/bin/python3",
    ):
        assert f"{path}\n" in probe, probe
    assert "(Claude Code)" in probe and "Network is unreachable" in probe, probe
    assert "interfaces=lo \n" in probe, probe
    client = docker.DockerClient(base_url=h.env["DOCKER_HOST"])
    try:
        (container,) = client.containers.list(
            filters={"label": f"{LABEL_SESSION}={ids['session']}"}
        )
        assert container.image.labels[SOURCE_LABEL] == fresh_image
        assert container.image.tags[0].startswith("durable-harness/session:")
    finally:
        client.close()
    # Built once per Docker host: ahead-of-time build finds it; doctor names it.
    again = h.cli("sandbox", "build", "--image", fresh_image)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"{container.image.tags[0]} (from {fresh_image}): up to date")
    doctor = h.cli("doctor")
    assert "[ok] session images: " in doctor.stdout and fresh_image in doctor.stdout
    # The session keeps its container: another toolchain is refused, saying how to switch.
    other = h.cli(
        "run",
        "--session",
        ids["session"],
        "--workspace",
        "docker",
        "--image",
        python_image,
        "run the tests",
    )
    assert other.returncode != 0
    assert f"durable-harness sandbox rm {ids['session']}" in other.stdout + other.stderr
    with DockerSandbox(ids["session"]) as box:
        box.remove()


def test_image_admission_and_bad_input(harness: Harness, python_image: str) -> None:
    # A worker in another process runs a stored turn's image only if its operator allows it.
    queued = harness.cli(
        "run", "--detach", "--workspace", "docker", "--image", python_image, "run the tests"
    )
    assert queued.returncode == 0, queued.stderr
    worker = harness.cli("worker", "--until-idle")
    assert worker.returncode == 0, worker.stderr
    shown = harness.show(ids_of(queued)["turn"])["turn"]
    assert shown["status"] == "failed", shown
    assert f"image {python_image!r} is not an image this worker allows" in shown["error"]

    missing = harness.cli(
        "run", "--workspace", "docker", "--image", "dh-test/absent:1", "run the tests"
    )
    assert missing.returncode == 2
    assert "the image 'dh-test/absent:1' is not on this Docker host" in missing.stderr
    assert "docker pull dh-test/absent:1" in missing.stderr
    virtual = harness.cli("run", "--image", "dh-test/absent:1", "run the tests")
    assert virtual.returncode == 2
    assert "add --workspace docker" in virtual.stderr
