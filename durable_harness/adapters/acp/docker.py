"""An ACP agent in the session's Docker container, its stdio carried to the harness
over a unix socket in the session's run folder (the way out every CLI's bridge uses).

The container has no network but ``lo``. The launch is one detached job
(``sandbox.jobs``, contained: what the agent started dies with it) of the CLI agents'
:func:`~.cli.docker_host.bridge_job`: ``dh-bridge.js`` serves the model proxy's socket on
the launch's ``127.0.0.1:<port>`` (the agent's model endpoint, with the per-launch
token), then ``node dh-acp.js <socket> <token-file> <agent argv>`` connects to
``acp-<random>.sock``, a socket the worker listens on for this launch only, sends the
token's line first, starts the agent and pipes its stdin and stdout through the
connection (its stderr stays in the job's file).

The worker accepts one connection, which must send the launch's token (compared in
constant time) within the read timeout, in a first line of at most 256 bytes; then the
socket is gone. When the worker dies the connection ends and ``dh-acp.js`` kills the
agent: an ACP launch does not outlive its worker (its ACP session is a conversation with
that worker); the next worker stops what is left of the job and resumes the session from
its saved record.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import secrets

from durable_harness.adapters.cli.docker_host import (
    SOCKET_NAME,
    DockerCliHost,
    bridge_files,
    bridge_job,
)
from durable_harness.core.errors import DurableHarnessError, SandboxError, SandboxUnavailable
from durable_harness.core.settings import ListenerSettings
from durable_harness.sandbox.docker import RUN_DIR

__all__ = ["STDIO", "DockerAgent", "start_in_docker", "stop_job"]

_STDIO_FILE = "dh-acp.js"
_TOKEN_FILE = "dh-acp-token"
_FIRST_LINE = 256

#: ``node dh-acp.js <socket> <token-file> <argv...>``: the agent's stdio over the socket.
STDIO = r"""
const fs = require("fs"), net = require("net"), { spawn } = require("child_process");
const [sock, tokenFile, ...argv] = process.argv.slice(2);
const token = fs.readFileSync(tokenFile, "utf8").trim();
const conn = net.connect(sock);
conn.on("error", (e) => { console.error("dh-acp: " + e.message); process.exit(75); });
conn.on("connect", () => {
  conn.write(token + "\n");
  const agent = spawn(argv[0], argv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  agent.on("error", (e) => { console.error("dh-acp: " + e.message); process.exit(127); });
  conn.pipe(agent.stdin);
  agent.stdout.pipe(conn);
  agent.on("exit", (code, signal) => { conn.end(); process.exit(code === null ? 1 : code); });
  // The worker is gone: so is the agent (a new worker resumes from the saved record).
  conn.on("close", () => { agent.kill("SIGKILL"); process.exit(75); });
});
"""


class DockerAgent:
    """The agent's end of the connection, as :func:`~.acp.session.converse` reads it."""

    def __init__(
        self,
        host: DockerCliHost,
        job: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.host = host
        self.job = job
        self._reader = reader
        self._writer = writer

    @property
    def stdout(self) -> asyncio.StreamReader:
        return self._reader

    @property
    def stdin(self) -> asyncio.StreamWriter:
        return self._writer

    @property
    def returncode(self) -> int | None:
        with contextlib.suppress(SandboxError, SandboxUnavailable):
            return self.host.sandbox.jobs.status(self.job).exit_code
        return None

    def stderr_tail(self, chars: int = 2000) -> str:
        return job_stderr(self.host, self.job, chars)

    async def stop(self) -> int | None:
        with contextlib.suppress(OSError):
            self._writer.close()
        with contextlib.suppress(SandboxError, SandboxUnavailable):
            # The next launch checks again (stop_job raises there) before it starts.
            await asyncio.to_thread(stop_job, self.host, self.job)
        return await asyncio.to_thread(lambda: self.returncode)


def job_stderr(host: DockerCliHost, job: str, chars: int) -> str:
    """The end of launch ``job``'s stderr, or why it could not be read."""
    try:
        data = host.sandbox.jobs.read_output(job, 0, "stderr")
    except (SandboxError, SandboxUnavailable) as exc:
        return f"(its stderr could not be read: {exc})"
    return data.decode("utf-8", "replace")[-chars:]


def stop_job(host: DockerCliHost, job: str) -> None:
    """Kill launch ``job`` if it still runs, and return once its supervisor has recorded
    its end: the launch is contained, and when it ends its supervisor kills every process
    started during its life, so a next launch started before then would die with it.
    SandboxError (or SandboxUnavailable) when that end cannot be confirmed."""
    host.sandbox.jobs.stop(job)


async def start_in_docker(
    host: DockerCliHost,
    job: str,
    argv: list[str],
    env: dict[str, str],
    files: dict[str, bytes],
    line_limit: int,
    connect_timeout: float,
) -> DockerAgent:
    """Start the launch's job and take its one authenticated connection (module docstring)."""
    home = host.home(job)
    token = secrets.token_urlsafe(32)
    name = f"acp-{secrets.token_hex(6)}.sock"
    path = os.path.join(host.sandbox.run_dir, name)
    accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
    accepted = asyncio.get_running_loop().create_future()
    read_timeout = ListenerSettings.load().listener_read_timeout_s

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if accepted.done():
            writer.close()  # one connection per launch
            return
        try:
            first = await asyncio.wait_for(reader.readline(), read_timeout)
        except (TimeoutError, ValueError, OSError):
            writer.close()
            return
        if len(first) > _FIRST_LINE or not hmac.compare_digest(first.strip(), token.encode()):
            writer.close()
            return
        if not accepted.done():
            accepted.set_result((reader, writer))

    server = await asyncio.start_unix_server(on_connect, path=path, limit=line_limit + 1)
    try:
        os.chmod(path, 0o666)  # the container's agent user connects
        every = {
            **files,
            **bridge_files(b""),
            _STDIO_FILE: STDIO.encode(),
            _TOKEN_FILE: token.encode(),
        }
        await asyncio.to_thread(_write, host, home, every)
        stdio = ["node", f"{home}/{_STDIO_FILE}", f"{RUN_DIR}/{name}", f"{home}/{_TOKEN_FILE}"]
        port = host.port_of(job)
        script = bridge_job(home, SOCKET_NAME, port, [*stdio, *argv])
        await asyncio.to_thread(
            host.sandbox.jobs.start, job, script, workdir=host.workspace, env=env, contain=True
        )
        try:
            reader, writer = await asyncio.wait_for(accepted, connect_timeout)
        except TimeoutError:
            tail = job_stderr(host, job, 500).strip() or "nothing on stderr"
            with contextlib.suppress(SandboxError, SandboxUnavailable):
                await asyncio.to_thread(stop_job, host, job)
            raise DurableHarnessError(
                f"the agent's launch in the container did not connect within "
                f"{connect_timeout:g} s: {tail}"
            ) from None
    finally:
        server.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
    return DockerAgent(host, job, reader, writer)


def _write(host: DockerCliHost, home: str, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        host.sandbox.write_bytes(f"{home}/{rel}", data)
