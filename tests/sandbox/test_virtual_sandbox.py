"""VirtualSandbox alone: caps, isolation, the interpreter's repairs, stuck commands, state
details. (The Sandbox contract, run on every backend: test_contract.py.)"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from durable_harness.core.errors import SandboxError, WorkspaceLimit
from durable_harness.core.sandbox import SandboxState
from durable_harness.sandbox import virtual
from durable_harness.sandbox.virtual import VirtualSandbox


@pytest.fixture
def box() -> VirtualSandbox:
    return VirtualSandbox()


# -- read / write / edit ---------------------------------------------------------------


# -- caps ------------------------------------------------------------------------------


def test_file_cap_via_write_then_still_usable(box: VirtualSandbox) -> None:
    for i in range(500):
        box.write(f"f{i}", "")
    with pytest.raises(WorkspaceLimit, match=r"500 files \(cap 500\); delete files"):
        box.write("one-more", "")
    with pytest.raises(SandboxError):
        box.read("one-more")
    box.write("f0", "overwriting an existing file is fine")
    assert box.bash("rm f1; echo ok").stdout == "ok\n"
    box.write("now-it-fits", "yes")
    assert box.read("now-it-fits") == "yes"


def test_file_cap_via_bash_xargs(box: VirtualSandbox) -> None:
    with pytest.raises(WorkspaceLimit, match=r"500 files \(cap 500\)"):
        box.bash("seq 1 600 | xargs -I{} touch f{}")
    assert box.bash("ls | wc -l").stdout.strip() == "500"
    assert box.bash("ls f1 f500").exit_code == 0
    # (just-bash's ls prints an empty line for an empty folder, so count with find)
    assert box.bash("rm f*; find . -type f | wc -l").stdout.strip() == "0"
    box.write("after.txt", "usable")
    assert box.read("after.txt") == "usable"


def test_file_cap_via_bash_loop_keeps_output_in_the_error() -> None:
    box = VirtualSandbox(max_files=20)
    with pytest.raises(WorkspaceLimit) as caught:
        box.bash("echo starting; for i in $(seq 1 30); do echo $i > g$i; done")
    assert "20 files (cap 20)" in str(caught.value)
    assert "starting" in str(caught.value)
    assert len(box.export_state().files) == 20


def test_directory_cap_via_bash() -> None:
    box = VirtualSandbox(max_files=30)
    with pytest.raises(WorkspaceLimit, match="directories"):
        box.bash("for i in $(seq 1 40); do mkdir d$i; done")
    assert box.bash("rm -r d*; mkdir fresh && echo ok").stdout == "ok\n"


def test_byte_cap_via_write_leaves_no_truncated_file() -> None:
    box = VirtualSandbox(max_bytes=1000)
    box.write("small", "x" * 600)
    with pytest.raises(WorkspaceLimit, match=r"--max-bytes"):
        box.write("big", "y" * 600)
    with pytest.raises(SandboxError):
        box.read("big")
    box.write("small", "x" * 900)  # replacing counts only the difference
    assert len(box.read("small")) == 900


def test_byte_cap_via_bash_leaves_no_truncated_file(box: VirtualSandbox) -> None:
    with pytest.raises(WorkspaceLimit, match=r"cap 10,485,760"):
        box.bash('printf "%*s" 20000000 "" > big')
    assert box.bash("ls big").exit_code != 0
    assert box.bash("echo fine > f; cat f").stdout == "fine\n"


def test_byte_cap_counts_tmp_too() -> None:
    box = VirtualSandbox(max_bytes=1000)
    with pytest.raises(WorkspaceLimit):
        box.bash('printf "%*s" 5000 "" > /tmp/big')


def test_mv_of_a_large_file_is_not_counted_twice() -> None:
    box = VirtualSandbox(max_bytes=1000)
    box.write("a", "x" * 700)
    assert box.bash("mv a b && wc -c < b").stdout.strip() == "700"
    assert box.export_state().files == {"b": b"x" * 700}


# -- isolation -------------------------------------------------------------------------


def test_no_network(box: VirtualSandbox) -> None:
    for command in ("curl https://example.com", "wget https://example.com"):
        result = box.bash(command)
        assert result.exit_code != 0
        assert "not found" in result.stderr


def test_no_host_binaries(box: VirtualSandbox) -> None:
    for command in ("python3 -c 1", "/bin/ls /", "/usr/bin/env", "git status"):
        assert box.bash(command).exit_code == 127, command
    listing = box.bash("ls /").stdout.split()
    assert listing == ["bin", "home", "tmp", "usr", "workspace"]
    assert box.bash("cat /etc/passwd").exit_code != 0


def test_sqlite3_is_removed_because_it_reaches_host_files(box: VirtualSandbox) -> None:
    result = box.bash("sqlite3 :memory: \"ATTACH '/tmp/escape.db' AS x\"")
    assert result.exit_code == 127


# -- shell behaviour -------------------------------------------------------------------


def test_xargs_reads_attached_options(box: VirtualSandbox) -> None:
    assert box.bash("printf 'a b\\nc\\n' | xargs -I{} echo [{}]").stdout == "[a b]\n[c]\n"
    assert box.bash("echo 1 2 | xargs -n1 echo n").stdout == "n 1\nn 2\n"


def test_process_substitution_files_do_not_pile_up(box: VirtualSandbox) -> None:
    assert box.bash("diff <(echo a) <(echo b) > /dev/null; echo $?").stdout == "1\n"
    assert box.bash("find /tmp -type f").stdout == ""


def test_many_commands_over_a_session(box: VirtualSandbox) -> None:
    # just-bash counts commands over the shell's life; the limit must be per call.
    for _ in range(12):
        assert box.bash("for i in $(seq 1 9000); do :; done; echo ok").stdout == "ok\n"


def test_usable_from_inside_an_event_loop(box: VirtualSandbox) -> None:
    async def inside() -> str:
        box.write("x", "1")
        return box.bash("cat x").stdout + box.read("x")  # no newline added by cat

    assert asyncio.run(inside()) == "11"


# -- timeouts --------------------------------------------------------------------------


class _Spin:
    """A command stuck in Python code, never yielding to the interpreter's checks."""

    name = "spin"

    async def execute(self, args: list[str], ctx: Any) -> Any:
        while True:
            pass


