"""A host folder as a :class:`SandboxState` and back, keeping what git keeps: contents, the
executable bit, symbolic links (their targets as written, never followed) and empty
directories. Used to seed a workspace from a checkout and to snapshot host folders.

Only regular files, links and directories are taken; anything else (a socket, a FIFO, a
device) is left out, as git would. Paths are relative, ``/``-separated.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from durable_harness.core.errors import SandboxError
from durable_harness.core.sandbox import SandboxState, check_state_paths

__all__ = ["read_tree", "write_tree"]


def read_tree(
    root: str | os.PathLike[str], cwd: str = "", skip: Iterable[str] = ()
) -> SandboxState:
    """The folder ``root`` as a state (``cwd`` is stored as given). ``skip`` names top-level
    entries to leave out. Nothing is followed out of ``root``: links are read as links."""
    base = os.fspath(root)
    left_out = set(skip)
    files: dict[str, bytes] = {}
    executable: set[str] = set()
    links: dict[str, str] = {}
    dirs: set[str] = set()
    for top, subdirs, names, top_fd in os.fwalk(base, follow_symlinks=False):
        rel_top = os.path.relpath(top, base)
        prefix = "" if rel_top == "." else rel_top.replace(os.sep, "/") + "/"
        if not prefix:
            subdirs[:] = [d for d in subdirs if d not in left_out]
            names = [n for n in names if n not in left_out]
        # fwalk lists links to directories among subdirs: they are links, not folders.
        for name in [*subdirs, *names]:
            info = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
            rel = prefix + name
            if stat.S_ISLNK(info.st_mode):
                links[rel] = os.readlink(name, dir_fd=top_fd)
            elif stat.S_ISREG(info.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=top_fd)
                with os.fdopen(fd, "rb") as handle:
                    files[rel] = handle.read()
                if info.st_mode & stat.S_IXUSR:
                    executable.add(rel)
        subdirs[:] = [
            d
            for d in subdirs
            if stat.S_ISDIR(os.stat(d, dir_fd=top_fd, follow_symlinks=False).st_mode)
        ]
        if prefix and not subdirs and not names:
            dirs.add(prefix.rstrip("/"))
    return SandboxState(
        files=files, cwd=cwd, executable=frozenset(executable), links=links, dirs=frozenset(dirs)
    )


def write_tree(root: str | os.PathLike[str], state: SandboxState) -> None:
    """Write ``state`` into the folder ``root`` (created if missing; what it holds already
    is kept unless overwritten). Paths are checked first, so a bad state writes nothing;
    a link in the way of a path is an error, never followed."""
    check_state_paths(
        {**state.files, **dict.fromkeys(state.links, b""), **dict.fromkeys(state.dirs, b"")}
    )
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)

    def parent_of(rel: str) -> Path:
        parent = base
        for part in rel.split("/")[:-1]:
            parent = parent / part
            if parent.is_symlink():
                raise SandboxError(f"cannot write {rel}: {parent.relative_to(base)} is a link")
            parent.mkdir(exist_ok=True)
        return parent

    for rel in sorted(state.dirs):
        (parent_of(rel) / rel.rsplit("/", 1)[-1]).mkdir(exist_ok=True)
    for rel, data in state.files.items():
        target = parent_of(rel) / rel.rsplit("/", 1)[-1]
        if target.is_symlink():
            target.unlink()
        target.write_bytes(data)
        target.chmod(0o755 if rel in state.executable else 0o644)
    for rel, link in state.links.items():
        target = parent_of(rel) / rel.rsplit("/", 1)[-1]
        if target.is_symlink() or target.is_file():
            target.unlink()
        os.symlink(link, target)
