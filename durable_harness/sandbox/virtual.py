"""The virtual sandbox: an in-memory workspace and a bash-compatible interpreter.

Files live in a just-bash ``InMemoryFs`` (see :mod:`.justbash`); commands run in
just-bash's pure-Python interpreter. No host binary ever runs and there is no network:
just-bash only registers ``curl`` when given a fetch function, and we never give one.

Guarantees and how they are kept:

* **Caps.** The number of files (symlinks included), of directories (against the same
  cap) and the total bytes of the whole virtual filesystem (``/tmp`` too) are checked on
  every write, whoever makes it (``write``/``edit`` or a bash command), because every
  mutation goes through one dict (:mod:`.justbash`). A write that would pass
  a cap fails like a full disk (``ENOSPC``) inside the command, so nothing is ever
  silently truncated: the file is either written whole or not at all. ``write``/``edit``
  raise :class:`WorkspaceLimit`; ``bash`` lets the command finish (its writes before the
  limit stay, like on a full disk) and then raises :class:`WorkspaceLimit` whose message
  carries the command's output.
* **Timeouts**, in three layers: (1) the interpreter's own limit checks run before every
  statement and loop iteration; :class:`_DeadlineLimits` makes them fail once the
  deadline passes, which stops shell loops; (2) ``asyncio.wait_for`` cancels commands
  that wait (``sleep``); (3) the command runs in its own thread, and if it is still busy
  in one long Python computation a second after the deadline, an exception is raised
  inside that thread. If even that fails within another second the thread is abandoned
  and the workspace is rolled back to its state before the command. A timed-out command
  returns ``timed_out=True`` and exit code 124. One long step inside C code (building a
  list of 10**8 numbers in ``jq``) holds the GIL and overruns until it ends: nothing in
  the process can interrupt it.
* **Determinism.** ``export_state`` lists files sorted by path; equal workspaces export
  equal states.

just-bash is used with a few repairs, each explained where it is made: ``sqlite3`` is
removed (it reaches host files), ``cat`` copies bytes exactly, ``xargs`` reads attached
options (``-I{}``), a crashing command fails alone instead of aborting the script, and
the filesystem carries non-UTF-8 bytes and writes through symlinks.

What a snapshot keeps: file bytes, the executable bit (``chmod +x`` sets it, as the
interpreter keeps modes), symbolic links as links (the target as written: the interpreter
has links, and resolves them in its own filesystem only, so a link pointing outside the
workspace leads to nothing on the host), empty directories, and the cwd. Not kept: other
mode bits, mtimes and shell variables. A state's links and directories count against
``max_files`` on import like the files (the interpreter's caps count them too).
"""

from __future__ import annotations

import asyncio
import ctypes
import posixpath
import threading
import time
from dataclasses import dataclass
from typing import Any, cast

from just_bash import Bash, ExecutionLimits
from just_bash.interpreter import ExecutionLimitError

from durable_harness.core.errors import SandboxError, WorkspaceLimit
from durable_harness.core.sandbox import (
    Sandbox,
    SandboxState,
    ShellResult,
    cap_timeout,
    check_state_paths,
    noted,
    shell_text,
)
from durable_harness.sandbox.justbash import (
    WORKSPACE,
    CappedFs,
    WorkspaceFull,
    drive,
    repaired_commands,
)

__all__ = ["WORKSPACE", "VirtualSandbox"]

# Seconds a command may overrun its timeout before it is interrupted by force, and again
# before its thread is abandoned.
_GRACE_SECONDS = 1.0
_TIMEOUT_EXIT_CODE = 124  # what GNU timeout returns, so agents recognise it
_OUTPUT_IN_ERROR = 4000  # characters of command output kept in a WorkspaceLimit message


