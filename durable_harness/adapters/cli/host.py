"""Where a CLI agent runs: the seam between a CLI adapter and its sandbox.

A CLI adapter (Claude Code, Pi, OpenCode; Codex next) says *what* to run, a
:class:`CliLaunch`: the command, its environment, the files of its private HOME and the
message on its stdin, under a job id derived from the journal (the same on every
worker). A :class:`CliHost` says *where*, and gives back a :class:`CliRun` whose stdout
lines the adapter reads:

* :class:`HostCliHost` — a host folder (for Claude Code and Codex a developer-only
  opt-in, see :func:`require_unsafe_host`, with the worker's uid; for Pi and OpenCode
  their local sandbox, as the unprivileged agent user of
  :mod:`durable_harness.sandbox.agent_user`): the CLI is a child of the worker under
  :mod:`.reaper`, so it dies with the worker and nothing it started outlives the launch;
  a new worker starts a new launch. Every process it starts (the CLI, its version check)
  gets the allow-listed environment of ``agent_env``, never the worker's.
* :class:`~.cli.docker_host.DockerCliHost` — the session's container: the CLI is a detached
  job that outlives the worker; a new worker finds it by its id (:meth:`CliHost.attach`),
  serves the model proxy again on the same socket, reads its output from the start and
  finishes the launch.

The model proxy listens on the worker's loopback; :meth:`CliHost.endpoint` makes it
reachable from where the CLI runs and returns the URL the CLI is given.
:func:`supervise` reads a launch's output to its end (or the proxy's fatal error).
"""

from __future__ import annotations

import abc
import contextlib
import errno
import os
import queue
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from durable_harness.adapters.cli import hook_client, reaper
from durable_harness.adapters.cli.installed import bin_dirs
from durable_harness.core.canonical import parse_json
from durable_harness.core.errors import ConfigError, LeaseLost
from durable_harness.core.keys import BLOB_PREFIX, is_launch_key
from durable_harness.core.settings import Settings
from durable_harness.core.types import Step
from durable_harness.core.world import World
from durable_harness.harness.journal import Journal
from durable_harness.sandbox.agent_user import (
    AgentUser,
    agent_env,
    as_agent,
    grant_workspace,
    hand_over,
    private_home,
)
from durable_harness.sandbox.quota import WorkspaceWatch, stop_commands

if TYPE_CHECKING:
    from durable_harness.adapters.proxy.server import JournalingProxy

__all__ = [
    "UNSAFE_HOST_ENV",
    "CliHost",
    "CliLaunch",
    "CliRun",
    "Finished",
    "HostCliHost",
    "Line",
    "find_cli",
    "follow",
    "json_event",
    "launch_steps",
    "locate_cli",
    "progress",
    "require_unsafe_host",
    "stored_input",
    "supervise",
]

#: Set to 1 to let Claude Code or Codex act on a host folder with your user's rights:
#: for developing adapters only (the tests of tests/adapters set it).
UNSAFE_HOST_ENV = "DURABLE_HARNESS_UNSAFE_HOST_AGENT"

#: An item of :meth:`CliRun.output`: a stdout line, None at the end, or the error that
#: stopped the reading (the container vanished).
Line = bytes | BaseException | None


def locate_cli(name: str, bin_env: str) -> tuple[str, str] | None:
    """``(where, path)`` of the host binary of CLI ``name``, in the order :func:`find_cli`
    takes them (``where``: ``$<bin_env>``, ``checkout``, ``user cache`` or ``PATH``), or
    None when there is none. Its version is not checked here."""
    override = os.environ.get(bin_env)
    if override:
        return f"${bin_env}", override
    for where, folder in bin_dirs():
        if os.access(folder / name, os.X_OK):
            return where, str(folder / name)
    found = shutil.which(name)
    return ("PATH", found) if found else None


def find_cli(name: str, bin_env: str, product: str, package: str) -> str:
    """The host binary of CLI ``name``: ``$<bin_env>``, a pinned install (``.tools/npm``
    of a checkout, made by scripts/setup, then the per-user one of ``durable-harness
    setup-agents``: :mod:`.installed`), or PATH. ConfigError if none."""
    located = locate_cli(name, bin_env)
    if located is None:
        raise ConfigError(
            f"{product} is not installed: run `durable-harness setup-agents` (it installs "
            f"{package} into your user cache; scripts/setup of a checkout installs it into "
            f".tools/npm), or set {bin_env} to a {name} binary of that version"
        )
    where, path = located
    if where.startswith("$") and not os.access(path, os.X_OK):
        raise ConfigError(f"{bin_env}={path!r} is not an executable file")
    return path


