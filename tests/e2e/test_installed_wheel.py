"""Installed, not cloned (issue 20): the wheel built from this checkout, installed with
``[all]`` into a fresh virtual environment in a temporary folder, used from there as a new
user would, with nothing of the checkout on ``sys.path`` or ``PATH``.

One test function does the whole chain, as each step needs the one before: ``demo``;
``setup-agents`` (the pinned CLIs into a temporary XDG cache; npm's own cache makes it
quick) and again (installs nothing); ``sandbox build --offline`` to a tag of this test's
own, with a cache folder of its own, from the package's files (the run's dockerd, where the
offline base image is already made); a Pi turn and a Claude Code turn in Docker on that
tag against the fake model; ``doctor`` with every agent ready; then each extra removed in
turn gives the one line naming its ``pip install``. The tag is removed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_for

from durable_harness.testing.fake_model import FakeModelServer

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PI_REPLY = "PI-FROM-THE-WHEEL"
CLAUDE_REPLY = "CLAUDE-FROM-THE-WHEEL"
SCRIPT = f"""
[[rule]]
name = "pi"
when.last_user_text = "installed pi"
reply.text = "{PI_REPLY}"

[[rule]]
name = "claude"
when.last_user_text = "installed claude"
reply.text = "{CLAUDE_REPLY}"

