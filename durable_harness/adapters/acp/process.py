"""Starting an ACP agent where the turn's sandbox runs it, with its stdio kept open.

The other CLIs read their stdout and get their input once; an ACP agent is a
conversation on its stdin and stdout, so its process is an asyncio subprocess. On a
host folder (:class:`~.cli.host.HostCliHost`) it is started as a CLI is: under
:mod:`.cli.reaper` (it dies with the worker, and so does everything it started), as the
unprivileged agent user with the allow-listed environment and its private HOME, in
the workspace. The stdout reader is bounded at the transport's line cap.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import IO, Protocol

from durable_harness.adapters.cli import reaper
from durable_harness.adapters.cli.host import HostCliHost
from durable_harness.sandbox.agent_user import agent_env, as_agent, grant_workspace, hand_over

__all__ = ["Agent", "AgentProcess", "start_on_host"]


class Agent(Protocol):
    """A started agent as the conversation sees it: its stdout and stdin."""

    @property
    def stdout(self) -> asyncio.StreamReader: ...

    @property
    def stdin(self) -> asyncio.StreamWriter: ...

    @property
    def returncode(self) -> int | None: ...

    def stderr_tail(self, chars: int = 2000) -> str: ...

    async def stop(self) -> int | None: ...


class AgentProcess:
    """A started agent: its asyncio process and its stderr (a private file)."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr: IO[bytes]) -> None:
        self.proc = proc
        self._stderr = stderr

    @property
    def stdin(self) -> asyncio.StreamWriter:
        assert self.proc.stdin is not None
        return self.proc.stdin

    @property
    def stdout(self) -> asyncio.StreamReader:
        assert self.proc.stdout is not None
        return self.proc.stdout

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def stderr_tail(self, chars: int = 2000) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")[-chars:]

    async def stop(self) -> int | None:
        """End it (the reaper kills the agent and everything it started)."""
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self._stderr.close()
        return self.proc.returncode


async def start_on_host(
    host: HostCliHost,
    job: str,
    argv: list[str],
    env: dict[str, str],
    files: dict[str, bytes],
    line_limit: int,
) -> AgentProcess:
    """Write the launch's HOME files (private), give HOME and the workspace to the agent
    user, and start ``argv`` there under the reaper."""
    home = Path(host.home(job))
    for rel, data in files.items():
        target = home / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o600)
    grant_workspace(host.user, Path(host.workspace))
    hand_over(host.user, str(home))
    full_env = agent_env(str(home), host.user, env)
    command = argv if host.user is None else as_agent(host.user, argv)
    stderr = tempfile.TemporaryFile()  # noqa: SIM115  (closed by AgentProcess.stop)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-S",
        reaper.__file__,
        str(os.getpid()),
        "--",
        *command,
        cwd=host.workspace,
        env=full_env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
        limit=line_limit + 1,
    )
    return AgentProcess(proc, stderr)
