"""Start a host-folder agent's process as the agent user: ``python -I -S become.py <uid>
<gid> <umask> <reap> <fsize> -- <command> [args…]`` (standard library only; ``-`` for uid
and gid keeps the worker's, the operator's unsafe same-user mode; ``fsize`` ``-`` or the
workspace quota in bytes, set as ``RLIMIT_FSIZE``, soft and hard, before the switch, so the
agent cannot raise it: :mod:`.quota`).

With ``reap`` 1 it makes itself a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``, kept
across the exec), so a process the command leaves behind in a session of its own
(``setsid``) is re-parented to the command, not to init, and stays below it, where the
worker finds and kills it (``agent_user.kill_below``; a CLI has adapters/cli/reaper.py
above it for that instead); then it drops every group, the gid and the uid, sets the
umask, and execs the command in its place (same pid). Run by the worker as root: the
worker's own pid, environment and files stay out of the agent user's reach.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    if len(argv) < 7 or argv[5] != "--":
        sys.stderr.write(
            "usage: become.py <uid|-> <gid|-> <umask> <reap> <fsize|-> -- <command> ...\n"
        )
        return 2
    uid, gid, umask, reap = argv[0], argv[1], int(argv[2], 8), argv[3] == "1"
    fsize = None if argv[4] == "-" else int(argv[4])
    command = argv[6:]
    # Found while still the worker: after the switch nothing may be imported (the
    # worker's Python may live where the agent user cannot read, such as /root).
    path = shutil.which(command[0]) or command[0]
    # Not Linux (no prctl): the worker finds the command's processes by their parents only.
    if reap:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if fsize is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    if gid != "-":
        os.setgroups([])
        os.setresgid(int(gid), int(gid), int(gid))
    if uid != "-":
        os.setresuid(int(uid), int(uid), int(uid))
        if os.geteuid() == 0 or os.getuid() == 0:
            return 126  # never run an agent as root by mistake
    os.umask(umask)
    try:
        os.execv(path, command)
    except OSError as exc:
        sys.stderr.write(f"become.py: cannot run {command[0]}: {exc}\n")
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
