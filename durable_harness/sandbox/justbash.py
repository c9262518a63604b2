"""just-bash, repaired for the virtual sandbox: a capped filesystem and the commands.

Every change InMemoryFs makes goes through its ``path -> entry`` dict, so
:class:`CappedEntries` (that dict, counting as it goes) enforces the caps for writes
from Python and from bash commands alike. A refused write raises :class:`WorkspaceFull`,
an ``ENOSPC`` OSError, so inside a command it fails like a write to a full disk.

:func:`repaired_commands` is just-bash's command registry without ``sqlite3`` and with
``cat``/``xargs`` fixed and every command guarded (see each class for what was wrong).
"""

from __future__ import annotations

import errno
from collections.abc import Coroutine
from typing import Any, TypeVar

from just_bash import ExecResult, InMemoryFs
from just_bash.commands import create_command_registry
from just_bash.fs import DirectoryEntry, FileEntry, SymlinkEntry
from just_bash.interpreter import InterpreterError

from durable_harness.core.errors import SandboxError
from durable_harness.core.sandbox import SandboxState

__all__ = [
    "WORKSPACE",
    "CappedEntries",
    "CappedFs",
    "WorkspaceFull",
    "drive",
    "repaired_commands",
]

WORKSPACE = "/workspace"
# just-bash writes each <(...) to a file named after its output, and never deletes it.
PROCESS_SUBSTITUTION_PREFIX = "/tmp/proc_sub_"

T = TypeVar("T")


