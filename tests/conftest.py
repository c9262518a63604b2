"""Fixtures shared by every test. Tests never reach a provider: ANTHROPIC_BASE_URL points
at the bundled fake model (or at a closed loopback port) and ANTHROPIC_API_KEY is removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import docker_server
import postgres_server
import pytest
import run_services
import services_s3
from support import DEMO, Harness, make_harness

_TMP_PREFIX = "durable-harness-pytest-"
_OWN_TMP = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    # A folder of this run's own for tmp_path (xdist's workers get one below it), which
    # _agent_user_reaches_tmp_path opens to the agent user; removed when the run ends.
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix=_TMP_PREFIX)
        config.stash[_OWN_TMP] = config.option.basetemp

    # A run stopped by SIGTERM (a CI timeout, `timeout`, a cancelled job) would die without
    # tearing its fixtures down and leave PostgreSQL, dockerd, moto and SeaweedFS running:
    # treat it as Ctrl-C, which pytest unwinds through every fixture's teardown.
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    if _starts_workers(config):
        run_services.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _starts_workers(config):
        run_services.stop()
    own = config.stash.get(_OWN_TMP, None)
    if own is not None:
        shutil.rmtree(own, ignore_errors=True)


def _starts_workers(config: pytest.Config) -> bool:
    """Whether this is the controller of several pytest-xdist workers: then the run's
    servers are started here, once, and shared (tests/run_services.py)."""
    workers = getattr(config.option, "numprocesses", None)
    return not hasattr(config, "workerinput") and isinstance(workers, int) and workers > 1


@pytest.fixture(autouse=True)
def _no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")  # closed: fails fast
    monkeypatch.delenv("DURABLE_HARNESS_CRASH_AT", raising=False)


@pytest.fixture(autouse=True)
def _own_state_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Host-folder snapshot marks live in $XDG_STATE_HOME (sandbox/local.py): each test's
    # own, never the home folder of whoever runs the suite.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.fixture(autouse=True)
def _outside_any_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `run` seeds a new session from the git repository holding the current folder: run
    # from this checkout, every test's CLI would clone the whole project into its
    # workspace. A test that means a repository names it (--repo, or its own cwd).
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _agent_user_reaches_tmp_path(tmp_path: Path) -> None:
    # Host-folder agents run as the unprivileged agent user (sandbox/agent_user.py), which
    # must pass through the temp folders to a workspace below: 0711 lets it pass, not list
    # (a World's own folder below stays 0700, worlds/local). The session's folders are
    # under _TMP_PREFIX (pytest_configure), not the shared /tmp/pytest-of-root that every
    # other run tightens again.
    folder = tmp_path
    while folder == tmp_path or folder.name.startswith((_TMP_PREFIX, "popen-gw")):
        folder.chmod(0o711)
        folder = folder.parent


@pytest.fixture(scope="session")
def postgres() -> Iterator[postgres_server.PostgresServer]:
    """The run's PostgreSQL server (fsync off, 127.0.0.1, a free port, its own temp folder),
    started on first use and stopped by pg_ctl (or PID) when the session ends."""
    if postgres_server.find_bindir() is None:
        pytest.fail("PostgreSQL binaries not found: run scripts/setup (it installs them)")
    yield postgres_server.shared_server()
    postgres_server.stop_shared()


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """The run's Docker Engine (own data-root and socket, no bridge network) with the agent
    image built (cached between runs), DOCKER_HOST pointing at it for this process and the
    CLI processes tests start; stopped by PID when the session ends."""
    reason = docker_server.unavailable()
    if reason is not None:
        pytest.fail(f"Docker Engine unavailable: {reason}")
    server = docker_server.shared_server()
    previous = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = server.url
    # A session image built by a test (run --image) reuses the run's cached CLIs.
    os.environ["DURABLE_HARNESS_DOCKER_CACHE_DIR"] = str(docker_server.CACHE / "build")
    yield server.url
    if previous is None:
        os.environ.pop("DOCKER_HOST", None)
    else:
        os.environ["DOCKER_HOST"] = previous
    docker_server.stop_shared()


@pytest.fixture(scope="session")
def python_image(docker_host: str) -> str:
    """A toolchain image "with Python and pytest" (and git, pip; no node) for ``--image``
    (tests/docker_server.py: a debootstrap root, cached between runs), with its session
    image built, so a test that names it starts at once (``scripts/test`` builds both
    before the tests)."""
    from durable_harness.sandbox.session_image import build_session_image

    tag = docker_server.ensure_python_image(docker_host)
    build_session_image(tag, docker_host=docker_host, say=lambda _line: None)
    return tag


@pytest.fixture(scope="session", autouse=True)
def _s3_servers() -> Iterator[None]:
    """moto server and SeaweedFS start on first use (``services_s3.moto()``,
    ``.seaweedfs()``: 127.0.0.1, free ports, temp folders) and stop by PID when the session
    ends."""
    yield
    services_s3.stop_all()


@pytest.fixture
def demo_harness(tmp_path: Path) -> Iterator[Harness]:
    yield from make_harness(tmp_path, DEMO / "script.toml")
