"""Launch mechanics shared by the CLI adapters that run a host process (opencode; the
claude-code adapter has its own copy for now): the workspace folder, the journal's launch
steps, and running the CLI under :mod:`.reaper` while its output lines are read.

Nothing here knows a particular CLI: the adapter builds the command and environment and
interprets the output lines.
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
from typing import IO, Any

from durable_harness.adapters import reaper
from durable_harness.adapters.claude_session import LAUNCH_PREFIX
from durable_harness.adapters.proxy import JournalingProxy
from durable_harness.harness.errors import ConfigError
from durable_harness.harness.journal import BLOB_PREFIX, Journal
from durable_harness.worlds.base import Step, World

__all__ = ["Exit", "host_workspace", "launch_steps", "progress", "stored_input", "supervise"]


def host_workspace(config: dict[str, Any], agent: str) -> Path:
    """The turn's workspace folder (created if missing); ConfigError for the virtual one."""
    spec = str(config.get("workspace", "virtual"))
    if spec == "virtual":
        raise ConfigError(
            f"the {agent} agent runs the real CLI on a host folder: give --workspace DIR "
            "(the virtual workspace cannot host it)"
        )
    path = Path(spec).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"workspace {spec!r} is a file; give a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create workspace {spec!r}: {exc}") from None
    return path.resolve()


def launch_steps(journal: Journal) -> list[Step]:
    """The turn's ``launch:<n>`` steps, oldest first."""
    steps = sorted(journal.recorded.values(), key=lambda s: s.seq)
    return [s for s in steps if s.key.startswith(LAUNCH_PREFIX)]


def stored_input(world: World, step: Step) -> str:
    """A step's stored input (read from the blob store when it was large)."""
    text = step.input or "{}"
    if text.startswith(BLOB_PREFIX):
        return world.get_blob(text.removeprefix(BLOB_PREFIX)).decode()
    return text


@dataclass
class Exit:
    status: int | None  # None: stopped by the harness (the proxy failed the turn)
    stderr: str


def supervise(
    command: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    stdin: bytes | None,
    proxy: JournalingProxy,
    on_line: Callable[[bytes], None],
    name: str = "cli",
) -> Exit:
    """Run ``command`` under the reaper (it and everything it starts die with it and with
    this worker), feed ``on_line`` each stdout line, stop early when the proxy fails the
    turn (its error is then raised)."""
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", reaper.__file__, str(os.getpid()), "--", *command],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
        )
        status: int | None = None
        try:
            assert proc.stdout is not None
            if stdin is not None and proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.write(stdin)
                    proc.stdin.close()
            lines = _read_lines(proc.stdout, name)
            while not proxy.fatal_event.is_set():
                try:
                    line = lines.get(timeout=0.1)
                except queue.Empty:
                    continue
                if line is None:
                    break
                on_line(line)
            status = proc.wait() if not proxy.fatal_event.is_set() else None
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
    if proxy.fatal is not None:
        raise proxy.fatal
    return Exit(status, text)


def _read_lines(stream: IO[bytes], name: str) -> queue.Queue[bytes | None]:
    lines: queue.Queue[bytes | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name=f"{name}-stdout", daemon=True).start()
    return lines


def progress(text: str) -> None:
    """One progress line under ``run``/``worker`` (stderr)."""
    text = text.replace("\n", " ")
    sys.stderr.write(f"  {text[:160]}\n")
    sys.stderr.flush()