class _DeadlineLimits:
    """Stands in for just-bash's ``ExecutionLimits``; counts read as -1 after the deadline.

    The interpreter compares its counters with these limits before every statement and
    loop iteration, so once the deadline has passed its own check raises
    ``ExecutionLimitError`` wherever the script is, and ``tripped`` records that it was
    the clock, not a real limit.
    """

    max_call_depth = 100

    def __init__(self) -> None:
        self.deadline = float("inf")
        self.tripped = False

    def arm(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.tripped = False

    def disarm(self) -> None:
        self.deadline = float("inf")

    def _limit(self, value: int) -> int:
        if time.monotonic() > self.deadline:
            self.tripped = True
            return -1
        return value

    @property
    def max_command_count(self) -> int:
        return self._limit(10_000_000)

    @property
    def max_loop_iterations(self) -> int:
        return self._limit(1_000_000)

    @property
    def max_awk_iterations(self) -> int:
        return self._limit(1_000_000)

    @property
    def max_sed_iterations(self) -> int:
        return self._limit(1_000_000)


class _ForcedStop(BaseException):
    """Raised inside a command's thread that overran its timeout (not an Exception, so
    the interpreter's ``except Exception`` handlers do not swallow it)."""


@dataclass
class _Run:
    result: Any = None
    error: BaseException | None = None
    abandoned: bool = False


def _state(shell: Any) -> Any:
    """The interpreter state of a just-bash shell. just-bash has no public handle for the
    command counter, functions and cwd that we must reset or carry over (pinned < 0.3)."""
    return shell._interpreter.state


def _raise_in_thread(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    # CPython's documented way to interrupt pure-Python code running in another thread.
    ident = thread.ident
    if ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(ident), ctypes.py_object(exc_type)
        )


class VirtualSandbox(Sandbox):
    """An in-memory workspace rooted at ``/workspace`` with a bash-compatible shell.

    Not thread-safe: make one call at a time. Shell variables, functions and the cwd
    persist between ``bash`` calls as in a terminal; ``exit`` only ends the command.
    """

    journaled = True

    def __init__(
        self,
        max_files: int = 500,
        max_bytes: int = 10 * 1024 * 1024,
        files: dict[str, bytes] | None = None,
    ) -> None:
        if max_files < 1 or max_bytes < 1:
            raise SandboxError("max_files and max_bytes must be positive")
        self._limits = _DeadlineLimits()
        self._fs = CappedFs(max_files, max_bytes)
        self._shell = self._new_shell()
        if files:
            self.import_state(SandboxState(files=files, cwd=WORKSPACE))

    def _new_shell(self) -> Any:
        commands = repaired_commands()
        return Bash(
            fs=self._fs,
            cwd=WORKSPACE,
            env={"HOME": WORKSPACE},
            # Duck-typed: just-bash only reads the max_* attributes of its limits.
            limits=cast(ExecutionLimits, self._limits),
            commands=commands,
            # just-bash otherwise rewrites "&lt;" to "<" in scripts; run what was written.
            unescape_html=False,
        )

    # -- files ---------------------------------------------------------------------

    def _resolve(self, path: str) -> str:
        """The absolute virtual path for ``path``; SandboxError if it leaves the root."""
        if not path or "\x00" in path:
            raise SandboxError(f"invalid path {path!r}")
        joined = path if path.startswith("/") else f"{WORKSPACE}/{path}"
        full = "/" + posixpath.normpath(joined).lstrip("/")
        try:
            real = drive(self._fs.realpath(full))
        except OSError as exc:  # a symlink loop
            raise SandboxError(f"{path}: {exc}") from None
        for candidate in (full, real):
            if candidate != WORKSPACE and not candidate.startswith(WORKSPACE + "/"):
                raise SandboxError(
                    f"path {path!r} is outside the workspace {WORKSPACE}; use a path relative to it"
                )
        return str(full)

    def read(self, path: str) -> str:
        """The file's text; bytes that are not UTF-8 are shown as U+FFFD."""
        return self.read_data(path).decode("utf-8", errors="replace")

    def read_data(self, path: str) -> bytes:
        full = self._resolve(path)
        try:
            data: bytes = drive(self._fs.read_file_bytes(full))
        except FileNotFoundError:
            raise SandboxError(f"read: no such file: {path}") from None
        except IsADirectoryError:
            raise SandboxError(f"read: {path} is a directory") from None
        except OSError as exc:
            raise SandboxError(f"read: {path}: {exc}") from None
        return data

    def write(self, path: str, content: str) -> None:
        """Create or replace the file (and its parent directories) with ``content``."""
        full = self._resolve(path)
        try:
            drive(self._fs.write_file(full, content.encode("utf-8")))
        except WorkspaceFull as exc:
            raise WorkspaceLimit(exc.message) from None
        except OSError as exc:
            raise SandboxError(f"write: {path}: {exc}") from None

    # -- shell ---------------------------------------------------------------------

    def bash(self, command: str, timeout: float = 60.0) -> ShellResult:
        """Run ``command``; WorkspaceLimit if it tried to pass a cap (see module doc)."""
        timeout, note = cap_timeout(timeout)
        if note:
            return noted(self.bash(command, timeout), note)
        before = dict(self._fs.entries)
        self._fs.entries.limit_hit = None
        # just-bash counts commands over the shell's whole life; the limit is per call.
        _state(self._shell).command_count = 0
        self._limits.arm(timeout)
        try:
            run = self._run_in_thread(command, timeout)
        finally:
            self._limits.disarm()
            self._fs.forget_process_substitutions()
        if run.abandoned:
            self._rebuild(before)
            return ShellResult(
                exit_code=_TIMEOUT_EXIT_CODE,
                stdout="",
                stderr=(
                    f"bash: timed out after {timeout:g}s and could not be interrupted; "
                    "the workspace was rolled back to its state before the command\n"
                ),
                timed_out=True,
            )
        result = self._to_shell_result(run, timeout)
        hit = self._fs.entries.limit_hit
        if hit is not None:
            raise WorkspaceLimit(_limit_message(hit.message, result))
        return result

    def _run_in_thread(self, command: str, timeout: float) -> _Run:
        """Run the command in its own thread and event loop.

        A thread of its own lets a stuck command be interrupted (see module doc) and
        keeps just-bash from patching the caller's event loop with nest_asyncio.
        """
        run = _Run()
        shell = self._shell

        async def execute() -> Any:
            return await asyncio.wait_for(shell.exec(command), timeout)

        def target() -> None:
            try:
                run.result = asyncio.run(execute())
            except BaseException as exc:  # carried back to the calling thread
                run.error = exc

        thread = threading.Thread(target=target, name="virtual-bash", daemon=True)
        thread.start()
        thread.join(timeout + _GRACE_SECONDS)
        if thread.is_alive():
            _raise_in_thread(thread, _ForcedStop)
            thread.join(_GRACE_SECONDS)
            run.abandoned = thread.is_alive()
        return run

    def _to_shell_result(self, run: _Run, timeout: float) -> ShellResult:
        error = run.error
        timed_out = isinstance(error, (TimeoutError, _ForcedStop)) or self._limits.tripped
        if error is not None:
            self._reset_transient_state(recount=isinstance(error, _ForcedStop))
        if timed_out:
            stdout = "" if error is not None else _text(run.result.stdout)
            stderr = "" if error is not None else _text(run.result.stderr)
            return ShellResult(
                exit_code=_TIMEOUT_EXIT_CODE,
                stdout=stdout,
                stderr=stderr + f"bash: timed out after {timeout:g}s; the command was stopped\n",
                timed_out=True,
            )
        if isinstance(error, ExecutionLimitError):
            return ShellResult(exit_code=1, stdout="", stderr=f"bash: {error}\n")
        if isinstance(error, WorkspaceFull):
            return ShellResult(exit_code=1, stdout="", stderr=f"bash: {error}\n")
        if error is not None:
            raise SandboxError(f"the virtual shell failed: {error!r}") from error
        return ShellResult(
            exit_code=int(run.result.exit_code),
            stdout=_text(run.result.stdout),
            stderr=_text(run.result.stderr),
        )

    def _reset_transient_state(self, recount: bool) -> None:
        """Undo per-command interpreter state left behind when a command was aborted."""
        state = _state(self._shell)
        state.loop_depth = state.call_depth = state.source_depth = 0
        state.in_condition = False
        state.group_stdin = None
        state.local_scopes = []
        if recount:
            self._fs.entries.recount()

    def _rebuild(self, snapshot: dict[str, Any]) -> None:
        """Start over after abandoning a command's thread: a new filesystem holding the
        snapshot (the old one may still be written by that thread) and a new shell
        keeping cwd, variables and functions."""
        old = _state(self._shell)
        entries = self._fs.entries
        self._fs = CappedFs(entries.max_files, entries.max_bytes)
        self._fs.restore(snapshot)
        self._shell = self._new_shell()
        new = _state(self._shell)
        new.env = old.env.copy()
        new.functions = dict(old.functions)
        new.cwd = old.cwd if drive(self._fs.is_directory(old.cwd)) else WORKSPACE
        new.env["PWD"] = new.cwd

    # -- state ---------------------------------------------------------------------

    def export_state(self) -> SandboxState:
        """Everything under the workspace, sorted: files (relative path -> bytes) with
        their executable bit, links as links, empty directories; and the cwd."""
        files: dict[str, bytes] = {}
        executable: set[str] = set()
        links: dict[str, str] = {}
        folders: list[str] = []
        parents: set[str] = set()
        prefix = WORKSPACE + "/"
        for path in sorted(self._fs.entries):
            if not path.startswith(prefix):
                continue
            entry, rel = self._fs.entries[path], path[len(prefix) :]
            parents.add(posixpath.dirname(rel))
            if entry.type == "directory":
                folders.append(rel)
            elif entry.type == "symlink":
                links[rel] = entry.target
            else:
                files[rel] = entry.content
                if entry.mode & 0o100:
                    executable.add(rel)
        return SandboxState(
            files=files,
            cwd=_state(self._shell).cwd,
            executable=frozenset(executable),
            links=links,
            dirs=frozenset(d for d in folders if d not in parents),
        )

    def import_state(self, state: SandboxState) -> None:
        """Replace the whole filesystem with ``state``; shell variables are kept.

        WorkspaceLimit (and no change) if the state does not fit this sandbox's caps.
        """
        check_state_paths(
            {**state.files, **dict.fromkeys(state.links, b""), **dict.fromkeys(state.dirs, b"")}
        )
        entries = self._fs.entries
        size = sum(len(content) for content in state.files.values())
        count = len(state.files) + len(state.links)
        if count > entries.max_files or len(state.dirs) > entries.max_files:
            raise WorkspaceLimit(
                f"workspace limit: the saved workspace has {count} files and links and "
                f"{len(state.dirs)} empty directories (cap {entries.max_files}); "
                "raise --max-files"
            )
        if size > entries.max_bytes:
            raise WorkspaceLimit(
                f"workspace limit: the saved workspace has {size:,} bytes "
                f"(cap {entries.max_bytes:,}); raise --max-bytes"
            )
        cwd = "/" + posixpath.normpath(state.cwd or WORKSPACE).lstrip("/")
        before = dict(entries)
        try:
            self._fs.reset(state)
        except WorkspaceFull as exc:
            self._fs.restore(before)  # the state's folders passed the cap: no change
            raise WorkspaceLimit(exc.message) from None
        try:
            # A cwd that is not in the state (older snapshots had no empty folders).
            drive(self._fs.mkdir(cwd, recursive=True))
        except OSError:
            cwd = WORKSPACE
        shell_state = _state(self._shell)
        shell_state.cwd = cwd
        shell_state.env["PWD"] = cwd


def _limit_message(limit: str, result: ShellResult) -> str:
    output = (result.stdout + result.stderr)[-_OUTPUT_IN_ERROR:]
    return (
        f"{limit}\n(the command ran on; writes before the limit were kept. "
        f"exit code {result.exit_code}, last output:)\n{output}"
    )


def _text(output: str) -> str:
    """Command output as :class:`ShellResult` holds it: bytes of binary files arrive as
    surrogates already (see :mod:`.justbash`), which is :func:`shell_text`'s form; any other
    lone surrogate (a string the shell made) is U+FFFD."""
    try:
        raw = output.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        return output.encode("utf-8", errors="replace").decode("utf-8")
    return shell_text(raw)
