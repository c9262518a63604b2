"""The repository's own toolchain, detected at ``run`` (runtime/toolchain.py): its
devcontainer's ``build`` built once on the Docker host and run by the session's
container, reused by the next ``run``; its ``image`` and create-time commands taken as
``--image`` and ``setup``; ``--image ./Dockerfile``; a root Dockerfile only suggested; and
bad devcontainers refused in one line with nothing recorded.

One Docker turn (the built-in agent's bash runs the image's ``python3``); the other runs
are ``--detach`` (nothing runs them) and read the stored turn's config. Each Dockerfile is
``FROM`` the tests' Python image plus a comment that makes its tag new: the build sends
its context and finds its base's id, so its session image is the fixture's, already built.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from support import Harness, ids_of, make_harness

from durable_harness.harness.journal import decode_output
from durable_harness.sandbox.docker import DockerSandbox
from durable_harness.sandbox.docker_image import LABEL_SESSION
from durable_harness.sandbox.repo_image import REPOSITORY
from durable_harness.sandbox.session_image import SOURCE_ID_LABEL
from durable_harness.worlds import open_world

SCRIPT = """
[[rule]]
name = "look"
when.last_user_text = "which python"
reply.tool_use = [{ name = "bash", input = { command = "python3 --version; id -u" } }]