class _Block:
    """A command that writes a file, then blocks in C code where no exception can land."""

    name = "block"

    async def execute(self, args: list[str], ctx: Any) -> Any:
        await ctx.fs.write_file("/workspace/half-done", "x")
        time.sleep(4)


@pytest.fixture
def box_with_stuck_commands(monkeypatch: pytest.MonkeyPatch) -> VirtualSandbox:
    registry = virtual.repaired_commands

    def with_stuck_commands() -> dict[str, Any]:
        return {**registry(), "spin": _Spin(), "block": _Block()}

    monkeypatch.setattr(virtual, "repaired_commands", with_stuck_commands)
    return VirtualSandbox()


def test_timeout_interrupts_a_command_stuck_in_python(
    box_with_stuck_commands: VirtualSandbox,
) -> None:
    box = box_with_stuck_commands
    started = time.monotonic()
    result = box.bash("spin", timeout=0.5)
    assert time.monotonic() - started < 2.5
    assert result.timed_out
    assert box.bash("echo alive").stdout == "alive\n"


def test_timeout_abandons_an_uninterruptible_command_and_rolls_back(
    box_with_stuck_commands: VirtualSandbox,
) -> None:
    box = box_with_stuck_commands
    box.bash("mkdir keep && cd keep && export KEPT=yes")
    started = time.monotonic()
    result = box.bash("block", timeout=0.3)
    assert time.monotonic() - started < 3.5
    assert result.timed_out
    assert "rolled back" in result.stderr
    assert "half-done" not in box.export_state().files
    assert box.bash("pwd; echo $KEPT").stdout == "/workspace/keep\nyes\n"


# -- state -----------------------------------------------------------------------------


def test_files_given_to_the_constructor_are_its_state() -> None:
    # (the round trip through export_state/import_state: test_contract.py)
    files = {"bin/blob": bytes(range(256)), "src/a.py": b"x = 1\n", "empty": b""}
    assert VirtualSandbox(files=files).export_state() == SandboxState(files, "/workspace")


def test_import_replaces_tmp_too(box: VirtualSandbox) -> None:
    box.bash("echo tmp > /tmp/scratch")
    box.import_state(SandboxState(files={"new": b"here"}, cwd="/workspace"))
    assert box.bash("find /tmp -type f").stdout == ""


def test_import_refuses_oversized_states() -> None:
    # (bad paths: test_contract.py)
    small = VirtualSandbox(max_files=2)
    small.write("keep", "1")
    with pytest.raises(WorkspaceLimit):
        small.import_state(SandboxState(files={"a": b"", "b": b"", "c": b""}, cwd="/workspace"))
    assert small.export_state().files == {"keep": b"1"}


def test_simple_command_is_fast(box: VirtualSandbox) -> None:
    box.bash("true")
    started = time.monotonic()
    for _ in range(20):
        box.bash("echo hi")
    assert (time.monotonic() - started) / 20 < 0.05


def test_cat_copies_bytes_exactly_even_binary() -> None:
    box = VirtualSandbox(files={"a": b"no newline", "b": b"\x00\xff\xfe binary"})
    assert box.bash("cat a a").stdout == "no newlineno newline"
    assert box.bash("cat a b > c && cp b d && cat < b > e").exit_code == 0
    files = box.export_state().files
    assert files["c"] == b"no newline\x00\xff\xfe binary"
    assert files["d"] == files["e"] == b"\x00\xff\xfe binary"
    # Output is lossless too: a byte that is not UTF-8 is its surrogateescape surrogate.
    out = box.bash("cat b").stdout
    assert out == "\x00\udcff\udcfe binary"
    assert out.encode("utf-8", "surrogateescape") == b"\x00\xff\xfe binary"
    assert box.bash("cat -n a").stdout == "     1\tno newline\n"


def test_a_crashing_command_fails_alone() -> None:
    box = VirtualSandbox(files={"blob": b"\xff\xfe"})
    result = box.bash("wc -c blob; echo next")
    assert result.stdout.endswith("next\n")
    assert "wc: cannot process binary" in result.stderr
