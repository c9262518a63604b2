"""The workspace quota on a host folder (``DURABLE_HARNESS_MAX_WORKSPACE_BYTES``), without
root and without a filesystem of its own.

Two parts, because neither alone bounds the folder:

* every agent process gets ``RLIMIT_FSIZE`` = the quota, soft and hard
  (:mod:`.become`, before it drops to the agent user, who cannot raise a hard limit): no
  file the agent writes anywhere (the workspace, its HOME, /tmp) grows past the quota, a
  write past it fails (``EFBIG``; ``SIGXFSZ``, "File size limit exceeded", ends a process
  that does not handle it), ``truncate`` past it too, so no sparse giant either;
* :class:`WorkspaceWatch` measures the workspace while a command (the local sandbox) or a
  CLI launch (Pi, OpenCode on a host folder) runs and, once it is over the quota and
  bigger than at the last measurement, calls ``stop`` (the caller kills the agent's
  processes, :func:`stop_commands` for a CLI, telling the model why; a command that
  shrinks an oversized folder is left to run).

What it bounds: the workspace to the quota plus what the agent writes between two
measurements (``interval``, stretched to twice a measurement's own duration on a large
folder), once per command or launch (each starts from where the last one left the
folder); each single file to the quota. What it does not: files outside the workspace
in total (HOME, /tmp: each file is bounded, their number is not), a write outside any
command (none on a host folder: the agent's processes all run during one), nor the
worker's own disk use.
"""

from __future__ import annotations

import ctypes
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from durable_harness.sandbox.agent_user import children, first_child, kill_below

__all__ = ["WorkspaceWatch", "stop_commands", "tell", "tree_bytes"]


def tree_bytes(root: Path | str) -> int:
    """Bytes the tree at ``root`` holds: each regular file's size or its allocated blocks,
    whichever is larger; symlinks are not followed, folders another user closed count 0."""
    total = 0
    stack = [str(root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                stack.append(entry.path)
            elif stat.S_ISREG(info.st_mode):
                total += max(info.st_size, info.st_blocks * 512)
    return total


_SYS_PIDFD_GETFD = 438  # the same number on every Linux architecture


def tell(pid: int, text: str) -> bool:
    """Write ``text`` to process ``pid``'s stderr when it is a pipe or socket (a CLI's
    shell tool reads it into the tool's result: how the model learns why its command
    was stopped). The fd is taken from the process itself (``pidfd_getfd``, Linux 5.6),
    so it is written with the access the agent opened it with, never reopened with the
    worker's rights; a file there is not written at all. True if sent."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return False
    try:
        fd = libc.syscall(_SYS_PIDFD_GETFD, pidfd, 2, 0)
    finally:
        os.close(pidfd)
    if fd < 0:
        return False
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return False
        os.set_blocking(fd, False)  # a full pipe must not hold the watch
        os.write(fd, text.encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def stop_commands(reaper: int, reason: str) -> None:
    """Kill every process below the CLI's ``reaper`` but the CLI itself (its running
    commands, what they left behind), first telling the shells the CLI started for its
    tool calls ``reason`` (:func:`tell`), so the CLI and its turn go on and the model
    learns why the command failed."""
    cli = first_child(reaper)
    for shell in children(cli) if cli is not None else []:
        tell(shell, reason)
    kill_below(reaper, spare=cli)


class WorkspaceWatch:
    """While entered, measures ``root`` every ``interval`` seconds; when it holds more
    than ``quota`` bytes and more than at the last measurement (or the start), calls
    ``stop()`` and records the size in :attr:`exceeded`."""

    def __init__(
        self, root: Path | str, quota: int, stop: Callable[[], None], interval: float = 0.05
    ) -> None:
        self.root = root
        self.quota = quota
        self.interval = interval
        self.exceeded: int | None = None
        self._stop = stop
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="workspace-quota", daemon=True)
        self._start = 0

    def __enter__(self) -> WorkspaceWatch:
        self._start = tree_bytes(self.root)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    @property
    def reason(self) -> str:
        """What the model is told when the watch stopped its command."""
        return (
            f"the workspace grew to {self.exceeded} bytes, past its quota of {self.quota} "
            "bytes (the operator's DURABLE_HARNESS_MAX_WORKSPACE_BYTES): the command was "
            "stopped; remove files to make room"
        )

    def _watch(self) -> None:
        last = self._start
        while not self._done.is_set():
            began = time.monotonic()
            size = tree_bytes(self.root)
            # Growing past the quota, not merely over it: a command that removes files
            # from an oversized folder is left to finish.
            if size > self.quota and size > last:
                self.exceeded = size
                self._stop()
            last = size
            # A large folder takes long to measure: measure at most half of the time.
            self._done.wait(max(self.interval, 2 * (time.monotonic() - began)))
