"""Who holds a local World's lease, and whether that process is provably dead.

A claim records its holder as ``<boot id>+<pid namespace>:<pid>:<start time>``: the kernel's
boot id (``/proc/sys/kernel/random/boot_id``, new at every boot) and the inode of this
process's pid namespace (a container sharing the folder has its own pids), the claiming
process's pid and its start time (field 22 of ``/proc/<pid>/stat``, in clock ticks since
boot). Another process of the same host, boot and pid namespace takes a running turn over at
once when that holder is gone: no process with that pid, or one that started at another time
(the pid was reused), or a zombie (it exited; its parent has not reaped it yet). A holder
that is alive in any other state (running, sleeping, stopped by SIGSTOP, traced) keeps its
lease until the lease runs out, as before: only death is proof.

A holder recorded at another boot id is not judged: it is another machine sharing the
folder (or this one before a reboot, whose processes are gone anyway, so its lease runs out
as before). Off Linux (no ``/proc``) nothing is recorded and leases only run out.

Why a turn's enqueuer cannot forge liveness: the holder is written only by ``claim`` from
the claiming process's own ``/proc`` entries, never from anything a turn carries.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@functools.cache
def _boot_id() -> str | None:
    """This host at this boot, and this process's pid namespace: pids are per namespace,
    so a holder in a container sharing the folder (or on the host, seen from one) is not
    judged by a /proc where its pid means another process or none."""
    try:
        boot = BOOT_ID.read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}+{namespace}" if boot else None


def _stat(pid: int) -> tuple[str, int] | None:
    """The state letter and start time of process ``pid``, or None if there is none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:  # ENOENT: no such process (ESRCH-like errors count the same)
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ")": split
    # after the last one.
    fields = raw[raw.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[19])


def this_holder() -> str | None:
    """This process as a lease holder, or None where it cannot be told apart (no /proc)."""
    boot, pid = _boot_id(), os.getpid()
    found = _stat(pid) if boot is not None else None
    if boot is None or found is None:
        return None
    return f"{boot}:{pid}:{found[1]}"


def same_host_prefix() -> str | None:
    """What every holder recorded on this host at this boot starts with (a LIKE pattern)."""
    boot = _boot_id()
    return None if boot is None else f"{boot}:%"


def is_dead(holder: str | None) -> bool:
    """Whether ``holder`` (as :func:`this_holder` wrote it) is provably not running."""
    if holder is None:
        return False
    boot, _, rest = holder.partition(":")
    pid_text, _, start_text = rest.partition(":")
    if boot != _boot_id() or not pid_text.isdigit() or not start_text.isdigit():
        return False  # another host, another boot, or not ours to read: keep the lease
    found = _stat(int(pid_text))
    if found is None:
        return _gone(int(pid_text))
    state, start = found
    return start != int(start_text) or state in ("Z", "X")


def _gone(pid: int) -> bool:
    """No /proc entry: dead, unless the kernel still knows the pid (``/proc`` mounted with
    ``hidepid`` hides other users' processes)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: it exists, as another user's process
        return False
    return False
