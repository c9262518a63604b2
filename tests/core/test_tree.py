"""core/tree.py: a host folder as a state and back, on a folder an agent may be changing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable_harness.core.errors import SandboxError
from durable_harness.core.sandbox import SandboxState
from durable_harness.core.tree import TreeCache, read_tree, write_tree


def test_nothing_is_followed_or_waited_on_either_way(tmp_path: Path) -> None:
    """read_tree takes links as links and skips a FIFO (opening one would block the
    worker); write_tree refuses to write through a link planted where a folder goes
    (nothing lands outside), replaces the folder's contents on request, and sets modes
    whatever the umask; a byte cap stops a read."""
    outside, root = tmp_path / "outside", tmp_path / "root"
    outside.mkdir()
    root.mkdir()
    (root / "src").mkdir()
    (root / "src" / "a.py").write_bytes(b"x = 1\n")
    (root / "up").symlink_to(outside)
    os.mkfifo(root / "pipe")
    state = read_tree(root, cwd="src", cache=TreeCache())
    assert state == SandboxState(
        files={"src/a.py": b"x = 1\n"}, cwd="src", links={"up": str(outside)}
    )

    planted = SandboxState(files={"up/evil": b"!"}, cwd="")
    with pytest.raises(SandboxError, match="is a link"):
        write_tree(root, planted)
    assert list(outside.iterdir()) == []

    old_umask = os.umask(0o077)
    try:
        new = SandboxState(
            files={"run.sh": b"#!/bin/sh\n", "lib/b.py": b"y\n"},
            cwd="",
            executable=frozenset({"run.sh"}),
            links={"lnk": "lib/b.py"},
            dirs=frozenset({"empty"}),
        )
        write_tree(root, new, replace=True)
    finally:
        os.umask(old_umask)
    assert sorted(p.name for p in root.iterdir()) == ["empty", "lib", "lnk", "run.sh"]
    assert (root / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (root / "lib" / "b.py").stat().st_mode & 0o777 == 0o644
    assert read_tree(root) == new
    with pytest.raises(SandboxError, match="more than 5 bytes"):
        read_tree(root, max_bytes=5)


def test_a_sparse_file_over_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A sparse file of terabytes costs the agent no disk: its size is checked first."""
    root = tmp_path / "root"
    root.mkdir()
    with (root / "huge").open("wb") as f:
        f.truncate(4 << 40)  # 4 TiB of nothing
    with pytest.raises(SandboxError, match="more than 1,048,576 bytes"):
        read_tree(root, max_bytes=1 << 20)
