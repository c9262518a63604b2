"""LocalSandbox: confined file tools and one persistent pexpect-driven shell."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_harness.core.errors import SandboxError
from durable_harness.sandbox.local import LocalSandbox


@pytest.fixture
def box(tmp_path: Path) -> Iterator[LocalSandbox]:
    root = tmp_path / "root"
    root.mkdir()
    with LocalSandbox(root, timeout=20) as sandbox:
        assert isinstance(sandbox, LocalSandbox)
        yield sandbox


# -- read / write / edit ---------------------------------------------------------------


def test_write_read_edit(box: LocalSandbox) -> None:
    box.write("src/app.py", "x = 1\ny = 2\n")
    assert (box.root / "src/app.py").read_text() == "x = 1\ny = 2\n"
    assert box.read("src/app.py") == "x = 1\ny = 2\n"
    box.edit("src/app.py", "y = 2", "y = 3")
    assert box.read(str(box.root / "src/app.py")) == "x = 1\ny = 3\n"


def test_edit_refuses_absent_and_duplicate_text(box: LocalSandbox) -> None:
    box.write("a.txt", "x x\n")
    with pytest.raises(SandboxError, match="not found"):
        box.edit("a.txt", "y", "z")
    with pytest.raises(SandboxError, match="occurs 2 times"):
        box.edit("a.txt", "x", "z")
    assert box.read("a.txt") == "x x\n"


def test_missing_file_is_a_sandbox_error(box: LocalSandbox) -> None:
    with pytest.raises(SandboxError, match="no such file"):
        box.read("nope")


@pytest.mark.parametrize("path", ["../outside", "a/../../outside", "/etc/passwd", ""])
def test_escapes_are_refused(box: LocalSandbox, path: str) -> None:
    with pytest.raises(SandboxError):
        box.write(path, "x")
    with pytest.raises(SandboxError):
        box.read(path)
    assert not (box.root.parent / "outside").exists()


def test_symlinks_leading_out_are_refused(box: LocalSandbox, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    (box.root / "link").symlink_to(outside)
    (box.root / "file-link").symlink_to(outside / "secret")
    with pytest.raises(SandboxError, match="outside"):
        box.read("link/secret")
    with pytest.raises(SandboxError, match="outside"):
        box.write("link/new", "x")
    with pytest.raises(SandboxError, match="outside"):
        box.write("file-link", "x")
    assert (outside / "secret").read_text() == "s"
    assert not (outside / "new").exists()


def test_missing_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="does not exist"):
        LocalSandbox(tmp_path / "nope")


# -- the shell -------------------------------------------------------------------------


def test_exit_status_and_output(box: LocalSandbox) -> None:
    result = box.bash("echo hello")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hello\n", "")
    assert box.bash("false").exit_code == 1
    assert box.bash("(exit 42)").exit_code == 42


def test_output_without_trailing_newline_is_exact(box: LocalSandbox) -> None:
    assert box.bash("printf abc").stdout == "abc"
    assert box.bash("printf 'a\\n\\n'").stdout == "a\n\n"
    assert box.bash("true").stdout == ""


def test_output_that_looks_like_a_marker_or_prompt(box: LocalSandbox) -> None:
    text = "__DHE_0000000000000000:0\\n$ \\n# \\n>>> "
    assert box.bash(f"printf '{text}'; echo; echo done").stdout == (
        "__DHE_0000000000000000:0\n$ \n# \n>>> \ndone\n"
    )


def test_stderr_is_merged_into_stdout(box: LocalSandbox) -> None:
    result = box.bash("echo out; echo err >&2")
    assert result.stdout == "out\nerr\n"
    assert result.stderr == ""


def test_cwd_and_environment_persist(box: LocalSandbox) -> None:
    box.bash("mkdir -p sub && cd sub && export GREETING=hi && PLAIN=1")
    result = box.bash('pwd; echo "$GREETING $PLAIN"')
    assert result.stdout == f"{box.root / 'sub'}\nhi 1\n"


def test_multiline_heredoc_and_quotes(box: LocalSandbox) -> None:
    command = "cat > f.txt <<'EOF'\nit's \"quoted\" $HOME\nEOF\ncat f.txt"
    assert box.bash(command).stdout == 'it\'s "quoted" $HOME\n'
    long_line = "echo " + "x" * 10000
    assert box.bash(long_line).stdout == "x" * 10000 + "\n"


def test_syntax_errors_and_stdin_readers_do_not_hang(box: LocalSandbox) -> None:
    assert box.bash("if then", timeout=5).exit_code == 2
    assert box.bash("echo 'unterminated", timeout=5).exit_code == 2
    assert box.bash("cat", timeout=5).exit_code == 0  # stdin is /dev/null
    assert box.bash("echo ok").stdout == "ok\n"


def test_exit_ends_the_shell_and_a_new_one_starts(box: LocalSandbox) -> None:
    box.bash("cd /tmp")
    result = box.bash("echo bye; exit 3")
    assert result.exit_code == 3
    assert "bye" in result.stdout
    assert box.bash("pwd").stdout == f"{box.root}\n"


@pytest.mark.parametrize("command", ["while true; do :; done", "sleep 30"])
def test_timeout_interrupts_and_keeps_the_shell(box: LocalSandbox, command: str) -> None:
    box.bash("mkdir -p w && cd w && export KEPT=yes")
    started = time.monotonic()
    result = box.bash(f"echo started; {command}", timeout=1)
    assert time.monotonic() - started < 3
    assert result.timed_out
    assert result.exit_code == 124
    assert "started" in result.stdout
    assert box.bash("pwd; echo $KEPT").stdout == f"{box.root / 'w'}\nyes\n"


def test_timeout_of_a_command_ignoring_sigint_restarts_the_shell(box: LocalSandbox) -> None:
    started = time.monotonic()
    result = box.bash("trap '' INT; sleep 30", timeout=1)
    assert time.monotonic() - started < 5
    assert result.timed_out
    assert box.bash("echo fresh; pwd").stdout == f"fresh\n{box.root}\n"


def test_close_kills_background_processes(tmp_path: Path) -> None:
    box = LocalSandbox(tmp_path)
    pid = int(box.bash("sleep 300 & echo $!").stdout.split()[-1])
    os.kill(pid, 0)  # running
    box.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("background process survived close()")


def test_default_timeout_comes_from_the_constructor(tmp_path: Path) -> None:
    with LocalSandbox(tmp_path, timeout=0.5) as box:
        assert box.bash("sleep 5").timed_out
