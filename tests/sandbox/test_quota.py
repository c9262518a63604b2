"""The host-folder quota's parts (sandbox/quota.py) on real files and processes: what
tree_bytes counts, when the watch stops a command, and the reason reaching a CLI's shell."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from durable_harness.sandbox.quota import WorkspaceWatch, tell, tree_bytes, tree_usage

MIB = 1 << 20


def test_tree_bytes_counts_sparse_files_and_skips_symlinks(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * MIB)
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(3 * MIB)  # no blocks, but a snapshot would read 3 MiB
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_bytes(b"y" * 100)
    (tmp_path / "out").symlink_to("/usr")  # never followed
    (tmp_path / "d" / "link").hardlink_to(tmp_path / "a")  # the same inode: once
    # The sizes count the sparse file whole; the blocks count every inode once (at
    # least 512 bytes each: the folder, the link), the sparse file's few.
    apparent, allocated = tree_usage(tmp_path)
    assert apparent == MIB + 3 * MIB + 100
    assert MIB <= allocated <= MIB + 4 * 8192
    assert tree_bytes(tmp_path) == apparent


def test_filling_sparse_files_made_earlier_is_a_growth(tmp_path: Path) -> None:
    """A command makes sparse files over the quota (stopped, the files stay); the next one
    fills them: the sizes do not grow, the blocks do, and that is stopped too."""
    for i in range(4):
        with open(tmp_path / f"f{i}", "wb") as f:
            f.truncate(4 * MIB)
    filler = subprocess.Popen(
        [sys.executable, "-c", "import os, time, sys\n"
         "for i in range(4):\n"
         f"    fd = os.open({str(tmp_path)!r} + f'/f{{i}}', os.O_WRONLY)\n"
         "    for j in range(4):\n"
         f"        os.write(fd, b'x' * {MIB}); time.sleep(0.05)\n"
         "    os.close(fd)\n"
         "time.sleep(30)"],
    )  # fmt: skip
    with WorkspaceWatch(tmp_path, 2 * MIB, filler.kill) as watch:
        assert filler.wait(timeout=30) != 0  # killed by the watch
    assert watch.exceeded is not None and watch.exceeded > 2 * MIB
    assert tree_usage(tmp_path)[1] < 2 * MIB + 16 * MIB


def test_the_watch_stops_growth_past_the_quota_and_leaves_a_shrinking_folder(
    tmp_path: Path,
) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", "import time\nfor i in range(10**6):\n"
         f"    open({str(tmp_path)!r} + f'/f{{i}}', 'wb').write(b'x' * {MIB}); time.sleep(0.05)"],
    )  # fmt: skip
    with WorkspaceWatch(tmp_path, 8 * MIB, writer.kill) as watch:
        assert writer.wait(timeout=30) != 0  # killed by the watch
    assert watch.exceeded is not None and watch.exceeded > 8 * MIB
    assert "DURABLE_HARNESS_MAX_WORKSPACE_BYTES" in watch.reason
    # At 20 MiB/s, what a loaded machine writes between two measurements and the kill.
    assert tree_bytes(tmp_path) < 8 * MIB + 16 * MIB

    stopped: list[int] = []
    with WorkspaceWatch(tmp_path, 8 * MIB, lambda: stopped.append(1)):
        for f in sorted(tmp_path.iterdir())[:4]:  # a cleanup, still over the quota
            f.unlink()
            time.sleep(0.1)
    assert not stopped


def test_tell_writes_only_to_a_pipe_or_socket(tmp_path: Path) -> None:
    reader, writer = os.pipe()
    child = subprocess.Popen(["sleep", "5"], stderr=writer)
    os.close(writer)
    try:
        assert tell(child.pid, "why\n")
        assert os.read(reader, 100) == b"why\n"
    finally:
        child.kill()
        child.wait()
        os.close(reader)
    log = tmp_path / "log"
    with open(log, "wb") as f:
        child = subprocess.Popen(["sleep", "5"], stderr=f)
    try:
        assert not tell(child.pid, "why\n")  # a file: not written
    finally:
        child.kill()
        child.wait()
    assert log.read_bytes() == b""
