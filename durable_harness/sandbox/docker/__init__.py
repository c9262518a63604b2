"""The Docker sandbox: one hardened container per session, found again by label.

Contract, on top of :mod:`durable_harness.core.sandbox`:

* **One container per session**, named ``durable-harness-<session>`` and labelled
  ``durable-harness.session=<id>`` and ``durable-harness.managed=1``. It is created on
  first use and outlives the worker: any worker that opens the same session re-attaches
  to it by label (a stopped one is started again). Creating it is race-safe: two workers
  creating it at once end up on the same container (the name is unique).
* **Hardened**: uid 1000, every capability dropped, ``no-new-privileges``, read-only root,
  ``network_mode="none"`` (only ``lo``), no Docker socket, memory (swap included), CPU and
  process limits, a size-capped ``/tmp`` tmpfs, tini as pid 1. Writable: ``/workspace``
  and ``/home/agent`` (the session's two volumes), ``/tmp`` and ``/dev/shm``. The worker's
  environment never reaches the container: its environment is the image's.
* **Files** are read and written by ``cat`` run as the agent user (``put_archive`` fails on
  a read-only root and writes as root), confined to ``/workspace`` after resolving
  symlinks inside the container.
* **bash** runs each command in a fresh ``bash`` that restores the previous command's cwd
  and exported variables (so they carry over as in a terminal, and survive a worker's
  death), under ``timeout`` in its own process group. When the command ends, whatever it
  left running in that group is killed: background jobs do not outlive the command (use
  ``sandbox.jobs.start`` for that). A command that hits the process limit
  (a fork bomb) or loses a process to the OOM killer raises :class:`ResourceLimit` (a tool
  error); the container stays up. stdout and stderr are kept apart.
* **Persistence**: ``journaled`` is False (files persist in the volume; edit and bash do
  not replay), ``snapshots`` is True: the core saves :meth:`export_state` to the World at
  step boundaries (only changed files are copied out of the container, and the World
  stores each content once) and restores it when the volume was lost with its machine
  (:func:`durable_harness.harness.workspace.restore_workspace`).
* **Detached jobs** (``sandbox.jobs``, :mod:`.jobs`) run a
  command that survives the worker; a new worker finds it by session and job id and
  follows it.
* Docker's own errors never escape: an unreachable daemon, a missing image or a container
  that vanished mid-turn raise :class:`SandboxUnavailable` (the worker retries the turn);
  everything the agent caused raises :class:`SandboxError`.

The container's lifecycle and bash are here; the facets beside it: :mod:`.files` (read,
write), :mod:`.state` (export and import of the workspace, the snapshot mark),
:mod:`.jobs` (detached jobs), over :mod:`.exec` (commands over Docker's exec API) and
:mod:`.scripts` (the shell scripts they run). Building the image, listing and removing
sandboxes: :mod:`durable_harness.sandbox.docker_image` (importable without the SDK).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import time
import uuid
from collections.abc import Generator, Iterator
from typing import Any

import docker
import docker.errors
import requests

from durable_harness.core.errors import (
    ConfigError,
    ResourceLimit,
    SandboxError,
    SandboxUnavailable,
)
from durable_harness.core.sandbox import Sandbox, ShellResult, cap_timeout, noted, shell_text
from durable_harness.core.settings import Settings
from durable_harness.sandbox.docker import exec as docker_exec
from durable_harness.sandbox.docker import scripts as sh
from durable_harness.sandbox.docker.files import DockerFiles
from durable_harness.sandbox.docker.jobs import DetachedJobs
from durable_harness.sandbox.docker.state import DockerState
from durable_harness.sandbox.docker_image import LABEL_MANAGED, LABEL_SESSION, default_image, reason
from durable_harness.sandbox.session_image import build_session_image, ensure_agent_image

__all__ = ["LABEL_MANAGED", "LABEL_SESSION", "RUN_DIR", "DockerSandbox", "host_run_dir"]

USER = "1000:1000"
_TIMEOUT_EXIT_CODE = 124  # GNU timeout's, so agents recognise it
_SIGKILL_EXIT_CODE = 137
_OUTPUT_IN_ERROR = 4000
_BACKEND_ERRORS = (docker.errors.DockerException, requests.RequestException, OSError)
_ENV = "DURABLE_HARNESS_DOCKER_"
#: How long an exec the runtime refuses to start is tried again (see ``DockerSandbox._run``).
REFUSED_WAIT_S = 30.0
#: Where the session's host run folder is mounted (read-only) in the container: the CLI
#: adapters put the unix socket of their model proxy there (adapters/cli/docker_host.py).
RUN_DIR = "/run/durable-harness"


def _env(name: str, default: str) -> str:
    return os.environ.get(_ENV + name) or default


def _name_part(session_id: str) -> str:
    """The session id where Docker names allow it, else a digest of it."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,80}", session_id):
        return session_id
    return "h" + hashlib.sha256(session_id.encode()).hexdigest()[:24]