class WorkspaceFull(OSError):
    """Raised inside the interpreter when a write would pass a cap (like ENOSPC)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _counts(entry: Any) -> tuple[int, int, int]:
    """(files, directories, bytes) one filesystem entry adds; symlinks count as files."""
    if entry is None:
        return 0, 0, 0
    if entry.type == "directory":
        return 0, 1, 0
    if entry.type == "file":
        return 1, 0, len(entry.content)
    return 1, 0, 0


class CappedEntries(dict[str, Any]):
    """The path -> entry map of an InMemoryFs, refusing entries that would pass a cap.

    InMemoryFs changes its map only with ``d[path] = entry`` and ``del d[path]``, so
    checking here covers every command. Only growth is refused: a write that keeps or
    lowers a count always succeeds, so a full workspace can still be cleaned up.
    """

    def __init__(self, max_files: int, max_bytes: int) -> None:
        super().__init__()
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.files = self.dirs = self.bytes = 0
        self.free_dirs = 0  # the default tree's directories, not counted against the cap
        self.limit_hit: WorkspaceFull | None = None  # first cap hit since it was last cleared

    def __setitem__(self, path: str, entry: Any) -> None:
        new = _counts(entry)
        old = _counts(self.get(path))
        files = self.files + new[0] - old[0]
        dirs = self.dirs + new[1] - old[1]
        size = self.bytes + new[2] - old[2]
        if files > self.max_files and files > self.files:
            self._refuse(
                f"workspace limit: {self.files} files (cap {self.max_files}); "
                "delete files or raise --max-files"
            )
        if dirs - self.free_dirs > self.max_files and dirs > self.dirs:
            self._refuse(
                f"workspace limit: {self.dirs - self.free_dirs} directories "
                f"(cap {self.max_files}); "
                "delete directories or raise --max-files"
            )
        if size > self.max_bytes and size > self.bytes:
            self._refuse(
                f"workspace limit: writing {path} would make the workspace {size:,} bytes "
                f"(cap {self.max_bytes:,}); delete files or raise --max-bytes"
            )
        super().__setitem__(path, entry)
        self.files, self.dirs, self.bytes = files, dirs, size

    def __delitem__(self, path: str) -> None:
        files, dirs, size = _counts(self[path])
        super().__delitem__(path)
        self.files -= files
        self.dirs -= dirs
        self.bytes -= size

    def clear(self) -> None:
        super().clear()
        self.files = self.dirs = self.bytes = 0

    def recount(self) -> None:
        """Recompute the totals (after a command was interrupted by force)."""
        self.files = self.dirs = self.bytes = 0
        for entry in self.values():
            files, dirs, size = _counts(entry)
            self.files += files
            self.dirs += dirs
            self.bytes += size

    def _refuse(self, message: str) -> None:
        error = WorkspaceFull(message)
        if self.limit_hit is None:
            self.limit_hit = error
        raise error


class CappedFs(InMemoryFs):
    """InMemoryFs with caps, ``/workspace``, and writes that follow symlinks.

    just-bash fixes: ``write_file`` used to write at the literal path (so writing
    through a symlinked directory created an unreachable entry, and writing to a path
    under a regular file made a file inside a file); ``mv`` used to copy then delete,
    which counted a moved file twice against the byte cap; ``read_file`` failed on bytes
    that are not UTF-8.
    """

    def __init__(self, max_files: int, max_bytes: int) -> None:
        super().__init__()
        defaults = dict(self._data)
        self._data: CappedEntries = CappedEntries(max_files, max_bytes)
        self._data.free_dirs = len(defaults) + 1  # the default tree and /workspace
        for path, entry in defaults.items():
            self._data[path] = entry
        self._mkdir_sync(WORKSPACE)

    @property
    def entries(self) -> CappedEntries:
        return self._data

    def reset(self, state: SandboxState) -> None:
        """Replace everything with the default tree, ``/workspace`` and ``state``'s files
        (mode 755 if executable, else 644), links (as links: the target is kept as
        written, never resolved here) and empty directories. WorkspaceFull if they pass
        a cap (the filesystem is then partly written: the caller restores it)."""
        self._data.clear()
        self._data["/"] = DirectoryEntry()
        self._create_default_structure()
        self._mkdir_sync(WORKSPACE)
        for rel in sorted(state.dirs):
            self._mkdir_sync(f"{WORKSPACE}/{rel}", recursive=True)
        for rel, content in state.files.items():
            path = f"{WORKSPACE}/{rel}"
            self._ensure_parent_dirs(path)
            mode = 0o755 if rel in state.executable else 0o644
            self._data[path] = FileEntry(content=content, mode=mode)
        for rel, target in state.links.items():
            path = f"{WORKSPACE}/{rel}"
            self._ensure_parent_dirs(path)
            self._data[path] = SymlinkEntry(target=target)

    def forget_process_substitutions(self) -> None:
        """Delete the files just-bash left behind for ``<(...)`` (they would count
        against the caps and pile up in /tmp)."""
        for path in [p for p in self._data if p.startswith(PROCESS_SUBSTITUTION_PREFIX)]:
            del self._data[path]

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Put back entries saved with ``dict(fs.entries)``; entries are never mutated
        in place by InMemoryFs (it replaces them), so a shallow copy is a snapshot."""
        self._data.clear()
        for path, entry in snapshot.items():
            dict.__setitem__(self._data, path, entry)
        self._data.recount()

    def _write_file_sync(self, path: str, content: str | bytes, encoding: str = "utf-8") -> None:
        target = self._resolve_path_with_symlinks(path)
        existing = self._data.get(target)
        if existing is not None and existing.type == "directory":
            raise IsADirectoryError(f"EISDIR: illegal operation on a directory, write '{path}'")
        parent = self._dirname(target)
        while parent != "/":
            entry = self._data.get(parent)
            if entry is not None and entry.type != "directory":
                raise NotADirectoryError(f"ENOTDIR: not a directory, write '{path}'")
            parent = self._dirname(parent)
        if isinstance(content, str):
            content = content.encode(encoding, errors="surrogateescape")
        super()._write_file_sync(target, content, encoding)

    async def read_file(self, path: str, encoding: str = "utf-8") -> str:
        # just-bash decodes strictly, so any command reading a binary file (``cat``,
        # ``< blob``) crashed; undecodable bytes now travel as surrogates and are
        # written back unchanged.
        data: bytes = await self.read_file_bytes(path)
        return data.decode(encoding, errors="surrogateescape")

    async def append_file(self, path: str, content: str | bytes, encoding: str = "utf-8") -> None:
        if isinstance(content, str):
            content = content.encode(encoding, errors="surrogateescape")
        await super().append_file(self._resolve_path_with_symlinks(path), content, encoding)

    async def mv(self, src: str, dest: str) -> None:
        source = self._normalize_path(src)
        target = self._normalize_path(dest)
        if source not in self._data:
            raise FileNotFoundError(f"ENOENT: no such file or directory, mv '{src}'")
        if target == source:
            return
        if target.startswith(source + "/"):
            raise OSError(errno.EINVAL, f"cannot move '{src}' to a subdirectory of itself")
        self._ensure_parent_dirs(target)
        moving = [
            (path, entry)
            for path, entry in self._data.items()
            if path == source or path.startswith(source + "/")
        ]
        # Deleting first means the renamed entries never count twice against a cap.
        for path, _ in moving:
            del self._data[path]
        for path, entry in moving:
            self._data[target + path[len(source) :]] = entry


