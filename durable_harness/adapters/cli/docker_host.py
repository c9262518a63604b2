"""A CLI agent in the session's Docker container, as a detached job that outlives the
worker (see :mod:`.cli.host` for the seam).

The way out of the container (``network_mode="none"``: only ``lo``) is one unix socket:

* the worker's model proxy listens on its own loopback; :class:`UnixRelay` serves it on
  ``proxy.sock`` in the session's run folder on the host
  (:func:`~durable_harness.sandbox.docker.host_run_dir`), which the container has
  bind-mounted read-only at ``/run/durable-harness``;
* inside, ``dh-bridge.js`` (:mod:`.cli.node`) listens on ``127.0.0.1:<port>`` (a port
  drawn at random for each launch and stored in its plan, so nothing in the container
  can know the next launch's port and listen there first; a launch stored without one
  keeps the port its job id derives) and relays each connection to that socket; the CLI's model
  endpoint, its hooks (``dh-hook.js``) and its MCP host tools all use that URL (Claude
  Code's, Codex's and OpenCode's through ``dh-mcp.js``, which posts a call again when the
  worker died under it),
  with the per-launch proxy token. No provider key enters the container.

The CLI and its bridge run as one detached job (``sandbox.jobs``) whose id comes from the
journal. When the worker dies the job runs on; the bridge holds new connections until a
socket answers again. A new worker :meth:`DockerCliHost.attach`-es to the job, binds a
new relay on the same socket path (the token is derived from the turn, so it is the
same), and reads the job's output from its start.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import secrets
import shlex
import threading

from durable_harness.adapters.cli.host import CliHost, CliLaunch, CliRun, Line
from durable_harness.adapters.cli.node import BRIDGE, HOOK, MCP
from durable_harness.adapters.cli.relay import UnixRelay
from durable_harness.core.errors import ConfigError, SandboxError, SandboxUnavailable
from durable_harness.core.settings import ListenerSettings
from durable_harness.sandbox.docker import RUN_DIR, DockerSandbox

__all__ = ["DockerCliHost", "UnixRelay", "bridge_files", "bridge_job", "random_port"]

SOCKET_NAME = "proxy.sock"
_HOMES = "/home/agent/.durable-harness/cli"
_BRIDGE_FILE = "dh-bridge.js"
_HOOK_FILE = "dh-hook.js"
_MCP_FILE = "dh-mcp.js"
_STDIN_FILE = "dh-stdin"
_versions: dict[tuple[str, str], str] = {}  # (image, binary) -> version

# The launch's HOME, the bridge's port and limits; then the CLI's argv. The bridge must listen
# before the CLI's first request; the job's supervisor kills it when the CLI is done.
_JOB = """
h={home}
node "$h/{bridge}" {socket} {port} "$h/bridge.ready" {limits} 2>>"$h/bridge.log" &
b=$!
for _ in $(seq 1200); do  # 60 s: node starts slowly on a loaded machine
  [ -e "$h/bridge.ready" ] && break
  kill -0 "$b" 2>/dev/null || break
  sleep 0.05
