"""A Docker Engine for tests, started as docs/services.md says (no pytest in here).

:class:`DockerServer` runs ``dockerd`` with its own data-root, exec-root, pidfile and unix
socket, ``--bridge=none --iptables=false --ip-forward=false`` (never the default bridge:
containers get only ``lo``), and stops it by its PID.

The agent image takes minutes to build cold (debootstrap, npm), so it is kept between
runs on this machine: the data-root lives in :data:`CACHE` (``/var/tmp``, as CI runs on the
same machine) and holds the image built from the current sources (rebuilt when the
Dockerfile or the pinned CLIs change; the debootstrap root and the CLIs' node_modules are
cached there too). Two runs at once cannot share a data-root: a run that finds it locked
uses a temporary one and builds from those caches (~10 s). Containers and volumes left by
a killed run are removed at start.

Used by ``tests/conftest.py`` (the session fixture ``docker_host``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from orphans import die_with_parent

CACHE = Path(os.environ.get("DURABLE_HARNESS_TEST_CACHE", "/var/tmp/durable-harness-tests"))
LABEL_MANAGED = "durable-harness.managed"


def unavailable() -> str | None:
    """Why a Docker Engine cannot be started here, or None."""
    if shutil.which("dockerd") is None:
        return "dockerd not found: run scripts/setup as root (installs docker.io)"
    if os.geteuid() != 0:
        return "dockerd needs root"
    return None


class DockerServer:
    """One dockerd; see the module docstring."""

    def __init__(self) -> None:
        # Short paths: containerd's sockets live under the exec-root (108-byte limit).
        self.tmp = Path(tempfile.mkdtemp(prefix="dh-dockerd-", dir="/tmp"))
        self.socket = self.tmp / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.pidfile = self.tmp / "dockerd.pid"
        self.log = self.tmp / "dockerd.log"
        self.data_root, self._lock = self._data_root()
        self.process: subprocess.Popen[bytes] | None = None

    def _data_root(self) -> tuple[Path, IO[str] | None]:
        CACHE.mkdir(parents=True, exist_ok=True)
        lock = (CACHE / "docker-root.lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return Path(tempfile.mkdtemp(prefix="dh-docker-root-", dir=CACHE)), None
        return CACHE / "docker-root", lock

    def start(self) -> DockerServer:
        command = [
            "dockerd",
            "--data-root",
            str(self.data_root),
            "--exec-root",
            str(self.tmp / "exec"),
            "--pidfile",
            str(self.pidfile),
            "-H",
            self.url,
            "--storage-driver",
            "overlay2",
            "--bridge=none",
            "--iptables=false",
            "--ip-forward=false",
            "--exec-opt",
            "native.cgroupdriver=cgroupfs",
        ]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=die_with_parent(),  # stops its containers on SIGTERM
            )
        deadline = time.monotonic() + 60
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"dockerd did not start: {tail}")
            time.sleep(0.1)
        self.clean()
        return self

    def _answers(self) -> bool:
        import docker

        if not self.socket.exists():
            return False
        try:
            client = docker.DockerClient(base_url=self.url, timeout=5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False

    def client(self) -> Any:
        import docker

        return docker.DockerClient(base_url=self.url, timeout=300)

    def clean(self) -> None:
        """Remove every sandbox container and volume (left by a killed run, or this one's)."""
        client = self.client()
        try:
            label = {"label": f"{LABEL_MANAGED}=1"}
            for container in client.containers.list(all=True, filters=label):
                with contextlib.suppress(Exception):
                    container.remove(force=True)
            for volume in client.volumes.list(filters=label):
                with contextlib.suppress(Exception):
                    volume.remove(force=True)
        finally:
            client.close()

    def ensure_image(self, say: Any = lambda _line: None) -> Any:
        """The agent image built from the current sources (a no-op when it already is)."""
        from durable_harness.sandbox.docker_image import build_image

        result = build_image(offline=True, cache_dir=CACHE / "build", docker_host=self.url, say=say)
        if not result.cached:  # the image it replaced, if any, is dangling now
            client = self.client()
            try:
                client.images.prune(filters={"dangling": True})
            finally:
                client.close()
        return result

    def ensure_python_image(self, say: Any = lambda _line: None) -> str:
        """The test image "with Python and pytest" (and no node: the harness adds it when it
        derives the session image); see :func:`ensure_python_image`."""
        return ensure_python_image(self.url, say)

    def stop(self) -> None:
        """Stop dockerd by its PID (it stops its containers and containerd first)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(Exception):
                self.clean()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        elif self.data_root.parent == CACHE and self.data_root.name.startswith("dh-docker-root-"):
            shutil.rmtree(self.data_root, ignore_errors=True)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> DockerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_shared: DockerServer | None = None
#: Set by the run's controller (tests/run_services.py) for its pytest-xdist workers: the
#: ``unix://`` URL of the run's dockerd, its agent image built.
RUN_ENV = "DH_TEST_DOCKERD"


class AttachedServer:
    """The run's dockerd, started by the controller: used here, never stopped here."""

    def __init__(self, url: str) -> None:
        self.url = url

    def stop(self) -> None:
        pass


def shared_server() -> DockerServer | AttachedServer:
    """The test run's one dockerd with the agent image: the run's (:data:`RUN_ENV`), else
    started on first use."""
    global _shared
    attached = os.environ.get(RUN_ENV)
    if attached:
        return AttachedServer(attached)
    if _shared is None:
        import atexit

        server = DockerServer().start()
        atexit.register(server.stop)
        try:
            server.ensure_image()
        except BaseException:
            server.stop()
            raise
        _shared = server
    return _shared


def stop_shared() -> None:
    global _shared
    if _shared is not None:
        _shared.stop()
        _shared = None


#: What the test image for ``--image`` holds: a project's toolchain (Python, pytest, pip,
#: git), and no node, which the session image adds.
PYTHON_PACKAGES = "ca-certificates,git,procps,python3,python3-pytest,python3-pip,python3-venv"
PYTHON_REPOSITORY = "durable-harness-test/python"


def ensure_python_image(url: str, say: Any = lambda _line: None) -> str:
    """A Debian minbase with :data:`PYTHON_PACKAGES`, imported with ``docker import``:
    debootstrap runs once per machine (its tar is cached in :data:`CACHE`, like the
    agent image's base), then an import takes seconds. Returns its tag."""
    import docker

    from durable_harness.sandbox.docker_image import debootstrap_image

    client = docker.DockerClient(base_url=url, timeout=300)
    try:
        return debootstrap_image(
            client,
            CACHE / "build",
            say,
            repository=PYTHON_REPOSITORY,
            packages=PYTHON_PACKAGES,
        )
    finally:
        client.close()


def warm_cache() -> int:
    """Build the agent image into the cache before the tests run (``scripts/test``): a cold
    build (debootstrap, npm: minutes) then happens once, outside every test's timeout, and
    each pytest process finds the image, or builds it from the cached layers in seconds."""
    from durable_harness.sandbox.session_image import build_session_image

    reason = unavailable()
    if reason is not None:
        print(f"agent image not built: {reason}", flush=True)
        return 0  # the Docker tests fail with this reason; the others still run
    with DockerServer() as server:
        result = server.ensure_image(say=lambda line: print(f"  {line}", flush=True))
        print("agent image " + ("cached" if result.cached else "built"), flush=True)
        # The --image tests' toolchain image: debootstrap here, once, not in a test's timeout.
        say = lambda line: print(f"  {line}", flush=True)  # noqa: E731
        tag = server.ensure_python_image(say=say)
        session = build_session_image(
            tag, docker_host=server.url, cache_dir=CACHE / "build", say=say
        )
        print(f"test image {tag}, its session image {session.image}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(warm_cache())
