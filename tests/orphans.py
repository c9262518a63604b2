"""Servers a test process starts die with it, however it ends.

atexit handlers and fixture teardown do not run when a pytest process is killed (a CI
timeout, an xdist worker torn down by Ctrl-C, SIGKILL); :func:`die_with_parent`, given as
``preexec_fn``, asks the kernel to signal the server when the process that started it is
gone (``PR_SET_PDEATHSIG``, kept across ``exec``).
"""

from __future__ import annotations

import ctypes
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` that has the child get ``sig`` when its parent dies."""

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return preexec