done
[ -e "$h/bridge.ready" ] || {{ echo "dh-bridge failed: $(cat "$h/bridge.log")" >&2; exit 3; }}
{argv} < "$h/{stdin}"
st=$?
kill "$b" 2>/dev/null
exit "$st"
"""


def bridge_job(home: str, socket_name: str, port: int, argv: list[str]) -> str:
    """The job script that serves the run folder's ``socket_name`` on the container's
    ``127.0.0.1:port`` (``dh-bridge.js``, written into ``home`` with stdin file
    ``dh-stdin``), runs ``argv`` and stops the bridge when it ends."""
    return _JOB.format(
        home=shlex.quote(home),
        bridge=_BRIDGE_FILE,
        socket=shlex.quote(f"{RUN_DIR}/{socket_name}"),
        port=port,
        limits=bridge_limits(),
        argv=shlex.join(argv),
        stdin=_STDIN_FILE,
    )


def bridge_files(stdin: bytes) -> dict[str, bytes]:
    """The files :func:`bridge_job` expects in its ``home``."""
    return {_BRIDGE_FILE: BRIDGE.encode(), _HOOK_FILE: HOOK.encode(), _STDIN_FILE: stdin}


def bridge_port(job_id: str) -> int:
    """The bridge's port of a launch stored without one (older versions derived it from
    the job id, which is predictable from inside: new launches draw theirs)."""
    return 20000 + int(hashlib.sha256(job_id.encode()).hexdigest()[:8], 16) % 20000


def bridge_limits() -> str:
    """The bridge's arguments after its ready file: the operator's connection cap and
    read timeout (ms), the same numbers the relay and the listeners apply."""
    settings = ListenerSettings.load()
    timeout_ms = max(1, round(settings.listener_read_timeout_s * 1000))
    return f"{settings.listener_max_connections} {timeout_ms}"


def random_port() -> int:
    """A bridge port for a new launch: below Linux's ephemeral range (32768-60999), so
    no outgoing connection in the container holds it by chance."""
    return 10000 + secrets.randbelow(22000)


class DockerCliHost(CliHost):
    """The session's container (created, or found by label, on first use)."""

    workspace = "/workspace"
    durable = True

    def __init__(self, session_id: str, toolchain: str | None = None) -> None:
        self.sandbox = DockerSandbox(session_id, toolchain=toolchain)
        self._relay: UnixRelay | None = None
        self._ports: dict[str, int] = {}  # job id -> its bridge's port (endpoint())

    def home(self, job_id: str) -> str:
        return f"{_HOMES}/{job_id}"

    def binary(self, name: str) -> str:
        return name  # the image puts the pinned CLIs on PATH

    def version(self, binary: str, env: dict[str, str] | None = None) -> str:
        key = (self.sandbox.image, binary)
        if key not in _versions:
            result = self.sandbox.exec(
                f"{shlex.quote(binary)} --version </dev/null", timeout=60, environment=env
            )
            if result.exit_code != 0:
                raise SandboxError(
                    f"{binary} --version failed in the agent image {self.sandbox.image}: "
                    f"{result.stderr.decode(errors='replace')[-300:]}; rebuild it with "
                    "`durable-harness sandbox build`"
                )
            out = result.stdout.decode(errors="replace").split()
            _versions[key] = (out or result.stderr.decode(errors="replace").split() or ["?"])[0]
        return _versions[key]

    def version_text(self, binary: str) -> str:
        result = self.sandbox.exec(f"{shlex.quote(binary)} --version", timeout=60)
        if result.exit_code != 0:
            raise SandboxError(
                f"{binary} --version failed in the agent image {self.sandbox.image}: "
                f"{result.stderr.decode(errors='replace')[-300:]}; rebuild it with "
                "`durable-harness sandbox build`"
            )
        return result.stdout.decode(errors="replace")

    def realpath(self, binary: str) -> str:
        result = self.sandbox.exec('readlink -f "$(command -v "$1")"', binary, timeout=60)
        return result.stdout.decode(errors="replace").strip() or binary

    def launch_port(self) -> int:
        return random_port()

    def endpoint(self, proxy_url: str, job_id: str, port: int | None = None) -> str:
        cid = self.sandbox.container_id()  # the run folder exists once the container does
        mounts = self.sandbox.client.api.inspect_container(cid).get("Mounts") or []
        if not any(m.get("Destination") == RUN_DIR for m in mounts):
            raise ConfigError(
                f"the container of session {self.sandbox.session_id} was made by an older "
                f"durable-harness without {RUN_DIR}, so a CLI in it cannot reach the model "
                f"proxy: run `durable-harness sandbox rm {self.sandbox.session_id}` (its "
                "workspace is restored from the World) and resume the turn"
            )
        if self._relay is None:
            path = os.path.join(self.sandbox.run_dir, SOCKET_NAME)
            self._relay = UnixRelay(path, proxy_url).start()
        self._ports[job_id] = bridge_port(job_id) if port is None else port
        return f"http://127.0.0.1:{self._ports[job_id]}"

    def port_of(self, job_id: str) -> int:
        """The bridge port of launch ``job_id`` (:meth:`endpoint` set it)."""
        return self._ports.get(job_id) or bridge_port(job_id)

    def hook_command(self, endpoint_file: str, event: str) -> list[str]:
        home = os.path.dirname(endpoint_file)
        return ["node", f"{home}/{_HOOK_FILE}", endpoint_file, event]

    def mcp_command(self, endpoint_file: str) -> list[str] | None:
        home = os.path.dirname(endpoint_file)
        return ["node", f"{home}/{_MCP_FILE}", endpoint_file]

    def read_file(self, path: str) -> bytes | None:
        return self.sandbox.read_bytes(path)

    def find_files(self, folder: str, name: str) -> list[str]:
        found = self.sandbox.exec('find "$1" -type f -name "$2" 2>/dev/null', folder, name)
        listing = found.whole_stdout(f"finding {name} in {folder}")
        return sorted(listing.decode(errors="replace").splitlines())

    def start(self, launch: CliLaunch) -> CliRun:
        home = self.home(launch.job_id)
        files = {**launch.files, **bridge_files(launch.stdin), _MCP_FILE: MCP.encode()}
        for rel, data in files.items():
            self.sandbox.write_bytes(f"{home}/{rel}", data)
        port = self._ports.get(launch.job_id) or bridge_port(launch.job_id)
        script = bridge_job(home, SOCKET_NAME, port, launch.argv)
        # Contained: a daemon the CLI's shell tool started dies with the launch, so it
        # cannot wait for the next launch's bridge (and its proxy token).
        self.sandbox.jobs.start(
            launch.job_id, script, workdir=self.workspace, env=launch.env, contain=True
        )
        return _DockerRun(self.sandbox, launch.job_id)

    def attach(self, job_id: str) -> CliRun | None:
        status = self.sandbox.jobs.status(job_id)
        if status.state in ("starting", "running") or (
            status.state == "exited" and status.exit_code == 0
        ):
            return _DockerRun(self.sandbox, job_id)
        return None

    def finish(self, job_id: str) -> None:
        self.sandbox.exec('rm -rf -- "$1"', self.home(job_id))

    def close(self) -> None:
        try:
            if self._relay is not None:
                self._relay.close()
                self._relay = None
        finally:
            self.sandbox.close()


