"""LocalSandbox alone: the host folder and one persistent pexpect-driven shell (markers,
restarts, timeouts that need a new shell). (The Sandbox contract: test_contract.py.)"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_harness.core import tree
from durable_harness.core.errors import SandboxError
from durable_harness.core.tree import RACY_SECONDS
from durable_harness.harness.workspace import SnapshotStore, restore_workspace, save_workspace
from durable_harness.sandbox.local import LocalSandbox
from durable_harness.worlds import open_world


@pytest.fixture
def box(tmp_path: Path) -> Iterator[LocalSandbox]:
    root = tmp_path / "root"
    root.mkdir()
    with LocalSandbox(root, timeout=20) as sandbox:
        assert isinstance(sandbox, LocalSandbox)
        yield sandbox


# -- read / write / edit ---------------------------------------------------------------


def test_files_are_the_host_folders(box: LocalSandbox) -> None:
    box.write("src/app.py", "x = 1\ny = 2\n")
    assert (box.root / "src/app.py").read_text() == "x = 1\ny = 2\n"
    (box.root / "src/app.py").write_text("x = 1\ny = 3\n")
    assert box.read(str(box.root / "src/app.py")) == "x = 1\ny = 3\n"


def test_missing_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="does not exist"):
        LocalSandbox(tmp_path / "nope")


# -- the shell -------------------------------------------------------------------------


def test_output_that_looks_like_a_marker_or_prompt(box: LocalSandbox) -> None:
    text = "__DHE_0000000000000000:0\\n$ \\n# \\n>>> "
    assert box.bash(f"printf '{text}'; echo; echo done").stdout == (
        "__DHE_0000000000000000:0\n$ \n# \n>>> \ndone\n"
    )


def test_an_unterminated_quote_does_not_leave_the_shell_waiting(box: LocalSandbox) -> None:
    # (other syntax errors and stdin readers: test_contract.py)
    assert box.bash("echo 'unterminated", timeout=5).exit_code == 2
    assert box.bash("echo ok").stdout == "ok\n"


def test_exit_ends_the_shell_and_a_new_one_starts(box: LocalSandbox) -> None:
    box.bash("cd /tmp")
    result = box.bash("echo bye; exit 3")
    assert result.exit_code == 3
    assert "bye" in result.stdout
    assert box.bash("pwd").stdout == f"{box.root}\n"


def test_timeout_of_a_command_ignoring_sigint_restarts_the_shell(box: LocalSandbox) -> None:
    started = time.monotonic()
    result = box.bash("trap '' INT; sleep 30", timeout=1)
    assert time.monotonic() - started < 5
    assert result.timed_out
    assert box.bash("echo fresh; pwd").stdout == f"fresh\n{box.root}\n"


def test_a_commands_processes_end_with_it(tmp_path: Path) -> None:
    """A background job and a ``setsid`` one (its own session, orphaned) are killed when
    the command that started them ends; the shell goes on."""
    with LocalSandbox(tmp_path) as box:
        out = box.bash("sleep 300 & echo $!; (setsid sleep 301 & echo $!)").stdout
        pids = {int(word) for word in out.split() if word.isdigit()}  # "[1] <pid>" too
        assert len(pids) == 2
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert box.bash("echo still").stdout == "still\n"


def test_close_kills_background_processes(tmp_path: Path) -> None:
    box = LocalSandbox(tmp_path)
    box.bash("true")
    shell = box._child.pid
    box.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(shell, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the shell survived close()")


def test_default_timeout_comes_from_the_constructor(tmp_path: Path) -> None:
    with LocalSandbox(tmp_path, timeout=0.5) as box:
        assert box.bash("sleep 5").timed_out


# -- snapshots -------------------------------------------------------------------------


def test_host_folder_snapshots_mark_outside_and_copy_only_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host folder is snapshotted into the World; its mark lives in the worker's own
    folder (not in the workspace, out of the agent user's reach) and is tied to the
    folder's identity, so a folder made again is restored; an unchanged file is not
    read again, a chmod is seen."""
    root, marks = tmp_path / "root", tmp_path / "marks"
    root.mkdir()
    with open_world("local", data_dir=tmp_path / "world") as world:
        store = SnapshotStore(world)
        with LocalSandbox(root, timeout=20, marks=marks) as box:
            made = box.bash(
                "mkdir -p src .git/refs && printf 'x = 1\\n' > src/a.py && "
                "printf '#!/bin/sh\\necho hi\\n' > run.sh && chmod 755 run.sh && "
                "ln -s src/a.py a.py && for i in $(seq 30); do echo $i > src/f$i; done"
            )
            assert made.exit_code == 0, made.stdout
            digest = save_workspace(box, store)
            assert digest is not None and box.snapshot_mark() == digest
            assert [p.parent for p in marks.iterdir()] == [marks]
            assert not any(digest in p.read_text() for p in root.rglob("*") if p.is_file())
            if os.geteuid() == 0:  # the agent user runs the shell: the marks are not its
                assert box.bash(f"ls {marks}").exit_code != 0
                # The folder's identity: an attribute only root reads or sets.
                assert len(os.getxattr(root, "trusted.durable-harness.folder")) == 32
            time.sleep(RACY_SECONDS * 2)
            box.export_state()  # now every file is cached
            read: list[int] = []
            real_read = tree._read_fd
            monkeypatch.setattr(tree, "_read_fd", lambda fd, n: read.append(n) or real_read(fd, n))
            assert box.bash("chmod 644 run.sh && echo 2 > src/f3").exit_code == 0
            state = box.export_state()
            assert sorted(read) == [2, 18]  # src/f3 and run.sh, nothing else
            assert "run.sh" not in state.executable and state.links == {"a.py": "src/a.py"}
            assert state.dirs == {".git/refs"}
            # Unchanged: kept as it is, with whatever came after the snapshot.
            assert restore_workspace(box, store, digest) is False
            assert box.read("src/f3") == "2\n"
        # The folder is lost and made again (another machine, a wiped disk).
        shutil.rmtree(root)
        root.mkdir()
        with LocalSandbox(root, timeout=20, marks=marks) as fresh:
            assert fresh.snapshot_mark() is None
            assert restore_workspace(fresh, store, digest) is True
            assert fresh.snapshot_mark() == digest
            back = fresh.bash("./run.sh && readlink a.py && cat src/f3 && test -d .git/refs")
            assert back.stdout == "hi\nsrc/a.py\n3\n", back.stdout
