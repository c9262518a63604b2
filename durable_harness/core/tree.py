"""A host folder as a :class:`SandboxState` and back, keeping what git keeps: contents, the
executable bit, symbolic links (their targets as written, never followed) and empty
directories. Used to seed a workspace from a checkout and to snapshot host folders.

Only regular files, links and directories are taken; anything else (a socket, a FIFO, a
device) is left out, as git would. Paths are relative, ``/``-separated.

The folder may be written by an untrusted agent while the harness reads or writes it, so
both directions go through directory descriptors and never follow a link: a folder
swapped for a link mid-walk, or a file for a FIFO, is not followed or waited on (a FIFO
opened for reading would block the worker forever).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import time
from collections.abc import Iterable, Iterator

from durable_harness.core.errors import SandboxError
from durable_harness.core.sandbox import SandboxState, check_state_paths

__all__ = ["RACY_SECONDS", "TreeCache", "read_tree", "write_tree"]

#: (inode, size, mtime_ns, ctime_ns, mode): a file whose key is unchanged is not read
#: again. ctime catches a write hidden by resetting mtime (``touch -d``) and a chmod.
StatKey = tuple[int, int, int, int, int]

# A file changed within this long before a walk may change again within the same clock
# tick (file times come from the kernel's coarse clock: a few ms) without its key
# changing ("racy git"): it is read again next time, not cached.
RACY_SECONDS = 0.1
_RACY_NS = int(RACY_SECONDS * 1e9)


class TreeCache:
    """What :func:`read_tree` read last time: path -> (stat key, content), so a walk of a
    big, mostly unchanged folder reads only the files that changed since."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[StatKey, bytes]] = {}

    def clear(self) -> None:
        self.entries.clear()


def _key(info: os.stat_result) -> StatKey:
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode)


def _read_fd(fd: int, size: int) -> bytes:
    """Up to ``size`` bytes (the size the key was taken at): a file that grows while it
    is read is cut there, and its changed key has it read again next time."""
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_tree(
    root: str | os.PathLike[str],
    cwd: str = "",
    skip: Iterable[str] = (),
    *,
    cache: TreeCache | None = None,
    max_bytes: int | None = None,
) -> SandboxState:
    """The folder ``root`` as a state, paths sorted (``cwd`` is stored as given). ``skip``
    names top-level entries to leave out. Nothing is followed out of ``root``: links are
    read as links.

    With ``cache``, a file whose (inode, size, mtime, ctime, mode) is what it was at the
    last walk is taken from the cache instead of being read, and the cache is updated.
    SandboxError, as soon as it is known, if the files hold more than ``max_bytes``, and
    for a tree nested deeper than the walk can go (``os.fwalk`` recurses, one descriptor
    per level).
    """
    try:
        return _read_tree(os.fspath(root), cwd, skip, cache, max_bytes)
    except RecursionError:
        raise SandboxError(
            "the workspace is nested too deep to snapshot (hundreds of folders inside one "
            "another): remove the deepest folders"
        ) from None
    except OSError as exc:
        if exc.errno != errno.EMFILE:
            raise
        raise SandboxError(
            "the workspace is nested too deep to snapshot (one open folder per level ran "
            "out of descriptors): remove the deepest folders"
        ) from None


def _read_tree(
    base: str,
    cwd: str,
    skip: Iterable[str],
    cache: TreeCache | None,
    max_bytes: int | None,
) -> SandboxState:
    left_out = set(skip)
    started = time.time_ns()
    old = cache.entries if cache is not None else {}
    fresh: dict[str, tuple[StatKey, bytes]] = {}
    files: dict[str, bytes] = {}
    executable: set[str] = set()
    links: dict[str, str] = {}
    dirs: set[str] = set()
    total = 0
    for top, subdirs, names, top_fd in os.fwalk(base, follow_symlinks=False):
        rel_top = os.path.relpath(top, base)
        prefix = "" if rel_top == "." else rel_top.replace(os.sep, "/") + "/"
        if not prefix:
            subdirs[:] = [d for d in subdirs if d not in left_out]
            names = [n for n in names if n not in left_out]
        kept = False
        real_subdirs: list[str] = []
        # fwalk lists links to directories among subdirs: they are links, not folders.
        for name in [*subdirs, *names]:
            try:
                info = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while the folder was walked
            rel = prefix + name
            if stat.S_ISDIR(info.st_mode):
                real_subdirs.append(name)
            elif stat.S_ISLNK(info.st_mode):
                with contextlib.suppress(FileNotFoundError, OSError):
                    links[rel] = os.readlink(name, dir_fd=top_fd)
                    kept = True
            elif stat.S_ISREG(info.st_mode):
                room = None if max_bytes is None else max_bytes - total
                read = _read_file(top_fd, name, rel, old, room)
                if read is _TOO_BIG:
                    raise _too_big(max_bytes or 0)
                if read is None:
                    continue
                key, data = read
                total += len(data)
                files[rel] = data
                kept = True
                if key[4] & stat.S_IXUSR:
                    executable.add(rel)
                if max(key[2], key[3]) < started - _RACY_NS:
                    fresh[rel] = (key, data)
        subdirs[:] = [d for d in subdirs if d in real_subdirs]
        if prefix and not kept and not subdirs:
            dirs.add(prefix.rstrip("/"))
    if cache is not None:
        cache.entries = fresh
    return SandboxState(
        files={p: files[p] for p in sorted(files)},
        cwd=cwd,
        executable=frozenset(executable),
        links=dict(sorted(links.items())),
        dirs=frozenset(dirs),
    )