def require_unsafe_host(agent: str, workspace: str) -> None:
    """ConfigError unless the developer opted in to running ``agent`` on a host folder."""
    if os.environ.get(UNSAFE_HOST_ENV) != "1":
        raise ConfigError(
            f"the {agent} agent runs only in the Docker sandbox: give --workspace docker "
            f"(not {workspace!r}; see docs/docker.md). Running it on a host folder is for "
            f"developing adapters only: set {UNSAFE_HOST_ENV}=1 to accept that the CLI acts "
            "there with your user's rights"
        )


@dataclass
class CliLaunch:
    """One run of a CLI. ``files`` (HOME-relative paths) are written, private, before it
    starts; ``stdin`` is its input; ``env`` its whole environment besides what the host adds
    (never a provider key: the proxy's token)."""

    job_id: str
    argv: list[str]
    env: dict[str, str]
    stdin: bytes
    files: dict[str, bytes] = field(default_factory=dict)


class CliRun(abc.ABC):
    """A started (or re-attached) CLI."""

    @abc.abstractmethod
    def output(self) -> queue.Queue[Line]:
        """Its stdout lines from the first one (a re-attached run reads them again)."""

    @abc.abstractmethod
    def wait(self) -> int:
        """Its exit status, once its output ended."""

    @abc.abstractmethod
    def stderr_tail(self) -> str:
        """The last 2,000 characters it wrote to stderr."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Stop it and everything it started."""


