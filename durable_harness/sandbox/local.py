"""The local sandbox: a host folder and one persistent bash driven through pexpect.

For users who let an agent act on a folder of their own machine. ``read``/``write``/
``edit`` are confined to the folder (``..`` and symlinks leading out are refused); the
shell is a real host shell, but by default it runs as the unprivileged agent user
(:mod:`.agent_user`: its own uid, HOME and allow-listed environment, the folder given to
it by an ACL), so it cannot read the worker's environment, ``/proc`` or the World's files.
Only the operator's ``DURABLE_HARNESS_UNSAFE_SAME_USER=1`` runs it with the worker's uid.

The shell protocol, per command:

* the command is written to a private file and run with ``eval "$(< file)"`` from a
  short line sent to the shell, so a command of any length, with quotes, heredocs or a
  syntax error, never leaves the shell waiting for more input;
* the line prints a start marker, evals the command with stdin from ``/dev/null`` (a
  command that waits for input fails instead of hanging), then prints a newline, an end
  marker and ``$?``. Markers hold a random token made anew for every command, so output
  that happens to look like a marker or a prompt cannot end a command early, and the
  added newline is removed, so output without a trailing newline comes back exact;
* the shell runs on a pty, so **stderr is merged into stdout** (``ShellResult.stderr`` is
  always empty) and programs see a terminal;
* on timeout the shell's foreground job gets SIGINT (Ctrl-C through the pty); if the shell
  does not answer a fresh marker within two seconds it is killed with its process group
  and restarted in the root folder, losing cwd and variables. ``timed_out=True``, exit
  code 124;
* if the command ends the shell (``exit 3``), its status is returned and a new shell is
  started for the next command;
* when a command ends (or times out) every process it started is killed, a ``setsid`` one
  too: the shell is a child subreaper (:mod:`.become`), so nothing it started can leave
  the tree below it (:func:`.agent_user.kill_below`);
* with ``DURABLE_HARNESS_MAX_WORKSPACE_BYTES`` the folder is watched while a command runs
  (:mod:`.quota`): past the quota the command's processes are killed (the shell
  interrupted if it is what writes) and the result says why, exit code 153.

Snapshots (``snapshots`` is True): the folder is saved to the World at step boundaries
(:func:`~durable_harness.core.tree.read_tree`: files, executable bits, links as links, empty
folders, ``.git`` included), so the session is in the World for ``diff``/``export`` and a
resume on a machine whose folder is missing or stale. A file is read again only when its
(inode, size, mtime, ctime, mode) changed since the last export. An import *replaces* the
folder's contents: a host-folder workspace of a session is the harness's clone, never the
user's own checkout. The snapshot mark is kept outside the folder, in a file of the
worker's own (:func:`mark_dir`) that the agent user can neither read nor write, holding
the digest and the folder's identity (a random id in a ``trusted.*`` extended attribute of
the folder, which only root reads or sets): a folder removed and made again has no mark
and is restored. (With ``DURABLE_HARNESS_UNSAFE_SAME_USER=1`` the agent runs as the worker
and could forge both; that opt-in gives up every such line.)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import tempfile
import termios
import time
from pathlib import Path
from typing import Any

import pexpect

from durable_harness.core.errors import SandboxError
from durable_harness.core.sandbox import (
    Sandbox,
    SandboxState,
    ShellResult,
    cap_timeout,
    noted,
    shell_text,
)
from durable_harness.core.settings import Settings
from durable_harness.core.tree import TreeCache, read_tree, write_tree
from durable_harness.sandbox.agent_user import (
    agent_env,
    agent_user,
    as_agent,
    grant_workspace,
    kill_below,
    private_home,
)
from durable_harness.sandbox.quota import WorkspaceWatch

__all__ = ["LocalSandbox", "mark_dir"]

_TIMEOUT_EXIT_CODE = 124  # what GNU timeout returns, so agents recognise it
_QUOTA_EXIT_CODE = 153  # 128 + SIGXFSZ: what a shell reports for "File size limit exceeded"
_QUOTA_GRACE_SECONDS = 1.0
_RESYNC_SECONDS = 2.0
_START_SECONDS = 10.0

# Settings for a shell that no human reads: no prompts, no pagers or credential prompts
# that would wait on the terminal, no history file.
_SHELL_ENV = {
    "PS1": "",
    "PS2": "",
    "PROMPT_COMMAND": "",
    "TERM": "dumb",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
    "HISTFILE": "/dev/null",
}
# Job control off keeps every child in the shell's process group, so Ctrl-C reaches the
# foreground command and close() can kill everything at once; +H stops "!" expansion.
_SHELL_SETUP = "set +m +H; unset PROMPT_COMMAND"
# The folder's identity for its snapshot mark (see LocalSandbox._folder_id).
_FOLDER_ID = ("trusted." if os.geteuid() == 0 else "user.") + "durable-harness.folder"


def mark_dir() -> Path:
    """Where the worker keeps its host folders' snapshot marks:
    ``$XDG_STATE_HOME/durable-harness/workspace-marks`` (default ``~/.local/state/…``),
    created mode 700: the worker's, out of every workspace."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "durable-harness" / "workspace-marks"