def host_run_dir(session_id: str) -> str:
    """The session's run folder on the Docker host (bind-mounted at :data:`RUN_DIR`):
    ``$DURABLE_HARNESS_DOCKER_RUN_DIR`` (default ``/tmp/durable-harness-<uid>``) plus a
    digest of the session id. Short, because a unix socket path holds at most 107 bytes."""
    root = _env("RUN_DIR", f"/tmp/durable-harness-{os.getuid()}")
    return os.path.join(root, hashlib.sha256(session_id.encode()).hexdigest()[:16])


def _make_run_dir(path: str) -> None:
    """Create the run folder, owned by us and not writable by others: whoever can write
    there could stand in for the model proxy."""
    for folder in (os.path.dirname(path), path):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o755)
        info = os.lstat(folder)
        if info.st_uid != os.getuid() or info.st_mode & 0o022 or not os.path.isdir(folder):
            raise SandboxError(
                f"{folder} must be a folder owned by uid {os.getuid()} and writable only by "
                "it (it holds the model proxy's socket); remove it or set "
                f"{_ENV}RUN_DIR elsewhere"
            )


class DockerSandbox(DockerFiles, DockerState, Sandbox):
    """The session's container (created lazily, on the first operation).

    ``session_id`` None makes a throwaway container, removed by :meth:`close`. Limits
    default to ``DURABLE_HARNESS_DOCKER_{MEMORY,CPUS,PIDS,TMP_SIZE}`` (``2g``, ``2``,
    ``512``, ``256m``), the size of each volume to ``DURABLE_HARNESS_MAX_WORKSPACE_BYTES``
    (unset: no cap but the host's disk; see :meth:`_volume_options`) and the image to
    ``DURABLE_HARNESS_DOCKER_IMAGE`` or :func:`default_image` (built on first use when
    missing, :mod:`..session_image`). ``toolchain`` names the repository's own image
    (``run --image``): the container then runs the session image derived from it, built on
    first use. The constructor checks that Docker answers and the image exists
    (:class:`SandboxUnavailable` otherwise; ConfigError for a toolchain image that is not
    on the Docker host) and creates no container.
    """

    journaled = False
    snapshots = True

    def __init__(
        self,
        session_id: str | None = None,
        *,
        image: str | None = None,
        toolchain: str | None = None,
        memory: str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        tmp_size: str | None = None,
        timeout: float = 60.0,
        max_output: int = 1 << 20,
        max_snapshot_bytes: int = 1 << 30,
        max_workspace_bytes: int | None = None,
        docker_host: str | None = None,
    ) -> None:
        self.ephemeral = session_id is None
        self.session_id = session_id or f"tmp-{uuid.uuid4().hex[:16]}"
        self.image = image or _env("IMAGE", default_image())
        self.memory = memory or _env("MEMORY", "2g")
        self.cpus = float(cpus if cpus is not None else _env("CPUS", "2"))
        self.pids = int(pids if pids is not None else _env("PIDS", "512"))
        self.tmp_size = tmp_size or _env("TMP_SIZE", "256m")
        if self.cpus <= 0 or self.pids < 16 or timeout <= 0:
            raise SandboxError("docker sandbox: cpus and timeout must be positive, pids >= 16")
        self.timeout = timeout
        self.max_output = max_output
        self.max_snapshot_bytes = max_snapshot_bytes
        self.max_workspace_bytes = (
            Settings.load().max_workspace_bytes
            if max_workspace_bytes is None
            else max_workspace_bytes
        )
        part = _name_part(self.session_id)
        self.container_name = f"durable-harness-{part}"
        self.volume_names = {"workspace": f"{self.container_name}-workspace"}
        self.volume_names["home"] = f"{self.container_name}-home"
        self.run_dir = host_run_dir(self.session_id)
        self._container_id: str | None = None
        self._mark: str | None = None  # the mark as last read or written by this process
        self.jobs = DetachedJobs(self)  # commands that outlive the worker: jobs.py
        # path -> (stat key, content) as last copied out: see DockerState.
        self._cache: dict[str, tuple[tuple[int, str, str, int], bytes]] = {}
        self.docker_host = (
            docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        )
        try:
            # from_env also reads DOCKER_TLS_VERIFY and DOCKER_CERT_PATH.
            self.client: Any = (
                docker.DockerClient(base_url=docker_host, timeout=120)
                if docker_host
                else docker.from_env(timeout=120)
            )
            self.client.ping()
        except _BACKEND_ERRORS as exc:
            raise SandboxUnavailable(
                f"Docker is not reachable at {self.docker_host} ({reason(exc)}): start the "
                "Docker daemon or point DOCKER_HOST at it (`durable-harness doctor` checks)"
            ) from exc
        self.toolchain = toolchain
        if toolchain:
            # The repository's image with the agent's parts added (built on first use).
            self.image = build_session_image(toolchain, docker_host=docker_host).image
            return
        try:
            self.client.images.get(self.image)
        except docker.errors.ImageNotFound:
            try:
                ensure_agent_image(self.image, docker_host=docker_host)
            except ConfigError as exc:
                # Unavailable, not a bad turn: a worker releases it for when the image is there.
                raise SandboxUnavailable(str(exc)) from None
        except _BACKEND_ERRORS as exc:
            raise SandboxUnavailable(f"Docker failed looking up {self.image}: {exc}") from exc

    # -- the container -----------------------------------------------------------------

    @contextlib.contextmanager
    def _mapped(self, doing: str) -> Iterator[None]:
        """Docker errors raised while ``doing`` become :class:`SandboxUnavailable`."""
        try:
            yield
        except docker.errors.NotFound as exc:
            self._container_id = None
            raise SandboxUnavailable(
                f"the container of session {self.session_id} vanished while {doing}; "
                "the turn is retried, on a new container restored from its snapshot"
            ) from exc
        except _BACKEND_ERRORS as exc:
            raise SandboxUnavailable(f"Docker failed while {doing}: {exc}") from exc

    def container_id(self) -> str:
        """The session's running container: found by label, started, or created."""
        if self._container_id is not None:
            return self._container_id
        _make_run_dir(self.run_dir)  # also before a restart: a reboot may have emptied /tmp
        with self._mapped("finding the session's container"):
            try:
                found = self.client.containers.list(
                    all=True, filters={"label": f"{LABEL_SESSION}={self.session_id}"}
                )
            except docker.errors.NotFound:
                # Listed while another worker was creating it, gone from inspect for a
                # moment (measured under load): it is there by name soon.
                found = [self._await_named()]
            if found:
                container = found[0]
                new_workspace = False
                self._check_toolchain(container)
            else:
                new_workspace = self._ensure_volumes()
                container = self._create()
            if container.status != "running":
                # The runtime may refuse the first execs into it: exec retries those.
                container.start()
        self._container_id = str(container.id)
        if new_workspace:
            # A kept home volume may carry the mark of a workspace that is gone.
            self.set_snapshot_mark(None)
        return self._container_id

    def _run(
        self, cid: str, command: list[str], within: float = REFUSED_WAIT_S, **options: Any
    ) -> docker_exec.ExecResult:
        """``docker_exec.run`` as the agent user in the workspace, run again while the
        runtime refuses to start it (``ExecResult.refused``: exit 126 "OCI runtime exec
        failed: ... write init-p: broken pipe", seen on a loaded machine, and not only on
        a container just started). Docker tells a refusal by the missing pid, which no
        output can imitate, so even an agent's command is run again only when none of it
        ran; past ``within`` seconds the refusal is returned."""
        deadline = time.monotonic() + within
        pause = 0.05
        while True:
            result = docker_exec.run(
                self.client.api, cid, command, user=USER, workdir=sh.WORKSPACE, **options
            )
            if not result.refused or time.monotonic() > deadline:
                return result
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _check_toolchain(self, container: Any) -> None:
        """A session keeps the container it was made with: a turn that names another
        toolchain image is told how to switch, rather than run on the wrong toolchain."""
        if not self.toolchain:
            return
        wanted = self.client.images.get(self.image).id
        if container.attrs.get("Image") != wanted:
            raise ConfigError(
                f"the container of session {self.session_id} runs another image than the "
                f"session image of {self.toolchain}: `durable-harness sandbox rm "
                f"{self.session_id}` and run again (the workspace comes back from the World)"
            )

    def _labels(self) -> dict[str, str]:
        return {LABEL_SESSION: self.session_id, LABEL_MANAGED: "1"}

    def _ensure_volumes(self) -> bool:
        """Create the session's volumes that are missing; True if the workspace was."""
        created = False
        for role, name in self.volume_names.items():
            try:
                self.client.volumes.get(name)
            except docker.errors.NotFound:
                self.client.volumes.create(
                    name, labels={**self._labels(), "role": role}, **self._volume_options()
                )
                created = created or role == "workspace"
        return created

    def _volume_options(self) -> dict[str, Any]:
        """With ``max_workspace_bytes``, each volume is a tmpfs of that size, mounted by
        the engine: the kernel refuses a write past it (ENOSPC inside), the host's disk is
        never touched. The local driver of Docker 20.10 cannot loop-mount an image file
        (``o=loop`` is not a kernel option) and its ``size`` option needs xfs project
        quotas; a tmpfs is emptied when its container stops, which the World's snapshots
        cover (a restarted container is restored, the mark being on the tmpfs too). Its
        pages count against the container's memory limit."""
        if self.max_workspace_bytes is None:
            return {}
        uid, gid = USER.split(":")
        size = self.max_workspace_bytes
        options = f"size={size},uid={uid},gid={gid},mode=0755,nosuid,nodev"
        opts = {"type": "tmpfs", "device": "tmpfs", "o": options}
        return {"driver": "local", "driver_opts": opts}

    def _create(self) -> Any:
        try:
            return self.client.containers.create(
                self.image,
                command=["sleep", "infinity"],
                name=self.container_name,
                labels=self._labels(),
                hostname="sandbox",
                user=USER,
                working_dir=sh.WORKSPACE,
                environment={"HOME": sh.HOME},
                network_mode="none",
                read_only=True,
                # exec: Docker's default noexec would only break builds run in /tmp,
                # the workspace is executable anyway.
                tmpfs={"/tmp": f"rw,exec,nosuid,nodev,size={self.tmp_size},mode=1777"},
                shm_size="64m",
                volumes={
                    self.volume_names["workspace"]: {"bind": sh.WORKSPACE, "mode": "rw"},
                    self.volume_names["home"]: {"bind": sh.HOME, "mode": "rw"},
                    # Read-only: the container may connect to the socket there, not plant one.
                    self.run_dir: {"bind": RUN_DIR, "mode": "ro"},
                },
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                mem_limit=self.memory,
                memswap_limit=self.memory,
                pids_limit=self.pids,
                nano_cpus=int(self.cpus * 1e9),
                init=True,
            )
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise
        # 409: another worker is creating it.
        return self._await_named()

    def _await_named(self) -> Any:
        """The session's container by name, once another worker's creation of it can be
        looked up: the name is taken a moment before."""
        deadline = time.monotonic() + 30
        while True:
            try:
                return self.client.containers.get(self.container_name)
            except docker.errors.NotFound:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def exec(
        self,
        script: str,
        *args: str,
        stdin: bytes | None = None,
        timeout: float = 120.0,
        max_output: int | None = None,
        environment: dict[str, str] | None = None,
    ) -> docker_exec.ExecResult:
        """Run ``bash -c script dh args…`` in the container as the agent user, with
        the workspace as cwd. A stopped container is started and the call retried once."""
        command = ["bash", "-c", script, "dh", *args]
        for attempt in (1, 2):
            cid = self.container_id()
            with self._mapped("running a command"):
                try:
                    return self._run(
                        cid,
                        command,
                        stdin=stdin,
                        environment=environment,
                        timeout=timeout,
                        max_output=max_output or self.max_output,
                    )
                except docker.errors.APIError as exc:
                    if exc.status_code != 409 or attempt == 2:  # 409: not running
                        raise
                    if self.max_workspace_bytes is not None:
                        # Its tmpfs volumes went with it: retry the turn, which restores
                        # the workspace from the World's snapshot.
                        self._container_id = None
                        raise SandboxUnavailable(
                            f"the container of session {self.session_id} stopped and its "
                            "size-capped workspace with it; the turn is retried on a "
                            "workspace restored from its snapshot"
                        ) from exc
                    self.client.containers.get(cid).start()
        raise AssertionError("unreachable")

    def stream(
        self, script: str, *args: str, environment: dict[str, str] | None = None
    ) -> Generator[bytes, None, int | None]:
        """Run ``bash -c script dh args…`` as the agent user and yield its stdout as it
        comes (``b""`` each idle second, for the caller's deadline); the generator returns
        the exit code as Docker reports it (nothing in the container can forge it)."""
        cid = self.container_id()
        command = ["bash", "-c", script, "dh", *args]
        with self._mapped("running a command"):
            return (
                yield from docker_exec.stream(
                    self.client.api, cid, command, user=USER, environment=environment
                )
            )

    def stop_commands(self, within: int = 10) -> int:
        """Stop every bash-tool command still running in the container (a dead worker's
        runs on: its ``docker exec`` outlives the client) and wait up to ``within`` seconds
        for each to end; how many were stopped. Before a new worker starts an agent's
        launch: a command reaps, when it ends, what was started during its life outside
        the harness's own execs, which would take a launch started meanwhile with it (see
        ``scripts.STOP_COMMANDS``)."""
        result = self.exec(sh.STOP_COMMANDS, str(within), timeout=within + 30)
        if result.exit_code != 0:
            raise result.failure("stopping the commands left running")
        return int(result.stdout.decode(errors="replace").strip() or 0)

    def kill_all(self) -> None:
        """Kill every process of the container but its init and main command (the
        container stays up): see ``scripts.KILL_ALL``."""
        self.exec(sh.KILL_ALL, timeout=60)

    def remove(self) -> None:
        """Remove the session's container and volumes (its workspace is gone for good,
        except for the snapshots in the World)."""
        with self._mapped("removing the session's container"):
            for c in self.client.containers.list(
                all=True, filters={"label": f"{LABEL_SESSION}={self.session_id}"}
            ):
                c.remove(force=True)
            for name in self.volume_names.values():
                with contextlib.suppress(docker.errors.NotFound):
                    self.client.volumes.get(name).remove(force=True)
        self._container_id = None
        self._cache.clear()
        self._mark = None
        # The run folder holds at most a proxy socket (useless without the container).
        with contextlib.suppress(OSError):
            for name in os.listdir(self.run_dir):
                os.unlink(os.path.join(self.run_dir, name))
            os.rmdir(self.run_dir)

    def close(self) -> None:
        """Free the client; the container stays for the session's next turn (a throwaway
        sandbox's container is removed)."""
        try:
            if self.ephemeral and self._container_id is not None:
                with contextlib.suppress(SandboxUnavailable):
                    self.remove()
        finally:
            self.client.close()

    # -- shell -----------------------------------------------------------------------

    def bash(self, command: str, timeout: float | None = None) -> ShellResult:
        """Run ``command`` (see the module docstring); stdin is ``/dev/null``."""
        limit, note = cap_timeout(self.timeout if timeout is None else timeout)
        if note:
            return noted(self.bash(command, limit), note)
        token = f"__DH_{secrets.token_hex(8)}"
        started = time.monotonic()
        result = self.exec(
            sh.BASH_COMMAND,
            f"{limit:g}",
            token,
            stdin=command.encode(),
            timeout=limit + 15,
            environment={"__DH_OUTER": sh.BASH, "__DH_INNER": sh.INNER},
        )
        elapsed = time.monotonic() - started
        stdout = shell_text(result.stdout)
        stderr, pid_hits, oom_kills = _split_report(shell_text(result.stderr), token)
        note = f"bash: timed out after {limit:g}s; the command was stopped\n"
        if result.timed_out:  # the container did not answer in time
            return ShellResult(_TIMEOUT_EXIT_CODE, stdout, stderr + note, timed_out=True)
        code = -1 if result.exit_code is None else result.exit_code
        if pid_hits or oom_kills:
            if oom_kills:
                what = f"ran out of memory (limit {self.memory}): a process was killed"
            else:
                what = f"hit the process limit ({self.pids}): it could not start more"
            output = (stdout + stderr)[-_OUTPUT_IN_ERROR:]
            raise ResourceLimit(
                f"bash: the command {what}; it was stopped with everything it started. "
                f"exit code {code}, last output:\n{output}"
            )
        if code == _TIMEOUT_EXIT_CODE or (code == _SIGKILL_EXIT_CODE and elapsed >= limit):
            return ShellResult(_TIMEOUT_EXIT_CODE, stdout, stderr + note, timed_out=True)
        return ShellResult(code, stdout, stderr)


def _split_report(stderr: str, token: str) -> tuple[str, int, int]:
    """stderr without the wrapper's last line, and that line's counters (pid limit hits,
    OOM kills). A missing line (the wrapper itself was killed) counts as neither."""
    head, sep, tail = stderr.rpartition(f"\n{token} ")
    if not sep:
        return stderr, 0, 0
    fields = tail.split()
    try:
        return head, int(fields[0]), int(fields[1])
    except (IndexError, ValueError):
        return head, 0, 0
