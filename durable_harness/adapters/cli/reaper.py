"""Run a CLI so that nothing it starts outlives it, or outlives the worker that ran it.

``python -I -S reaper.py <worker-pid> -- <command> [args…]`` (standard library only, so it
starts in milliseconds). Why a separate process: Claude Code starts each shell of its Bash
tool in a new session (``setsid``), so neither killing the CLI's process group nor its
session reaches a command it left running, and a command that outlives a killed worker
could still write files after a new worker took the turn over. This supervisor:

* makes itself a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): every process the
  CLI starts that is orphaned is re-parented here, not to init, so it stays findable;
* asks for SIGTERM when the worker dies (``PR_SET_PDEATHSIG``; also polls its parent as a
  backstop), so a ``kill -9`` of the worker takes the CLI down at once;
* runs the command in its own session, so a kill aimed at the CLI's process group does not
  hit the supervisor;
* when the command exits, or on SIGTERM/SIGINT/SIGHUP, or when the worker is gone,
  SIGKILLs every descendant (walking ``/proc`` until none is left), then exits with the
  command's status (128 + signal if it was killed).

Off Linux the prctl calls are skipped and the descendants are found through the process
group and session only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_POLL_SECONDS = 0.05


def _prctl(option: int, value: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: fall back to process groups


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (by parent links read from /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ")".
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill_tree(child_pid: int | None) -> None:
    """SIGKILL everything below this process, until nothing is left (bounded)."""
    me = os.getpid()
    if child_pid is not None:
        with contextlib.suppress(OSError):
            os.killpg(child_pid, signal.SIGKILL)  # the CLI's own session, one call
    for _ in range(200):
        pids = descendants(me)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _reap()
        time.sleep(0.01)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: reaper.py <worker-pid> -- <command> [args...]\n")
        return 2
    worker = int(argv[0])
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != worker:  # the worker died before the death signal was armed
        return 137
    stop = {"signal": 0}

    def on_signal(signum: int, frame: object) -> None:
        stop["signal"] = signum

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    child = subprocess.Popen(argv[2:], start_new_session=True)
    status: int | None = None
    while status is None:
        if stop["signal"] or os.getppid() != worker:
            kill_tree(child.pid)
            child.wait()
            return 128 + (stop["signal"] or signal.SIGKILL)
        status = child.poll()
        if status is None:
            time.sleep(_POLL_SECONDS)
    kill_tree(child.pid)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