#: What :func:`_read_file` gives for a file over the room left.
_TOO_BIG: tuple[StatKey, bytes] = ((0, 0, 0, 0, 0), b"")


def _too_big(max_bytes: int) -> SandboxError:
    return SandboxError(
        f"the workspace holds more than {max_bytes:,} bytes, more than a snapshot may; "
        "remove build outputs or raise max_snapshot_bytes"
    )


def _read_file(
    dir_fd: int,
    name: str,
    rel: str,
    old: dict[str, tuple[StatKey, bytes]],
    room: int | None = None,
) -> tuple[StatKey, bytes] | None:
    """The file's key and content (from ``old`` if its key is unchanged); None if it is
    no longer a regular file (swapped for a link, a FIFO, or removed); :data:`_TOO_BIG`
    when it is bigger than ``room``, checked on its size before a byte is read (a
    sparse file of terabytes costs no disk, and would cost the worker its memory)."""
    try:
        # O_NONBLOCK: a FIFO put in its place opens at once instead of waiting for a writer.
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if room is not None and info.st_size > room:
            return _TOO_BIG
        key = _key(info)
        cached = old.get(rel)
        if cached is not None and cached[0] == key:
            return cached
        return key, _read_fd(fd, info.st_size)
    finally:
        os.close(fd)


class _Dirs:
    """Descriptors of the folders being written, opened without following links; only
    the current path's ancestors stay open (a big tree would exhaust descriptors)."""

    def __init__(self, root_fd: int) -> None:
        self.open: dict[str, int] = {"": root_fd}
        self.owner: tuple[int, int] | None = None

    def fd(self, folder: str) -> int:
        """The descriptor of ``folder`` (relative; created if missing). SandboxError if
        it or a folder above it is a link or a file."""
        if folder in self.open:
            return self.open[folder]
        for path in [p for p in self.open if p and not (folder + "/").startswith(p + "/")]:
            os.close(self.open.pop(path))
        parent, _, name = folder.rpartition("/")
        parent_fd = self.fd(parent)
        made = True
        try:
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            made = False
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise SandboxError(f"cannot write into {folder}: it is a link or a file") from None
            raise
        if made and self.owner is not None:
            os.fchown(fd, *self.owner)
        self.open[folder] = fd
        return fd

    def close(self) -> None:
        for path, fd in list(self.open.items()):
            if path:
                os.close(fd)
        self.open = {"": self.open[""]}


def _clear(dir_fd: int, name: str) -> None:
    """Remove ``name`` unless it is a folder (a link to one is removed, never followed)."""
    with contextlib.suppress(FileNotFoundError):
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            raise SandboxError(f"cannot replace the folder {name!r} with a file or link")
        os.unlink(name, dir_fd=dir_fd)


def _entries(state: SandboxState) -> Iterator[str]:
    yield from sorted({*state.files, *state.links, *state.dirs})


def write_tree(
    root: str | os.PathLike[str],
    state: SandboxState,
    *,
    replace: bool = False,
    owner: tuple[int, int] | None = None,
) -> None:
    """Write ``state`` into the folder ``root`` (created if missing). With ``replace``
    everything else in it is removed first; without, what it holds already is kept unless
    overwritten. Paths are checked first, so a bad state writes nothing; a link in the
    way of a path is an error, never followed. Files get mode 755 if executable, else 644;
    with ``owner`` (uid, gid) every file, link and folder written is given to it (a
    worker running as root restoring an agent user's folder)."""
    check_state_paths(
        {**state.files, **dict.fromkeys(state.links, b""), **dict.fromkeys(state.dirs, b"")}
    )
    os.makedirs(root, exist_ok=True)
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    dirs = _Dirs(root_fd)
    dirs.owner = owner
    try:
        if replace:
            for name in os.listdir(root_fd):
                info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(name, dir_fd=root_fd)  # fd-based: links are not followed
                else:
                    os.unlink(name, dir_fd=root_fd)
        for rel in _entries(state):
            parent, _, name = rel.rpartition("/")
            fd = dirs.fd(parent)
            if rel in state.dirs:
                dirs.fd(rel)
            elif rel in state.links:
                _clear(fd, name)
                os.symlink(state.links[rel], name, dir_fd=fd)
                if owner is not None:
                    os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
            else:
                _clear(fd, name)
                mode = 0o755 if rel in state.executable else 0o644
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                out = os.open(name, flags, mode, dir_fd=fd)
                try:
                    view = memoryview(state.files[rel])
                    while view:
                        view = view[os.write(out, view) :]
                    if owner is not None:
                        os.fchown(out, *owner)
                    os.fchmod(out, mode)  # the umask may have cut bits
                finally:
                    os.close(out)
    finally:
        dirs.close()
        os.close(root_fd)
