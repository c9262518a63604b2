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
"""

from __future__ import annotations

import contextlib
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
from durable_harness.core.sandbox import Sandbox, ShellResult, cap_timeout, noted, shell_text
from durable_harness.core.settings import Settings
from durable_harness.sandbox.agent_user import (
    agent_env,
    agent_user,
    as_agent,
    grant_workspace,
    kill_below,
    private_home,
)
from durable_harness.sandbox.quota import WorkspaceWatch

__all__ = ["LocalSandbox"]

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


class LocalSandbox(Sandbox):
    """A host folder with one persistent shell, started lazily on the first ``bash``.

    ``timeout`` is the default for ``bash`` calls that pass ``timeout=None``.
    """

    journaled = False

    def __init__(self, root: Path, timeout: float = 60.0) -> None:
        root = Path(root).expanduser()
        if not root.is_dir():
            raise SandboxError(f"sandbox folder {root} does not exist or is not a directory")
        self.root = root.resolve()
        self.timeout = timeout
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

    # -- shell ---------------------------------------------------------------------

    def bash(self, command: str, timeout: float | None = None) -> ShellResult:
        """Run ``command`` in the persistent shell (stderr merged into stdout)."""
        limit = self.timeout if timeout is None else timeout
        if limit <= 0:
            raise SandboxError(f"timeout must be positive, got {limit}")
        limit, note = cap_timeout(limit)
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
        child = pexpect.spawn(
            argv[0],
            argv[1:],
            cwd=str(self.root),
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