class CliHost(abc.ABC):
    """Where one turn's CLI runs (see the module docstring). Use as a context manager."""

    #: The CLI's working directory, as the CLI sees it.
    workspace: str
    #: Whether a launch outlives the worker (then :meth:`attach` may find it).
    durable: bool = False

    @abc.abstractmethod
    def home(self, job_id: str) -> str:
        """The launch's private HOME, as the CLI sees it."""

    @abc.abstractmethod
    def binary(self, name: str) -> str:
        """How to invoke the CLI ``name`` here (a path or a name on PATH)."""

    @abc.abstractmethod
    def version(self, binary: str, env: dict[str, str] | None = None) -> str:
        """The first word ``binary --version`` prints here (on stdout, else on stderr),
        run with ``env`` added to the environment."""

    def realpath(self, binary: str) -> str:
        """Where ``binary`` is installed here, symlinks resolved."""
        return os.path.realpath(shutil.which(binary) or binary)

    def version_text(self, binary: str) -> str:
        """All ``binary --version`` prints here (for a CLI whose version is not its first
        word, such as ``codex-cli 0.171.0``)."""
        raise NotImplementedError

    def launch_port(self) -> int | None:
        """A port for a new launch's way to the proxy, stored in its plan (None: it
        needs none, the proxy is reachable as it is)."""
        return None

    @abc.abstractmethod
    def endpoint(self, proxy_url: str, job_id: str, port: int | None = None) -> str:
        """Make the proxy at ``proxy_url`` reachable from the CLI of launch ``job_id``
        (``port`` from its plan); the URL the CLI uses."""

    @abc.abstractmethod
    def hook_command(self, endpoint_file: str, event: str) -> list[str]:
        """The command a CLI hook runs to post ``event`` to the proxy."""

    def mcp_command(self, endpoint_file: str) -> list[str] | None:
        """The command of a stdio MCP server relaying to the proxy's ``/mcp`` and posting
        again a call the worker's death cut off (:data:`~.cli.node.MCP`), for a CLI whose
        launch outlives the worker; None: the CLI reaches ``/mcp`` over HTTP itself (it
        dies with the worker, and its next launch is told what was interrupted)."""
        return None

    @abc.abstractmethod
    def read_file(self, path: str) -> bytes | None:
        """A file as the CLI sees it (absolute path), or None."""

    def find_files(self, folder: str, name: str) -> list[str]:
        """The files below ``folder`` (absolute, as the CLI sees it) whose name matches the
        shell pattern ``name``, sorted (for a CLI that names its session file by time)."""
        raise NotImplementedError

    @abc.abstractmethod
    def start(self, launch: CliLaunch) -> CliRun:
        """Start the launch (a durable host starts each job id at most once)."""

    def attach(self, job_id: str) -> CliRun | None:
        """The launch ``job_id`` of an earlier worker, if it still runs or ended well."""
        return None

    def finish(self, job_id: str) -> None:  # noqa: B027  (optional: nothing to do by default)
        """The launch is journaled: its HOME may go."""

    def close(self) -> None:  # noqa: B027
        """Stop serving the proxy; a durable launch goes on without the worker."""

    def __enter__(self) -> CliHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HostCliHost(CliHost):
    """A host folder: the CLI as a child of the worker, under :mod:`.reaper`, run as
    ``user`` (None: the worker's uid, for the developer opt-in or the operator's unsafe
    same-user mode)."""

    def __init__(
        self,
        workspace: Path,
        binaries: dict[str, str],
        home_prefix: str = "durable-harness-claude-",
        user: AgentUser | None = None,
    ) -> None:
        self.workspace = str(workspace)
        self.binaries = binaries  # name -> the host binary (found by the adapter)
        self.home_prefix = home_prefix  # tests find a launch's processes by it
        self.user = user
        self._homes: dict[str, str] = {}
        self._granted = False

    def home(self, job_id: str) -> str:
        if job_id not in self._homes:
            # Root's until the launch starts (hand_over): the worker writes its files first.
            self._homes[job_id] = tempfile.mkdtemp(prefix=self.home_prefix)
        return self._homes[job_id]

    def binary(self, name: str) -> str:
        return self.binaries[name]

    def version(self, binary: str, env: dict[str, str] | None = None) -> str:
        out = self._version(binary, env)
        return (out.stdout.split() or out.stderr.split() or ["(nothing)"])[0]

    def version_text(self, binary: str) -> str:
        return self._version(binary, None).stdout

    def _version(self, binary: str, env: dict[str, str] | None) -> subprocess.CompletedProcess[str]:
        """``binary --version`` as a launch runs: the agent's user, environment and a
        throwaway HOME (so it reads no user config and sees no secret of the worker)."""
        home = private_home(self.user, self.home_prefix)
        try:
            return subprocess.run(
                self._as_agent([binary, "--version"]),
                capture_output=True,
                text=True,
                timeout=60,
                env=agent_env(home, self.user, {"DISABLE_AUTOUPDATER": "1", **(env or {})}),
                stdin=subprocess.DEVNULL,
                cwd=home,
                check=False,
            )
        finally:
            shutil.rmtree(home, ignore_errors=True)

    def endpoint(self, proxy_url: str, job_id: str, port: int | None = None) -> str:
        return proxy_url

    def hook_command(self, endpoint_file: str, event: str) -> list[str]:
        return [sys.executable, "-I", "-S", hook_client.__file__, endpoint_file, event]

    def read_file(self, path: str) -> bytes | None:
        """None also for what the agent may have planted: a symlink, or a file that is
        not (once opened, wherever a folder on the way led) a regular file inside the
        launch's HOME or the workspace: the worker may be root, the file the agent's."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None
            raise
        with os.fdopen(fd, "rb") as f:
            opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
            inside = [self.workspace, *self._homes.values()]
            if not stat.S_ISREG(os.fstat(fd).st_mode) or not any(
                opened.is_relative_to(os.path.realpath(root)) for root in inside
            ):
                return None
            return f.read()

    def find_files(self, folder: str, name: str) -> list[str]:
        return sorted(str(p) for p in Path(folder).rglob(name) if p.is_file())

    def start(self, launch: CliLaunch) -> CliRun:
        home = Path(self.home(launch.job_id))
        for rel, data in launch.files.items():
            target = home / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o600)
        if not self._granted:
            grant_workspace(self.user, Path(self.workspace))
            self._granted = True
        hand_over(self.user, str(home))
        env = agent_env(str(home), self.user, launch.env)
        quota = Settings.load().max_workspace_bytes
        return _HostRun(self._as_agent(launch.argv), launch.stdin, self.workspace, env, quota)

    def _as_agent(self, argv: list[str]) -> list[str]:
        # The worker's own uid (the developer opt-in, the unsafe same-user mode): as is.
        return argv if self.user is None else as_agent(self.user, argv)

    def finish(self, job_id: str) -> None:
        home = self._homes.pop(job_id, None)
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)

    def close(self) -> None:
        for job_id in list(self._homes):
            self.finish(job_id)


class _HostRun(CliRun):
    """The CLI under its reaper; with ``quota`` (the operator's
    ``DURABLE_HARNESS_MAX_WORKSPACE_BYTES``) the workspace is watched while it runs
    (:mod:`durable_harness.sandbox.quota`): past the quota every process below the reaper
    but the CLI is killed, so the running command fails and the CLI, its turn, go on."""

    def __init__(
        self, argv: list[str], stdin: bytes, cwd: str, env: dict[str, str], quota: int | None
    ) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115  (closed in stderr_tail)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", reaper.__file__, str(os.getpid()), "--", *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write(stdin)
            self.proc.stdin.close()
        self._lines = _pump(self.proc.stdout)
        self._watch: WorkspaceWatch | None = None
        if quota is not None:
            self._watch = WorkspaceWatch(cwd, quota, self._stop_commands)
            self._watch.__enter__()

    def _stop_commands(self) -> None:
        assert self._watch is not None
        reason = f"\ndurable-harness: {self._watch.reason}\n"
        stop_commands(self.proc.pid, reason)
        self._stderr.write(reason.encode())

    def _end_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.__exit__(None, None, None)

    def output(self) -> queue.Queue[Line]:
        return self._lines

    def wait(self) -> int:
        status = self.proc.wait()
        self._end_watch()
        return status

    def stderr_tail(self) -> str:
        self._stderr.seek(0)
        text = self._stderr.read().decode("utf-8", "replace")[-2000:]
        self._stderr.close()
        return text

    def kill(self) -> None:
        self._end_watch()
        if self.proc.poll() is None:
            self.proc.terminate()  # the reaper kills the CLI and everything it started
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def follow(
    cli: CliRun,
    stop: threading.Event,
    on_line: Callable[[bytes], None],
    leave_running: Callable[[], bool],
) -> int | None:
    """Feed ``cli``'s stdout lines to ``on_line`` until they end (its exit status) or
    ``stop`` is set (None). A CLI stopped early is killed unless ``leave_running()`` (a
    lost lease leaves a durable CLI to the turn's new owner)."""
    lines = cli.output()
    status: int | None = None
    try:
        while not stop.is_set():
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                break
            if isinstance(line, BaseException):
                raise line
            on_line(line)
        if not stop.is_set():
            status = cli.wait()
    finally:
        if status is None and not leave_running():
            cli.kill()
    return status


def _pump(stream: IO[bytes]) -> queue.Queue[Line]:
    lines: queue.Queue[Line] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name="cli-stdout", daemon=True).start()
    return lines


