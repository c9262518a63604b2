"""Launch mechanics every CLI adapter shares: the host folder, the supervised process.

:func:`run_supervised` runs a CLI under :mod:`.reaper` (so it, and everything it
starts, dies with the worker) in its own session, hands each stdout line to the adapter,
and stops it at once when the journaling proxy reports an error that must end the turn.
It knows nothing of any one CLI: the Pi adapter uses it today; it is the seam a sandbox
launcher (Docker) replaces, and the claude-code adapter's own copy of this loop can move
here.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from durable_harness.adapters import reaper
from durable_harness.adapters.claude_session import LAUNCH_PREFIX
from durable_harness.adapters.proxy import JournalingProxy
from durable_harness.harness.errors import ConfigError
from durable_harness.harness.journal import BLOB_PREFIX, Journal
from durable_harness.worlds.base import Step, World

__all__ = [
    "Finished",
    "host_workspace",
    "launch_steps",
    "progress",
    "run_supervised",
    "stored_input",
]

_STDERR_KEPT = 2000  # characters of the CLI's stderr kept for an error message


@dataclass
class Finished:
    status: int | None  # None when the launch was stopped for a fatal proxy error
    stderr: str


def host_workspace(config: Mapping[str, Any], agent: str) -> Path:
    """The turn's workspace folder (made if missing); ConfigError for the virtual one."""
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
    """A step's stored input text (read from its blob when it was stored as one)."""
    text = step.input or "{}"
    if text.startswith(BLOB_PREFIX):
        return world.get_blob(text.removeprefix(BLOB_PREFIX)).decode()
    return text


def run_supervised(
    command: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    proxy: JournalingProxy,
    on_line: Callable[[bytes], None],
    stdin: bytes | None = None,
) -> Finished:
    """Run ``command`` to its end (or until ``proxy`` fails); raise the proxy's fatal error."""
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", reaper.__file__, str(os.getpid()), "--", *command],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
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
            lines = _read_lines(proc.stdout)
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
        text = stderr.read().decode("utf-8", "replace")[-_STDERR_KEPT:]
    if proxy.fatal is not None:
        raise proxy.fatal
    return Finished(status, text)


def _read_lines(stream: IO[bytes]) -> queue.Queue[bytes | None]:
    lines: queue.Queue[bytes | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name="cli-stdout", daemon=True).start()
    return lines


def progress(text: str) -> None:
    """One progress line under ``run``/``worker`` (stderr, one line, at most 160 chars)."""
    text = text.replace("\n", " ")
    sys.stderr.write(f"  {text[:160]}\n")
    sys.stderr.flush()