class LocalSandbox(Sandbox):
    """A host folder with one persistent shell, started lazily on the first ``bash``.

    ``timeout`` is the default for ``bash`` calls that pass ``timeout=None``; an export
    of a folder holding more than ``max_snapshot_bytes`` fails (SandboxError); marks are
    kept in ``marks`` (default :func:`mark_dir`).
    """

    journaled = False
    snapshots = True

    def __init__(
        self,
        root: Path,
        timeout: float = 60.0,
        max_snapshot_bytes: int = 1 << 30,
        marks: Path | None = None,
    ) -> None:
        root = Path(root).expanduser()
        if not root.is_dir():
            raise SandboxError(f"sandbox folder {root} does not exist or is not a directory")
        self.root = root.resolve()
        self.timeout = timeout
        self.max_snapshot_bytes = max_snapshot_bytes
        self._marks = Path(marks) if marks is not None else mark_dir()
        self._cache = TreeCache()
        self._start_in = self.root  # the next shell's cwd (import_state sets it)
        self._child: Any = None
        self._user = agent_user()
        grant_workspace(self._user, self.root)
        self._home = private_home(self._user, "durable-harness-agent-home-")
        # The command file is the worker's (the agent could swap a file of its own for a
        # symlink the worker then writes through): a root folder the agent's group may
        # only pass through, a file it may only read.
        self._scratch = Path(tempfile.mkdtemp(prefix="durable-harness-shell-"))
        self._script = self._scratch / "command.sh"
        self._script.touch()
        self._script.chmod(0o640)
        if self._user is not None:
            os.chown(self._scratch, -1, self._user.gid)
            os.chown(self._script, -1, self._user.gid)
            self._scratch.chmod(0o710)

    # -- files ---------------------------------------------------------------------

    def _resolve(self, path: str) -> Path:
        """The real path for ``path`` (relative to the root); SandboxError if it leads
        outside the root, through ``..`` or a symlink."""
        if not path or "\x00" in path:
            raise SandboxError(f"invalid path {path!r}")
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = self.root / candidate
        resolved = candidate.resolve()
        if not resolved.is_relative_to(self.root):
            raise SandboxError(
                f"path {path!r} is outside the sandbox folder {self.root}; "
                "use a path relative to it"
            )
        return resolved

    def read(self, path: str) -> str:
        """The file's text; bytes that are not UTF-8 are shown as U+FFFD."""
        return self.read_data(path).decode("utf-8", errors="replace")

    def read_data(self, path: str) -> bytes:
        full = self._resolve(path)
        try:
            return full.read_bytes()
        except FileNotFoundError:
            raise SandboxError(f"read: no such file: {path}") from None
        except OSError as exc:
            raise SandboxError(f"read: {path}: {exc.strerror or exc}") from None

    def write(self, path: str, content: str) -> None:
        """Create or replace the file (and its parent directories) with ``content``."""
        full = self._resolve(path)
        try:
            full.parent.mkdir(parents=True, exist_ok=True)
            full.write_bytes(content.encode("utf-8"))
        except OSError as exc:
            raise SandboxError(f"write: {path}: {exc.strerror or exc}") from None

    # -- snapshots -----------------------------------------------------------------

    def export_state(self) -> SandboxState:
        """The folder as it is, and the shell's cwd *relative to the folder* ("" for the
        folder itself; the folder's path differs between machines), or the folder the
        next shell starts in while none runs. SandboxError past ``max_snapshot_bytes``."""
        where = self._start_in
        if self._child is not None and self._child.isalive():
            with contextlib.suppress(OSError):
                # The shell exec'd in become.py's place: its pid is the shell's.
                where = Path(os.readlink(f"/proc/{self._child.pid}/cwd"))
        cwd = where.relative_to(self.root).as_posix() if where.is_relative_to(self.root) else ""
        return read_tree(
            self.root,
            cwd="" if cwd == "." else cwd,
            cache=self._cache,
            max_bytes=self.max_snapshot_bytes,
        )

    def import_state(self, state: SandboxState) -> None:
        """Replace the folder's contents with ``state`` (nothing is followed out of it;
        everything is made the agent user's, so it may chmod and remove what it finds),
        and start the next shell in ``state.cwd`` (relative to the folder, or absolute in
        it; anything else: the folder)."""
        self._stop()
        owner = None if self._user is None else (self._user.uid, self._user.gid)
        write_tree(self.root, state, replace=True, owner=owner)
        self._cache.clear()
        grant_workspace(self._user, self.root)
        real = (self.root / state.cwd).resolve()
        inside = real.is_relative_to(self.root) and real.is_dir()
        self._start_in = real if inside else self.root

    def _mark_file(self) -> Path:
        return self._marks / (hashlib.sha256(str(self.root).encode()).hexdigest()[:32] + ".json")

    def _folder_id(self, create: bool) -> str:
        """The folder's identity: a random id the worker keeps in an extended attribute of
        the folder (``trusted.*`` when it runs as root: the agent user can neither read
        nor set it), made on the first mark; a folder removed and made again has none,
        even where its inode number is reused. Where extended attributes cannot be set,
        the folder's (device, inode) stands in."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            try:
                return os.getxattr(fd, _FOLDER_ID).decode()
            except OSError:
                if not create:
                    info = os.fstat(fd)
                    return f"{info.st_dev}:{info.st_ino}"
            folder_id = secrets.token_hex(16)
            try:
                os.setxattr(fd, _FOLDER_ID, folder_id.encode())
            except OSError:
                info = os.fstat(fd)
                return f"{info.st_dev}:{info.st_ino}"
            return folder_id
        finally:
            os.close(fd)

    def snapshot_mark(self) -> str | None:
        try:
            mark = json.loads(self._mark_file().read_text())
            folder_id = self._folder_id(create=False)
        except (OSError, ValueError):
            return None
        if not isinstance(mark, dict) or mark.get("folder") != folder_id:
            return None  # another folder at this path: it holds no snapshot we know of
        digest = mark.get("digest")
        return digest if isinstance(digest, str) else None

    def set_snapshot_mark(self, digest: str | None) -> None:
        path = self._mark_file()
        if digest is None:
            path.unlink(missing_ok=True)
            return
        self._marks.mkdir(mode=0o700, parents=True, exist_ok=True)
        record = {"root": str(self.root), "folder": self._folder_id(create=True)}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**record, "digest": digest}))
        os.replace(tmp, path)

    # -- shell ---------------------------------------------------------------------

    def bash(self, command: str, timeout: float | None = None) -> ShellResult:
        """Run ``command`` in the persistent shell (stderr merged into stdout)."""
        limit, note = cap_timeout(self.timeout if timeout is None else timeout)
        if note:
            return noted(self.bash(command, limit), note)
        child = self._shell()
        self._script.write_bytes(command.encode("utf-8"))
        token = secrets.token_hex(8)
        # The markers are printed from two halves so that the line itself, should a
        # command turn terminal echo back on, never contains them.
        child.sendline(
            f"printf '%s_%s\\n' __DHS {token}; "
            f'eval "$(< {shlex.quote(str(self._script))})" < /dev/null; '
            f"printf '\\n%s_%s:%d\\n' __DHE {token} $?"
        )
        start = re.compile(rb"__DHS_" + token.encode() + rb"\r?\n")
        end = re.compile(rb"\n__DHE_" + token.encode() + rb":(\d+)\r?\n")
        deadline = time.monotonic() + limit
        with self._watch(child.pid) as watch:
            try:
                child.expect(start, timeout=limit)
                self._expect_end(child, end, deadline, watch)
            except _OverQuota:
                partial = _text(child.before)
                self._interrupt()  # a loop of the shell's own builtins outlives kill_below
                self._end_command()
                note = f"bash: {watch.reason if watch else ''}\n"
                return ShellResult(_QUOTA_EXIT_CODE, partial + note, "")
            except pexpect.TIMEOUT:
                partial = _text(child.before)
                self._interrupt()
                self._end_command()
                note = f"bash: timed out after {limit:g}s; the command was stopped\n"
                return ShellResult(_TIMEOUT_EXIT_CODE, partial + note, "", timed_out=True)
            except pexpect.EOF:
                output = _text(child.before)
                status = _exit_status(child)
                self._stop()
                return ShellResult(status, _strip_start(output, token), "")
        self._end_command()
        output = _text(child.before)
        if watch is not None and watch.exceeded is not None:
            output += f"\nbash: {watch.reason}\n"
        return ShellResult(int(child.match.group(1)), output, "")

    def _watch(self, shell: int) -> contextlib.AbstractContextManager[WorkspaceWatch | None]:
        """The quota's watch over this command (:mod:`.quota`): past the quota, every
        process below the shell is killed."""
        quota = Settings.load().max_workspace_bytes
        if quota is None:
            return contextlib.nullcontext()
        return WorkspaceWatch(self.root, quota, lambda: kill_below(shell))

    @staticmethod
    def _expect_end(
        child: Any, end: re.Pattern[bytes], deadline: float, watch: WorkspaceWatch | None
    ) -> None:
        """Wait for the end marker until ``deadline`` (pexpect.TIMEOUT); _OverQuota when
        the watch stopped the command and the shell has not ended it within a second
        (the shell itself may be what writes)."""
        stopped_at: float | None = None
        while True:
            now = time.monotonic()
            if watch is not None and watch.exceeded is not None:
                stopped_at = stopped_at or now
                if now - stopped_at > _QUOTA_GRACE_SECONDS:
                    raise _OverQuota
            try:
                child.expect(end, timeout=max(min(deadline - now, 0.2), 0.0))
                return
            except pexpect.TIMEOUT:
                if time.monotonic() >= deadline:
                    raise

    def _end_command(self) -> None:
        """Kill what the command left running (background jobs, ``setsid`` children)."""
        if self._child is not None:
            kill_below(self._child.pid)

    def _shell(self) -> Any:
        if self._child is not None:
            if self._child.isalive():
                return self._child
            self._stop()
        argv = as_agent(self._user, ["bash", "--noprofile", "--norc", "--noediting"], reap=True)
        start_in, self._start_in = self._start_in, self.root
        child = pexpect.spawn(
            argv[0],
            argv[1:],
            cwd=str(start_in),
            env=agent_env(self._home, self._user, _SHELL_ENV),
            echo=False,
            dimensions=(40, 250),
            maxread=65536,
        )
        child.delaybeforesend = None  # pexpect's default 50 ms pause per line is for humans
        # Newlines arrive as "\n", not the terminal's "\r\n".
        attrs = termios.tcgetattr(child.child_fd)
        attrs[1] &= ~termios.ONLCR
        termios.tcsetattr(child.child_fd, termios.TCSANOW, attrs)
        self._child = child
        if not self._sync(_START_SECONDS, _SHELL_SETUP):
            self._stop()
            raise SandboxError("could not start bash in the local sandbox")
        return child

    def _sync(self, timeout: float, prefix: str = ":") -> bool:
        """Send a fresh marker and wait for it: True once the shell reads commands again."""
        token = secrets.token_hex(8)
        self._child.sendline(f"{prefix}; printf '%s_%s\\n' __DHR {token}")
        try:
            self._child.expect_exact(f"__DHR_{token}".encode(), timeout=timeout)
        except (pexpect.TIMEOUT, pexpect.EOF):
            return False
        return True

    def _interrupt(self) -> None:
        """Stop the running command: Ctrl-C, then kill and forget the shell if need be."""
        try:
            self._child.sendintr()
            if self._sync(_RESYNC_SECONDS):
                return
        except OSError:
            pass
        self._stop()

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        child.close(force=True)

    def close(self) -> None:
        """Kill the shell and every process below it; remove the command file and HOME."""
        if self._child is not None:
            kill_below(self._child.pid)
        self._stop()
        shutil.rmtree(self._scratch, ignore_errors=True)
        shutil.rmtree(self._home, ignore_errors=True)


class _OverQuota(Exception):
    """The quota's watch stopped the command (:meth:`LocalSandbox._expect_end`)."""


def _text(data: Any) -> str:
    if not isinstance(data, bytes):
        return ""
    return shell_text(data)


def _strip_start(output: str, token: str) -> str:
    """Output after the start marker, for a command that ended the shell."""
    match = re.search(f"__DHS_{token}\r?\n", output)
    return output[match.end() :] if match else output


def _exit_status(child: Any) -> int:
    child.close(force=True)
    if child.exitstatus is not None:
        return int(child.exitstatus)
    if child.signalstatus is not None:
        return 128 + int(child.signalstatus)
    return 1