[[rule]]
name = "anything else the CLI asks (a title)"
reply.text = "Installed"
"""


def _base_python() -> str:
    """The interpreter this suite's venv was made from (not the venv's: a fresh one)."""
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}")


class Installed:
    """The fresh venv and the environment its commands run with."""

    def __init__(self, tmp: Path, docker_host: str, tag: str) -> None:
        self.tmp = tmp
        self.venv = tmp / "venv"
        self.env = {
            "PATH": f"{self.venv / 'bin'}:{SYSTEM_PATH}",
            "HOME": os.environ.get("HOME", "/root"),  # npm's own cache (~/.npm) is reused
            "LANG": "C.UTF-8",
            "XDG_CACHE_HOME": str(tmp / "xdg-cache"),
            "XDG_STATE_HOME": str(tmp / "xdg-state"),
            "DURABLE_HARNESS_DATA_DIR": str(tmp / "world"),
            "DOCKER_HOST": docker_host,
            "DURABLE_HARNESS_DOCKER_IMAGE": tag,
            "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",  # closed, until a turn sets its own
        }

    def run(self, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args),
            cwd=self.tmp / "work",
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def pip(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "pip", "--python", str(self.venv / "bin" / "python")]
        # The machine's pip settings and cache (XDG_CACHE_HOME is the test's own here).
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pip"
        env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
        return self.run(*command, *args, timeout=timeout, **{"PIP_CACHE_DIR": str(cache), **env})

    def dh(self, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "durable-harness"), *args, timeout=timeout, **env)


@pytest.fixture
def tag(docker_host: str) -> Iterator[str]:
    import docker

    name = f"durable-harness-wheel-test/agent:{uuid.uuid4().hex[:12]}"
    yield name
    client = docker.DockerClient(base_url=docker_host, timeout=120)
    try:

        def left() -> list[str]:
            # The containers made from this tag by name, as created: not `ancestor=`, which
            # matches by image id, and the tag's image is the suite's own when the build
            # came out the same (the teardown then removed other tests' containers). The
            # low-level list, as the high-level one inspects each and fails on one removed
            # meanwhile.
            listed = client.api.containers(all=True)
            return [str(c["Id"]) for c in listed if c.get("Image") == name]

        for container in left():
            # 409 "removal … is already in progress": another remover got there first.
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                client.api.remove_container(container, force=True)
        wait_for(lambda: not left(), timeout=60, what="the wheel image's containers to go")
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(name)
    finally:
        client.close()


def _timed(timings: dict[str, float], name: str, started: float) -> None:
    timings[name] = round(time.monotonic() - started, 1)


@pytest.mark.timeout(1200)
def test_installed_wheel(tmp_path: Path, docker_host: str, tag: str) -> None:
    timings: dict[str, float] = {}
    t = time.monotonic()
    # From a copy of what a wheel is made of: a build in the checkout would leave build/
    # there, whose stale files a later wheel could pick up.
    source = tmp_path / "source"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "durable_harness", source / "durable_harness", ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(source), "-w", str(dist)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("durable_harness-*.whl")
    _timed(timings, "wheel", t)

    t = time.monotonic()
    box = Installed(tmp_path, docker_host, tag)
    (tmp_path / "work").mkdir()
    # No pip inside (ensurepip alone takes half a minute here): this suite's pip installs
    # into the new venv with --python, its cache making the dependencies quick.
    made = subprocess.run(
        [_base_python(), "-m", "venv", "--without-pip", str(box.venv)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    pip = box.pip("install", "-q", f"{wheel}[all]", timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    _timed(timings, "venv and pip install [all]", t)

    # Nothing of the checkout is on sys.path, and the package runs from the venv.
    probe = box.run(
        str(box.venv / "bin" / "python"),
        "-c",
        "import json, sys, durable_harness as d; print(json.dumps([d.__file__, sys.path]))",
    )
    assert probe.returncode == 0, probe.stderr
    package_file, path = json.loads(probe.stdout)
    assert package_file.startswith(str(box.venv)), package_file
    assert not [p for p in path if p.startswith(str(ROOT))], path
    assert str(ROOT) not in box.env["PATH"]

    t = time.monotonic()
    demo = box.dh("demo", timeout=300)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    _timed(timings, "demo", t)

    # setup-agents: the lock's four CLIs into the temporary XDG cache, each printed.
    t = time.monotonic()
    agents = box.dh("setup-agents", timeout=1200)
    assert agents.returncode == 0, agents.stderr[-3000:]
    pins = json.loads((ROOT / "durable_harness/sandbox/image/tools/npm/package.json").read_text())
    prefix = tmp_path / "xdg-cache" / "durable-harness" / "npm"
    lines = agents.stdout.splitlines()
    assert lines[0].startswith(f"agent CLIs installed in {prefix}/"), agents.stdout
    for package, version in pins["dependencies"].items():
        row = next(line.split() for line in lines[1:] if line.split()[0] == package)
        assert row[1] == version and row[2].startswith(str(prefix)), row
        assert os.access(row[2], os.X_OK), row
    _timed(timings, "setup-agents", t)
    again = box.dh("setup-agents", timeout=60)
    assert again.returncode == 0 and again.stdout.startswith("agent CLIs already installed")
    assert again.stdout.splitlines()[1:] == lines[1:]

    # The image from the package's own files, to this test's tag, with a cache of its own.
    t = time.monotonic()
    cache = tmp_path / "build-cache"
    build = box.dh("sandbox", "build", "--offline", "--tag", tag, "--cache-dir", str(cache))
    assert build.returncode == 0, build.stderr[-3000:]
    assert build.stdout.startswith(f"{tag}: built in "), build.stdout
    assert list(cache.glob("agent-clis-*/.complete")), "the CLIs were installed in its own cache"
    _timed(timings, "sandbox build --offline", t)

    # A Pi turn and a Claude Code turn, each in its session's container on that tag.
    t = time.monotonic()
    with FakeModelServer(_write(tmp_path / "script.toml", SCRIPT), port=0) as server:
        server.start()
        for agent, prompt, reply in (
            ("pi", "installed pi", PI_REPLY),
            ("claude-code", "installed claude", CLAUDE_REPLY),
        ):
            turn = box.dh(
                "run", "--agent", agent, "--no-repo", prompt, ANTHROPIC_BASE_URL=server.url
            )
            assert turn.returncode == 0, turn.stderr[-3000:]
            assert turn.stdout.strip().splitlines()[-1] == reply, turn.stdout
            session = turn.stdout.split()[1]
            assert _container_image(docker_host, session) == tag
    _timed(timings, "pi and claude-code turns", t)

    # doctor: every agent ready (the CLIs from the user cache, the image built).
    t = time.monotonic()
    doctor = box.dh("doctor", timeout=120)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    table = doctor.stdout.split("Agents (", 1)[1].splitlines()[1:]
    rows = {line.split()[0]: line for line in table[1:]}
    assert set(rows) == {
        "builtin",
        "claude-code",
        "codex",
        "opencode",
        "pi",
        "acp:opencode",
        "acp:claude-code",
        "acp:codex",
    }, doctor.stdout
    for agent, line in rows.items():
        assert line.split()[1] == "yes", line
        if agent != "builtin":
            assert f"user cache: {prefix}/" in line and f"{tag} (built)" in line, line
    _timed(timings, "doctor", t)

    # Each extra missing: one line naming the pip install to run, exit code 2.
    t = time.monotonic()
    for extra, packages, command in (
        ("docker", ["docker"], ["sandbox", "build", "--offline", "--tag", tag]),
        ("postgres", ["psycopg"], ["ls", "--world", "postgresql://u@127.0.0.1:9/db"]),
        ("s3sqs", ["boto3"], ["ls", "--world", "s3sqs://bucket/prefix?queue=q"]),
    ):
        gone = box.pip("uninstall", "-q", "-y", *packages)
        assert gone.returncode == 0, gone.stderr
        out = box.dh(*command, timeout=60)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr.count("\n") == 1, out.stderr
        assert out.stderr.rstrip().endswith(f"pip install 'durable-harness[{extra}]'"), out.stderr
    _timed(timings, "missing extras", t)
    print(f"\ninstalled-wheel timings (s): {json.dumps(timings)}")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _container_image(docker_host: str, session: str) -> str:
    import docker

    client = docker.DockerClient(base_url=docker_host, timeout=60)
    try:
        (container,) = client.containers.list(
            all=True, filters={"label": f"durable-harness.session={session}"}
        )
        return str(container.attrs["Config"]["Image"])
    finally:
        client.close()