[[rule]]
name = "done"
when.last_tool_name = "bash"
reply.text = "Seen it."
"""

DEVCONTAINER = """{
  // The project's toolchain: built from the Dockerfile next to this file.
  "name": "shop",
  "build": {
    "dockerfile": "Dockerfile", /* relative to this folder */
    "context": "..",
  },
}
"""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def commit(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "change")


@pytest.fixture
def harness(docker_host: str, tmp_path: Path) -> Iterator[Harness]:
    script = tmp_path / "script.toml"
    script.write_text(SCRIPT)
    yield from make_harness(tmp_path, script)


@pytest.fixture
def repo(tmp_path: Path, python_image: str) -> Iterator[Path]:
    """A project with a devcontainer whose Dockerfile is new to this Docker host; its
    images (and their tags) are removed afterwards."""
    proj = tmp_path / "proj"
    proj.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(proj)], check=True)
    nonce = uuid.uuid4().hex
    commit(
        proj,
        {
            "app.py": "print('shop')\n",
            ".devcontainer/devcontainer.json": DEVCONTAINER,
            ".devcontainer/Dockerfile": f"FROM {python_image}\n# {nonce}\n",
        },
    )
    yield proj
    client = docker.from_env()
    try:
        for image in client.images.list(name=REPOSITORY):
            # A build that adds nothing to its FROM is the base image under one more tag:
            # image.tags lists the base's own tags too, which other tests use.
            for tag in image.tags:
                if tag.startswith(f"{REPOSITORY}:"):
                    client.images.remove(tag, force=True)  # an untag: the base image stays
    finally:
        client.close()


def stored(h: Harness, turn_id: str) -> dict[str, Any]:
    with open_world("local", data_dir=h.tmp / "world") as world:
        return dict(world.get_turn(turn_id).config)


def one_line_error(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    err = out.stderr.strip()
    assert out.returncode != 0, err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


@pytest.mark.timeout(600)
def test_the_devcontainer_is_the_toolchain(harness: Harness, repo: Path, python_image: str) -> None:
    h = harness
    out = h.cli("run", "--workspace", "docker", "which python", cwd=repo, timeout=500)
    assert out.returncode == 0, out.stderr
    ids = ids_of(out)
    tag = stored(h, ids["turn"])["image"]
    assert tag.startswith(f"{REPOSITORY}:"), tag
    assert f"building .devcontainer/Dockerfile as {tag} (once per Docker host)" in out.stderr
    assert "Successfully built" in out.stderr
    assert (
        f"toolchain: {tag}, built from .devcontainer/Dockerfile "
        "(.devcontainer/devcontainer.json); --image overrides"
    ) in out.stderr
    assert "setup" not in stored(h, ids["turn"])
    try:
        with open_world("local", data_dir=h.tmp / "world") as world:
            (bash,) = [s for s in world.load_steps(ids["turn"]) if s.kind == "tool"]
            seen = str(decode_output(world, bash)["content"])
        assert "Python 3." in seen and "1000" in seen, seen
        client = docker.from_env()
        try:
            (container,) = client.containers.list(
                filters={"label": f"{LABEL_SESSION}={ids['session']}"}
            )
            # The container runs the session image derived from the devcontainer's build
            # (its id: a build that adds nothing to its FROM shares the base's session image).
            assert container.image.labels[SOURCE_ID_LABEL] == client.images.get(tag).id
        finally:
            client.close()
    finally:
        with DockerSandbox(ids["session"]) as box:
            box.remove()

    # A second run of the same commit finds the image: nothing is built.
    again = h.cli("run", "--workspace", "docker", "--detach", "which python", cwd=repo)
    assert again.returncode == 0, again.stderr
    assert stored(h, ids_of(again)["turn"])["image"] == tag
    assert "building" not in again.stderr
    assert f"toolchain: {tag}, found (built before) from .devcontainer/Dockerfile" in again.stderr

    # An image and the create-time commands: the turn's image and setup, as if typed.
    commit(
        repo,
        {
            ".devcontainer/devcontainer.json": json.dumps(
                {
                    "image": python_image,
                    "onCreateCommand": "echo created",
                    "postCreateCommand": {"deps": ["pip", "install", "-e", ".[dev]"], "b": "true"},
                }
            ),
            "Dockerfile": f"FROM {python_image}\n# the app's image {uuid.uuid4().hex}\n",
        },
    )
    named = h.cli("run", "--workspace", "docker", "--detach", "which python", cwd=repo)
    assert named.returncode == 0, named.stderr
    config = stored(h, ids_of(named)["turn"])
    assert config["image"] == python_image
    assert config["setup"] == "echo created && pip install -e '.[dev]' && true"
    assert (
        f"toolchain: the devcontainer's image {python_image} (.devcontainer/devcontainer.json)"
        in named.stderr
    )
    assert "runs before the agent; --setup overrides" in named.stderr
    assert "Dockerfile is not used" not in named.stderr

    # --no-devcontainer: the agent image; the root Dockerfile is only suggested.
    plain = h.cli(
        "run", "--workspace", "docker", "--detach", "--no-devcontainer", "which python", cwd=repo
    )
    assert plain.returncode == 0, plain.stderr
    assert {"image", "setup"}.isdisjoint(stored(h, ids_of(plain)["turn"]))
    assert "give --image ./Dockerfile to build and use it" in plain.stderr
    # --image ./Dockerfile builds it (its folder the context); the devcontainer is not read.
    built = h.cli(
        "run", "--workspace", "docker", "--detach", "--image", "./Dockerfile", "which python",
        cwd=repo,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    config = stored(h, ids_of(built)["turn"])
    assert config["image"].startswith(f"{REPOSITORY}:") and config["image"] != tag
    assert "setup" not in config
    assert f"toolchain: {config['image']}, built from ./Dockerfile" in built.stderr
    # The virtual workspace has no toolchain: the devcontainer is named, not read.
    virtual = h.cli("run", "--detach", "which python", cwd=repo)
    assert virtual.returncode == 0, virtual.stderr
    assert "image" not in stored(h, ids_of(virtual)["turn"])
    assert "devcontainer.json is not used" in virtual.stderr

    # Bad devcontainers: one line, nothing recorded.
    sessions = len(json.loads(h.cli("ls", "--json").stdout))
    commit(repo, {".devcontainer/devcontainer.json": '{"image": "x",, // broken\n}'})
    one_line_error(
        h.cli("run", "--workspace", "docker", "which python", cwd=repo),
        ".devcontainer/devcontainer.json is not valid JSON with comments",
        "--image",
    )
    escaping = {"build": {"dockerfile": "Dockerfile", "context": "../.."}}
    commit(repo, {".devcontainer/devcontainer.json": json.dumps(escaping)})
    one_line_error(
        h.cli("run", "--workspace", "docker", "which python", cwd=repo),
        "names the context '../..', outside the repository",
    )
    one_line_error(
        h.cli("run", "--workspace", "docker", "--image", "./nowhere/", "which python", cwd=repo),
        "no Dockerfile there",
    )
    # A build that fails (its RUN on the operator's build network, none here): its
    # progress, then one line with the daemon's reason.
    commit(
        repo,
        {
            ".devcontainer/devcontainer.json": '{"build": {"dockerfile": "Dockerfile"}}',
            ".devcontainer/Dockerfile": f"FROM {python_image}\nRUN exit 3\n",
        },
    )
    failed = h.cli(
        "run", "--workspace", "docker", "which python", cwd=repo,
        DURABLE_HARNESS_TOOLCHAIN_BUILD_NETWORK="none",
    )  # fmt: skip
    assert failed.returncode == 2, failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert "building .devcontainer/Dockerfile failed: " in last, failed.stderr
    assert "returned a non-zero code: 3" in last and "--image IMAGE" in last, last
    assert len(json.loads(h.cli("ls", "--json").stdout)) == sessions
