"""Detached jobs in the Docker sandbox: commands that outlive the worker that started them.

This is how the CLI adapters run Claude Code or Codex: the CLI runs inside the session's
container under a small supervisor, its stdout and stderr go to files on the home volume,
and the worker only follows those files. If the worker dies, the CLI runs on; a new worker
opens the same session (``DockerSandbox(session_id)``), finds the job by its id through
``sandbox.jobs`` and follows it from the offset it has (or from 0) to its end::

    box = DockerSandbox(session_id)
    if box.jobs.start(f"{turn_id}-cli", "claude -p ...", env={"ANTHROPIC_API_KEY": token}):
        ...  # started now; otherwise an earlier worker started it
    for chunk in box.jobs.follow(f"{turn_id}-cli", offset):
        offset += len(chunk)
    status = box.jobs.status(f"{turn_id}-cli")  # exited, exit_code

Contract:

* :meth:`DetachedJobs.start` starts a job **at most once per id** for the life of
  the session's volumes: the job's folder is created with ``mkdir`` inside the container,
  so of any number of workers (or retries) starting the same id, exactly one starts it
  and the others get ``False``. Use an id derived from the journal (for example
  ``<turn_id>-<seq>``), never a random one, so a retry finds the first start.
* :meth:`DetachedJobs.status` reads ``missing``, ``starting``, ``running``, ``exited``
  (with its exit code) or ``lost``: no exit code and no live supervisor, because the
  container was stopped or recreated under it. A lost job is not restarted by the
  sandbox: the caller decides (a CLI adapter resumes the CLI's session instead).
* :meth:`DetachedJobs.follow` yields output chunks as they are written and returns when the
  job ends; :meth:`DetachedJobs.read_output` reads from an offset without waiting.
* The job runs as the agent user in ``workdir`` with the container's environment plus
  ``env`` (pass the per-turn proxy token here, never a provider key), stdin ``/dev/null``,
  in its own process group, killed as a group by :meth:`DetachedJobs.kill` and, when it
  exits, cleaned of whatever it left running.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from durable_harness.core.errors import SandboxError
from durable_harness.sandbox.docker import exec as docker_exec
from durable_harness.sandbox.docker import scripts as sh

if TYPE_CHECKING:
    from durable_harness.sandbox.docker import DockerSandbox

__all__ = ["DetachedJobs", "JobState", "JobStatus"]

JobState = Literal["missing", "starting", "running", "exited", "lost"]
Stream = Literal["stdout", "stderr"]
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    state: JobState
    exit_code: int | None
    stdout_bytes: int
    stderr_bytes: int

    @property
    def finished(self) -> bool:
        """True once nothing more will happen: exited, or lost with its container."""
        return self.state in ("exited", "lost")


def _check_id(job_id: str) -> str:
    if not _JOB_ID.fullmatch(job_id):
        raise SandboxError(f"invalid job id {job_id!r}: use 1-128 letters, digits, '.', '_' or '-'")
    return job_id


class DetachedJobs:
    """The detached jobs of one :class:`~durable_harness.sandbox.docker.DockerSandbox`
    (its ``jobs`` attribute)."""

    def __init__(self, sandbox: DockerSandbox) -> None:
        self.sandbox = sandbox

    def start(
        self,
        job_id: str,
        command: str,
        *,
        workdir: str = sh.WORKSPACE,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        contain: bool = False,
    ) -> bool:
        """Start bash script ``command`` as job ``job_id`` unless that id was started
        before in this session: True if this call started it. ``timeout`` seconds (None:
        none) after which the job is stopped (exit code 124). ``contain``: when the job
        ends, also kill every process started during its life that is not the harness's
        own (setsid children, daemons; other jobs started meanwhile too)."""
        result = self.sandbox.exec(
            sh.JOB_START,
            _check_id(job_id),
            workdir,
            "0" if timeout is None else f"{timeout:g}",
            sh.SUPERVISOR,
            "1" if contain else "0",
            stdin=command.encode(),
            environment=env,
        )
        answer = result.stdout.decode(errors="replace").strip()
        if result.exit_code != 0 or answer not in ("started", "existing"):
            raise result.failure(f"starting job {job_id}")
        return answer == "started"

    def status(self, job_id: str) -> JobStatus:
        result = _checked(
            self.sandbox.exec(sh.JOB_STATUS, _check_id(job_id)), "reading job", job_id
        )
        fields = result.stdout.decode(errors="replace").split()
        if len(fields) != 4:
            raise SandboxError(f"reading job {job_id} failed: {result.said()}")
        state, code, out, err = fields
        return JobStatus(
            job_id,
            state,  # type: ignore[arg-type]  # one of JobState, written by JOB_STATUS
            None if code == "-" else int(code),
            int(out),
            int(err),
        )

    def list(self) -> list[str]:
        """Ids of every job started in this session's volumes."""
        return self.sandbox.exec(sh.JOB_LIST).stdout.decode().split()

    def read_output(self, job_id: str, offset: int = 0, stream: Stream = "stdout") -> bytes:
        """The job's output from byte ``offset`` to what is written now."""
        result = self.sandbox.exec(
            sh.JOB_OUTPUT, _check_id(job_id), stream, str(offset), "now", max_output=1 << 31
        )
        return _checked(result, f"reading the {stream} of job", job_id).stdout

    def follow(
        self,
        job_id: str,
        offset: int = 0,
        stream: Stream = "stdout",
        *,
        timeout: float | None = None,
    ) -> Iterator[bytes]:
        """Yield the job's output from byte ``offset`` as it is written, until the job
        ends (then everything it wrote has been yielded) or ``timeout`` seconds pass.
        Add up the chunks' lengths to know where to resume after a reconnect."""
        if self.status(job_id).state == "missing":
            raise SandboxError(f"no job {job_id} in session {self.sandbox.session_id}")
        deadline = None if timeout is None else time.monotonic() + timeout
        cid = self.sandbox.container_id()
        command = ["bash", "-c", sh.JOB_OUTPUT, "dh", job_id, stream, str(offset), "follow"]
        with self.sandbox._mapped("following a job"):
            chunks = docker_exec.stream(self.sandbox.client.api, cid, command, user="1000:1000")
            try:
                for chunk in chunks:
                    if chunk:
                        yield chunk
                    if deadline is not None and time.monotonic() >= deadline:
                        return
            finally:
                chunks.close()

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 0.2) -> JobStatus:
        """Poll until the job is finished (or ``timeout`` passes); return its status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(job_id)
            if status.finished or status.state == "missing":
                return status
            if deadline is not None and time.monotonic() >= deadline:
                return status
            time.sleep(poll)

    def kill(self, job_id: str, signal: str = "TERM") -> None:
        """Send ``signal`` to the job's whole process group (its supervisor then records
        the exit status, 128 + the signal's number)."""
        if not re.fullmatch(r"[A-Z0-9]+", signal):
            raise SandboxError(f"invalid signal name {signal!r}")
        _checked(self.sandbox.exec(sh.JOB_KILL, _check_id(job_id), signal), "killing job", job_id)

    def stop(self, job_id: str, timeout: float = 30.0) -> JobStatus:
        """Kill the job's process group and wait until its supervisor has written the exit
        status: only then has it also killed what the job started (a contained job kills
        every process started during its life, so a job started before that would die with
        it). SandboxError when it is still running after ``timeout`` seconds."""
        status = self.status(job_id)
        if status.finished or status.state == "missing":
            return status
        self.kill(job_id, "KILL")
        status = self.wait(job_id, timeout)
        if not (status.finished or status.state == "missing"):
            raise SandboxError(
                f"job {job_id} in session {self.sandbox.session_id} was killed but its "
                f"supervisor did not record its end within {timeout:g} s"
            )
        return status


def _checked(result: docker_exec.ExecResult, what: str, job_id: str) -> docker_exec.ExecResult:
    """``result`` when the exec ran its script to exit code 0; SandboxError naming what
    happened otherwise (an exec that never started prints the runtime's error instead of
    the job's output, which must not be taken for it)."""
    if result.exit_code != 0:
        raise result.failure(f"{what} {job_id}")
    return result