class _DockerRun(CliRun):
    def __init__(self, sandbox: DockerSandbox, job_id: str) -> None:
        self.sandbox = sandbox
        self.job_id = job_id
        self._lines: queue.Queue[Line] | None = None

    def output(self) -> queue.Queue[Line]:
        if self._lines is None:
            self._lines = queue.Queue()
            threading.Thread(target=self._pump, name="cli-job-output", daemon=True).start()
        return self._lines

    def _pump(self) -> None:
        assert self._lines is not None
        pending = b""
        try:
            for chunk in self.sandbox.jobs.follow(self.job_id, 0):
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for line in complete:
                    self._lines.put(line + b"\n")
            if pending:
                self._lines.put(pending)
            self._lines.put(None)
        except BaseException as exc:  # handed to the reading thread, which raises it
            self._lines.put(exc)

    def wait(self) -> int:
        status = self.sandbox.jobs.wait(self.job_id, timeout=30)
        if status.state == "lost":
            raise SandboxUnavailable(
                f"the container of session {self.sandbox.session_id} stopped under the CLI; "
                "the turn is retried, resuming the CLI's session"
            )
        if status.exit_code is None:
            raise SandboxUnavailable(f"the CLI's job {self.job_id} did not end ({status.state})")
        return status.exit_code

    def stderr_tail(self) -> str:
        data = self.sandbox.jobs.read_output(self.job_id, 0, "stderr")
        return data.decode("utf-8", "replace")[-2000:]

    def kill(self) -> None:
        with contextlib.suppress(SandboxUnavailable, SandboxError):
            self.sandbox.jobs.stop(self.job_id)
