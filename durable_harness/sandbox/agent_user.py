"""Who a host-folder agent runs as, and what it is given: the one place every process
started for an agent (the local sandbox's shell, a CLI on a host folder, a CLI's version
check) gets its user, its environment and its HOME.

The worker holds secrets (provider keys, the World's URL and password, cloud
credentials) in its environment and the World's files (every turn's journal and signal
secret) on its disk. An agent on a host folder is untrusted code on the same machine, so
by default it runs as :attr:`AgentUserSettings.agent_user` (``DURABLE_HARNESS_AGENT_USER``,
default ``durable-harness-agent``, made by scripts/setup), an unprivileged account that
cannot read ``/proc/<worker>/environ`` nor the worker's 0700 folders, with an allow-listed
environment (:func:`agent_env`) and a HOME of its own; it is given the workspace folder
through a POSIX ACL (:func:`grant_workspace`), so the folder keeps its owner and the
worker (root) still reads and snapshots whatever the agent writes there. Switching users
needs root: a worker that is not root refuses host folders (:class:`ConfigError`) unless
the operator sets ``DURABLE_HARNESS_UNSAFE_SAME_USER=1`` (the agent then runs with the
worker's uid and can read all of the above; documented as unsafe in docs/).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import shutil
import signal
import stat
import struct
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from durable_harness.core.errors import ConfigError
from durable_harness.core.settings import AgentUserSettings, Settings
from durable_harness.sandbox import become

__all__ = [
    "AgentUser",
    "agent_env",
    "agent_user",
    "as_agent",
    "children",
    "descendants",
    "first_child",
    "grant_workspace",
    "kill_below",
    "private_home",
]

#: The only variables of the worker's environment an agent sees (never a key, a URL with
#: a password, a cloud credential: those are what the allow-list keeps out).
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_UMASK = 0o077  # what the agent creates outside the workspace (its HOME) stays its own


@dataclass(frozen=True)
class AgentUser:
    """The account a host-folder agent runs as (None in this module's signatures: the
    operator's unsafe same-user mode)."""

    name: str
    uid: int
    gid: int


def agent_user() -> AgentUser | None:
    """The agent user of the operator's settings, or None under the unsafe opt-in.
    ConfigError when the worker cannot switch to it (not root) or it does not exist."""
    settings = AgentUserSettings.load()
    if settings.unsafe_same_user:
        return None
    name = settings.agent_user
    fix = (
        "run the worker as root (it starts host-folder agents as that user), or set "
        "DURABLE_HARNESS_UNSAFE_SAME_USER=1 to accept that the agent runs with your uid and "
        "can read the worker's environment (provider keys, the World's URL) and the World's "
        "files; the Docker sandbox (--workspace docker) needs neither"
    )
    if os.geteuid() != 0:
        raise ConfigError(
            f"a host-folder agent runs as the unprivileged user {name!r} "
            f"(DURABLE_HARNESS_AGENT_USER), and this worker is not root: {fix}"
        )
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(
            f"the agent user {name!r} (DURABLE_HARNESS_AGENT_USER) does not exist: create it "
            f"(scripts/setup does, as root: useradd --system --user-group --no-create-home "
            f"--shell /usr/sbin/nologin {name}), or {fix}"
        ) from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise ConfigError(
            f"the agent user {name!r} (DURABLE_HARNESS_AGENT_USER) is root or in group 0: "
            f"give an unprivileged account, or {fix}"
        )
    return AgentUser(name, entry.pw_uid, entry.pw_gid)


def agent_env(
    home: str, user: AgentUser | None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The whole environment of a process started for an agent: :data:`PASSED_ENV` from
    the worker's, the agent's own HOME (and XDG folders under it), user name and shell,
    then ``extra`` (the launch's own: the proxy's URL and token, never a provider key)."""
    env = {name: os.environ[name] for name in PASSED_ENV if name in os.environ}
    env.setdefault("PATH", _DEFAULT_PATH)
    name = user.name if user is not None else pwd.getpwuid(os.geteuid()).pw_name
    env.update(
        {
            "HOME": home,
            "USER": name,
            "LOGNAME": name,
            "SHELL": shutil.which("bash") or "/bin/sh",
            "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_CACHE_HOME": f"{home}/.cache",
            "XDG_STATE_HOME": f"{home}/.local/state",
        }
    )
    env.update(extra or {})
    return env


def as_agent(user: AgentUser | None, argv: list[str], *, reap: bool = False) -> list[str]:
    """``argv`` run as ``user`` (through :mod:`.become`: no groups, the agent's umask, no
    file larger than ``DURABLE_HARNESS_MAX_WORKSPACE_BYTES`` when set; with ``reap`` a
    subreaper, for :func:`kill_below`); under the unsafe same-user mode all but the user."""
    uid, gid = ("-", "-") if user is None else (str(user.uid), str(user.gid))
    quota = Settings.load().max_workspace_bytes
    fsize = "-" if quota is None else str(quota)
    flags = [uid, gid, f"{_UMASK:o}", "1" if reap else "0", fsize]
    return [sys.executable, "-I", "-S", become.__file__, *flags, "--", *argv]


def private_home(user: AgentUser | None, prefix: str) -> str:
    """A new HOME folder (0700) owned by the agent user."""
    home = tempfile.mkdtemp(prefix=prefix)
    if user is not None:
        os.chown(home, user.uid, user.gid)
    return home


def hand_over(user: AgentUser | None, home: str) -> None:
    """Give the agent user everything the worker wrote into ``home`` (before the agent
    runs there: nothing of the agent's can yet be a symlink the worker would follow)."""
    if user is None:
        return
    for folder, dirs, files in os.walk(home):
        for name in (*dirs, *files):
            os.chown(os.path.join(folder, name), user.uid, user.gid, follow_symlinks=False)
    os.chown(home, user.uid, user.gid)


# -- the workspace ---------------------------------------------------------------------

# The Linux xattr form of a POSIX ACL (acl_ea.h): a version word, then tag/perm/id entries.
_ACL_VERSION, _USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 2, 0x01, 0x02, 0x04, 0x10, 0x20
_NO_ID = 0xFFFFFFFF


def _acl(mode: int, uid: int, perm: int) -> bytes:
    entries = [
        (_USER_OBJ, (mode >> 6) & 7, _NO_ID),
        (_USER, perm, uid),
        (_GROUP_OBJ, (mode >> 3) & 7, _NO_ID),
        (_MASK, perm, _NO_ID),
        (_OTHER, mode & 7, _NO_ID),
    ]
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def grant_workspace(user: AgentUser | None, root: Path) -> None:
    """Let the agent user read and write the workspace ``root``: every folder and file in
    it gets an ACL entry for the user (folders a default one too, so what the worker's
    file tools create later is the agent's to change). Symlinks are skipped: one left by
    an earlier turn must not hand the agent a file outside. ConfigError if the user cannot
    reach ``root`` (a folder above it not searchable for it) or the filesystem has no ACLs."""
    if user is None:
        return
    for above in reversed(root.parents):
        info = above.stat()
        bit = (
            stat.S_IXUSR
            if info.st_uid == user.uid
            else stat.S_IXGRP
            if info.st_gid == user.gid
            else stat.S_IXOTH
        )
        if not info.st_mode & bit:
            raise ConfigError(
                f"the agent user {user.name!r} cannot reach the workspace {root}: {above} is "
                f"not searchable for it (mode {stat.S_IMODE(info.st_mode):o}); choose a "
                f"workspace below folders it may pass through (or chmod o+x {above})"
            )
    try:
        # Through descriptors only: the agent's processes may be alive and swapping a
        # folder for a link to /etc between a check and a grant by path (a grant runs as
        # root). fwalk enters a folder only if what it opened is what it listed, and an
        # entry is granted on the descriptor opened with O_NOFOLLOW, after fstat says
        # what it is.
        for _folder, _dirs, files, folder_fd in os.fwalk(root, follow_symlinks=False):
            _grant(folder_fd, user, directory=True)
            for name in files:
                try:
                    fd = os.open(name, _ENTRY_FLAGS, dir_fd=folder_fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOENT, errno.ENXIO):
                        continue  # a link (never followed), or gone since it was listed
                    raise
                try:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        _grant(fd, user, directory=False)
                finally:
                    os.close(fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise ConfigError(
                f"the workspace {root} is on a filesystem without POSIX ACLs, so the agent "
                f"user {user.name!r} cannot be given it: choose a workspace on another "
                "filesystem, or use --workspace docker"
            ) from exc
        raise


#: How an entry is opened to be granted: never through a link, never blocking on a FIFO.
_ENTRY_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY


def _grant(fd: int, user: AgentUser, *, directory: bool) -> None:
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    perm = 7 if directory or mode & 0o111 else 6
    os.setxattr(fd, "system.posix_acl_access", _acl(mode, user.uid, perm))
    if directory:
        os.setxattr(fd, "system.posix_acl_default", _acl(mode | 0o700, user.uid, 7))


# -- process trees ---------------------------------------------------------------------


def _live_stats() -> Iterator[tuple[int, list[bytes]]]:
    """Each live (not zombie) process's pid and the fields of its /proc stat after the
    command name (state, parent, ...: ``fields[1]`` is the parent, ``fields[19]`` the
    start time)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ")".
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[0] != b"Z":
            yield int(entry), fields


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (by parent links read from /proc)."""
    children: dict[int, list[int]] = {}
    for pid, fields in _live_stats():
        children.setdefault(int(fields[1]), []).append(pid)
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill_below(root: int, timeout: float = 5.0, spare: int | None = None) -> None:
    """SIGKILL every process below ``root`` (started through :func:`as_agent`, so a
    ``setsid`` one is below it too) until none is left; ``root`` itself lives on, and so
    does ``spare`` (a CLI below its reaper, whose commands are what is killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [pid for pid in descendants(root) if pid != spare]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``, oldest first (below a reaper: the CLI
    it started, then the orphans re-parented to it)."""
    found = [
        (int(fields[19]), child)  # (start time, pid)
        for child, fields in _live_stats()
        if len(fields) > 19 and int(fields[1]) == pid
    ]
    return [child for _, child in sorted(found)]


def first_child(pid: int) -> int | None:
    """The oldest live child of ``pid`` (:func:`children`), or None."""
    found = children(pid)
    return found[0] if found else None
