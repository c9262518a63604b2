"""Running an agent CLI on a host folder: the launch mechanics, apart from any one CLI.

A CLI adapter says *what* to run (command, environment, working folder) and reads the
CLI's output lines; :func:`run_on_host` says *how*: under :mod:`.reaper` (so the CLI and
everything it started die with it, or with the worker), stdin closed, stdout read line by
line, stopped at once when the adapter's ``stop`` event is set (the proxy hit an error
that must end the turn). A Docker launcher is meant to offer the same call.

Running a CLI agent on the host gives it the worker's user rights over the machine: the
agents that must run in Docker refuse it unless a developer opts in with
``DURABLE_HARNESS_UNSAFE_HOST_AGENT=1`` (:func:`require_host_opt_in`).
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from durable_harness.adapters import reaper
from durable_harness.harness.errors import ConfigError

__all__ = ["UNSAFE_HOST_ENV", "Exited", "require_host_opt_in", "run_on_host"]

UNSAFE_HOST_ENV = "DURABLE_HARNESS_UNSAFE_HOST_AGENT"


def require_host_opt_in(agent: str) -> None:
    """ConfigError unless the developer opt-in to run ``agent`` on a host folder is set."""
    if os.environ.get(UNSAFE_HOST_ENV) != "1":
        raise ConfigError(
            f"the {agent} agent runs only inside Docker: use --workspace docker (on a host "
            f"folder it would act with your user's rights; for development only, set "
            f"{UNSAFE_HOST_ENV}=1 to allow it)"
        )


@dataclass
class Exited:
    status: int | None  # None when stopped through ``stop``
    stderr: str  # its last 2,000 characters


def run_on_host(
    command: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    on_line: Callable[[bytes], None],
    stop: threading.Event,
) -> Exited:
    """Run ``command`` under the reaper in ``cwd``; each stdout line goes to ``on_line``."""
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", reaper.__file__, str(os.getpid()), "--", *command],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
        )
        status: int | None = None
        try:
            assert proc.stdout is not None
            lines = _read_lines(proc.stdout)
            while not stop.is_set():
                try:
                    line = lines.get(timeout=0.1)
                except queue.Empty:
                    continue
                if line is None:
                    break
                on_line(line)
            status = proc.wait() if not stop.is_set() else None
        finally:
            if proc.poll() is None:
                proc.terminate()  # the reaper kills the CLI and everything it started
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        stderr.seek(0)
        text = stderr.read().decode("utf-8", "replace")[-2000:]
    return Exited(status, text)


def _read_lines(stream: IO[bytes]) -> queue.Queue[bytes | None]:
    lines: queue.Queue[bytes | None] = queue.Queue()

    def pump() -> None:
        with contextlib.suppress(ValueError, OSError):
            for line in stream:
                lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name="cli-stdout", daemon=True).start()
    return lines
