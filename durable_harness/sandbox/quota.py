"""The workspace quota on a host folder (``DURABLE_HARNESS_MAX_WORKSPACE_BYTES``), without
root and without a filesystem of its own.

Two parts, because neither alone bounds the folder:

* every agent process gets ``RLIMIT_FSIZE`` = the quota, soft and hard
  (:mod:`.become`, before it drops to the agent user, who cannot raise a hard limit): no
  file the agent writes anywhere (the workspace, its HOME, /tmp) grows past the quota, a
  write past it fails (``EFBIG``; ``SIGXFSZ``, "File size limit exceeded", ends a process
  that does not handle it), ``truncate`` past it too, so no sparse giant either (but
  ``fallocate`` with ``FALLOC_FL_KEEP_SIZE`` allocates blocks past it: the limit bounds a
  file's size, not its blocks);
* :class:`WorkspaceWatch` measures the workspace while a command (the local sandbox) or a
  CLI launch (Pi, OpenCode on a host folder) runs and, once it is over the quota and
  bigger than at the last measurement, calls ``stop`` (the caller kills the agent's
  processes, :func:`stop_commands` for a CLI, telling the model why; a command that
  shrinks an oversized folder is left to run).

What it bounds: the workspace to the quota plus what the agent writes between two
measurements (``interval``, stretched to twice a measurement's own duration on a large
folder), once per command or launch (each starts from where the last one left the
folder), measured both as the files' sizes and as their blocks (each inode once); each
single file's size to the quota. What it does not: files outside the workspace (HOME,
/tmp: each file's size is bounded, not their number nor blocks kept with
``fallocate(KEEP_SIZE)``), a write outside any
command (none on a host folder: the agent's processes all run during one), nor the
worker's own disk use.
"""

from __future__ import annotations

import ctypes
import os
import select
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from durable_harness.sandbox.agent_user import children, first_child, kill_below

__all__ = ["WorkspaceWatch", "stop_commands", "tell", "tree_bytes", "tree_usage"]


#: What an inode costs at the least (a folder of a million empty files is not free).
_INODE_BYTES = 512


def tree_usage(root: Path | str) -> tuple[int, int]:
    """What the tree at ``root`` holds, two ways: (the regular files' sizes, every inode's
    allocated blocks, at least :data:`_INODE_BYTES` each). Each inode counts once (a hard
    link adds nothing); nothing is followed out of the tree: ``os.fwalk`` opens each
    folder relative to its parent's descriptor without following symlinks, so a folder
    swapped for a link to ``/`` mid-walk is not entered. Folders another user closed
    count only themselves."""
    seen: set[tuple[int, int]] = set()
    apparent = allocated = 0
    for _, dirs, files, dirfd in os.fwalk(root, follow_symlinks=False):
        for name in (*dirs, *files):
            try:
                info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            allocated += max(info.st_blocks * 512, _INODE_BYTES)
            if stat.S_ISREG(info.st_mode):
                apparent += info.st_size
    return apparent, allocated


def tree_bytes(root: Path | str) -> int:
    """The larger of :func:`tree_usage`'s two measures: what a snapshot of the tree reads
    (a sparse file's size) or what it takes on disk."""
    return max(tree_usage(root))


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
        # A full pipe must not hold the watch; O_NONBLOCK is not set, since it would
        # change the agent's own file for good: write only what the pipe takes now (at
        # most PIPE_BUF bytes: such a write is never partial).
        if not select.select([], [fd], [], 0)[1]:
            return False
        os.write(fd, text.encode()[: select.PIPE_BUF])
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
        self._start = (0, 0)

    def __enter__(self) -> WorkspaceWatch:
        self._start = tree_usage(self.root)
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
            usage = tree_usage(self.root)
            # Growing past the quota, not merely over it: a command that removes files
            # from an oversized folder is left to finish. Each measure on its own, so
            # filling sparse files made earlier (blocks grow, sizes do not) or
            # fallocate(KEEP_SIZE) is stopped as a growth too.
            pairs = zip(usage, last, strict=True)
            grown = [now for now, then in pairs if now > self.quota and now > then]
            if grown:
                self.exceeded = max(grown)
                self._stop()
            last = usage
            # A large folder takes long to measure: measure at most half of the time.
            self._done.wait(max(self.interval, 2 * (time.monotonic() - began)))