@dataclass
class Finished:
    """How a supervised launch ended: its exit status (None: stopped for the proxy's
    fatal error) and the tail of its stderr."""

    status: int | None
    stderr: str


def supervise(cli: CliRun, proxy: JournalingProxy, on_line: Callable[[bytes], None]) -> Finished:
    """Hand each stdout line of ``cli`` to ``on_line`` until it ends (or the proxy fails
    the turn: its error is raised). A CLI stopped early is killed, unless the lease was
    lost: then it belongs to the turn's new owner."""
    status = follow(cli, proxy.fatal_event, on_line, lambda: isinstance(proxy.fatal, LeaseLost))
    stderr = cli.stderr_tail()
    if proxy.fatal is not None:
        raise proxy.fatal
    return Finished(status, stderr)


def launch_steps(journal: Journal) -> list[Step]:
    """The turn's ``launch:<n>`` steps, oldest first."""
    steps = sorted(journal.recorded.values(), key=lambda s: s.seq)
    return [s for s in steps if is_launch_key(s.key)]


def stored_input(world: World, step: Step) -> str:
    """A step's stored input text (read from its blob when it was stored as one)."""
    text = step.input or "{}"
    if text.startswith(BLOB_PREFIX):
        return world.get_blob(text.removeprefix(BLOB_PREFIX)).decode()
    return text


def json_event(line: bytes) -> dict[str, Any] | None:
    """A stdout line of a CLI's JSON output as an object; None for anything else (the CLIs
    print other lines too, which are not events)."""
    try:
        event = parse_json(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def progress(text: str) -> None:
    """One progress line under ``run``/``worker`` (stderr, one line, at most 160 chars)."""
    text = text.replace("\n", " ")
    sys.stderr.write(f"  {text[:160]}\n")
    sys.stderr.flush()