# just-bash's sqlite3 command opens a real sqlite3 connection, and SQL such as
# ``ATTACH '/tmp/x.db'`` or ``VACUUM INTO`` then reads and writes host files.
UNSAFE_COMMANDS = frozenset({"sqlite3"})


class Guarded:
    """A just-bash command whose crash fails only that command, like a crashed process.

    An exception escaping a just-bash command otherwise aborts the whole script (for
    example ``wc -c`` on a binary file). The interpreter's own control flow and limit
    errors still pass through.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.name: str = inner.name

    async def execute(self, args: list[str], ctx: Any) -> Any:
        try:
            return await self._inner.execute(args, ctx)
        except InterpreterError:
            raise
        except UnicodeError:
            message = "cannot process binary (non-UTF-8) data"
        except Exception as exc:
            message = str(exc) or type(exc).__name__
        return ExecResult(stdout="", stderr=f"{self.name}: {message}\n", exit_code=1)


class Xargs:
    """just-bash's xargs, reading options the way GNU xargs does.

    just-bash silently ignores options written attached (``-I{}``, ``-n1``, ``-d,``), so
    ``xargs -I{} touch f{}`` ran one ``touch`` with every input line as an argument; and
    its ``-I`` splits input on any blank instead of on lines.
    """

    name = "xargs"
    _WITH_VALUE = ("-I", "-n", "-d", "-P")

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def execute(self, args: list[str], ctx: Any) -> Any:
        return await self._inner.execute(self.normalize(args), ctx)

    @classmethod
    def normalize(cls, args: list[str]) -> list[str]:
        options: list[str] = []
        i = 0
        while i < len(args) and args[i].startswith("-") and args[i] != "--":
            arg = args[i]
            if arg in cls._WITH_VALUE and i + 1 < len(args):
                options += [arg, args[i + 1]]
                i += 2
                continue
            if arg[:2] in cls._WITH_VALUE and len(arg) > 2:
                options += [arg[:2], arg[2:]]
            elif arg == "-i":
                options += ["-I", "{}"]
            else:
                options.append(arg)
            i += 1
        if args[i : i + 1] == ["--"]:
            i += 1
        if "-I" in options and "-d" not in options and "-0" not in options:
            options += ["-d", "\n"]
        return options + args[i:]


class Cat:
    """just-bash's cat, except that plain ``cat [FILE|-]...`` copies bytes exactly.

    just-bash's cat works line by line and always ends the output with a newline, so
    ``cat a b > c`` changed files; options (``-n``, ``-A``...) still go to it.
    """

    name = "cat"

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def execute(self, args: list[str], ctx: Any) -> Any:
        names = args[1:] if args[:1] == ["--"] else args
        if any(name.startswith("-") and name != "-" for name in names):
            return await self._inner.execute(args, ctx)
        out: list[str] = []
        errors: list[str] = []
        for name in names or ["-"]:
            if name in ("-", "/dev/stdin"):
                out.append(ctx.stdin)
                continue
            if name == "/dev/null":
                continue
            try:
                out.append(await ctx.fs.read_file(ctx.fs.resolve_path(ctx.cwd, name)))
            except FileNotFoundError:
                errors.append(f"cat: {name}: No such file or directory\n")
            except IsADirectoryError:
                errors.append(f"cat: {name}: Is a directory\n")
        return ExecResult(stdout="".join(out), stderr="".join(errors), exit_code=1 if errors else 0)


def repaired_commands() -> dict[str, Any]:
    """just-bash's command registry with the repairs above, every command guarded."""
    commands = create_command_registry()
    for name in UNSAFE_COMMANDS:
        commands.pop(name, None)
    commands["xargs"] = Xargs(commands["xargs"])
    commands["cat"] = Cat(commands["cat"])
    return {name: Guarded(command) for name, command in commands.items()}


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Finish an InMemoryFs coroutine without an event loop.

    Its async methods never suspend (they are async only to fit just-bash's filesystem
    protocol), so one ``send`` completes them; this keeps ``read``/``write`` usable from
    code that already runs an event loop, where ``asyncio.run`` would fail.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise SandboxError("the virtual filesystem suspended unexpectedly")
