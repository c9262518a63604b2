"""The Sandbox contract (``durable_harness/core/sandbox.py``), run against every backend.

Nothing here may depend on one backend: virtual, local and docker run this file unchanged
(see ``conftest.py``). Where a backend legitimately differs (a pty merges stderr, a fresh
bash per command keeps only exported variables, the virtual shell has no host programs)
the test reads the difference from the backend's ``Capabilities`` and checks the
backend's own behaviour there. What only one backend does is tested in its own file.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

import pytest

from durable_harness.core.errors import ConfigError, SandboxError
from durable_harness.core.sandbox import Sandbox, SandboxState, ShellResult

if TYPE_CHECKING:
    from conftest import SandboxSpec

#: Paths that name something outside the workspace (or nothing at all).
ESCAPES = (
    "../x",
    "../outside",
    "../etc/passwd",
    "a/../../x",
    "a/../../outside",
    "/etc/passwd",
    "/workspace/../tmp/x",
    "/tmp/x",
    "",
    "a\x00b",
)
#: Commands that never end by themselves.
RUNAWAY = ("while true; do :; done", "sleep 30", "f() { while :; do :; done; }; f")


# -- files -------------------------------------------------------------------------------
def test_write_read_edit_and_bash_see_the_same_files(
    sandbox_spec: SandboxSpec, sandbox: Sandbox
) -> None:
    root = sandbox_spec.root(sandbox)
    sandbox.write("src/app.py", "print('héllo')\n")
    assert sandbox.read("src/app.py") == "print('héllo')\n"
    assert sandbox.read(f"{root}/src/app.py") == "print('héllo')\n"
    result = sandbox.bash("cat src/app.py; pwd")
    assert result.exit_code == 0
    assert result.stdout == f"print('héllo')\n{root}\n"
    sandbox.bash("echo made-by-bash > out.txt")
    assert sandbox.read("out.txt") == "made-by-bash\n"
    sandbox.edit("src/app.py", "héllo", "world")
    assert sandbox.read(f"{root}/src/app.py") == "print('world')\n"
    assert sandbox.bash("cat src/app.py").stdout == "print('world')\n"


def test_list_and_delete(sandbox: Sandbox) -> None:
    for name in ("b.txt", "a.txt", "dir/c.txt"):
        sandbox.write(name, name)
    assert sandbox.bash("ls").stdout.split() == ["a.txt", "b.txt", "dir"]
    assert sandbox.bash("find . -type f | sort").stdout == "./a.txt\n./b.txt\n./dir/c.txt\n"
    assert sandbox.bash("rm b.txt && rm -r dir").exit_code == 0
    for gone in ("b.txt", "dir/c.txt"):
        with pytest.raises(SandboxError, match="no such file"):
            sandbox.read(gone)
    assert sandbox.bash("ls").stdout.split() == ["a.txt"]
    assert sandbox.read("a.txt") == "a.txt"


def test_edit_replaces_the_single_occurrence(sandbox: Sandbox) -> None:
    sandbox.write("a.txt", "one two three\n")
    sandbox.edit("a.txt", "two", "2")
    assert sandbox.read("a.txt") == "one 2 three\n"


def test_edit_refuses_absent_duplicate_and_empty_text(sandbox: Sandbox) -> None:
    sandbox.write("a.txt", "x x\n")
    with pytest.raises(SandboxError, match="not found"):
        sandbox.edit("a.txt", "y", "z")
    with pytest.raises(SandboxError, match="occurs 2 times"):
        sandbox.edit("a.txt", "x", "z")
    with pytest.raises(SandboxError, match="empty"):
        sandbox.edit("a.txt", "", "z")
    with pytest.raises(SandboxError, match="no such file"):
        sandbox.edit("missing.txt", "x", "z")
    assert sandbox.read("a.txt") == "x x\n"


def test_missing_files_and_directories_are_sandbox_errors(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxError, match="no such file"):
        sandbox.read("nope.txt")
    sandbox.write("d/f.txt", "")
    assert sandbox.read("d/f.txt") == ""
    with pytest.raises(SandboxError, match="directory"):
        sandbox.read("d")
    with pytest.raises(SandboxError):
        sandbox.write("d", "over a directory")
    with pytest.raises(SandboxError):
        sandbox.write("d/f.txt/inside", "a file inside a file")
    assert sandbox.read("d/f.txt") == ""


def test_paths_leaving_the_workspace_are_refused(sandbox: Sandbox) -> None:
    for path in ESCAPES:
        says = "invalid path" if path in ("", "a\x00b") else "outside"
        with pytest.raises(SandboxError, match=says):
            sandbox.write(path, "x")
        with pytest.raises(SandboxError, match=says):
            sandbox.read(path)
    assert sandbox.bash("test -e ../outside || test -e ../x").exit_code == 1


def test_paths_staying_inside_are_accepted(sandbox_spec: SandboxSpec, sandbox: Sandbox) -> None:
    sandbox.write("sub/../a.txt", "1")
    assert sandbox.read(f"{sandbox_spec.root(sandbox)}/a.txt") == "1"
    assert sandbox.read("sub/../a.txt") == "1"


def test_symlinks_leading_out_are_refused(sandbox: Sandbox) -> None:
    secret = f"/tmp/dh-contract-{uuid.uuid4().hex[:8]}"
    made = sandbox.bash(f"echo s > {secret} && ln -s /tmp out && ln -s {secret} file-link")
    assert made.exit_code == 0
    try:
        with pytest.raises(SandboxError, match="outside"):
            sandbox.read(f"out/{secret.rsplit('/', 1)[1]}")
        with pytest.raises(SandboxError, match="outside"):
            sandbox.read("file-link")
        with pytest.raises(SandboxError, match="outside"):
            sandbox.write("out/new", "x")
        with pytest.raises(SandboxError, match="outside"):
            sandbox.write("file-link", "x")
        assert sandbox.bash(f"cat {secret}; test -e /tmp/new || echo absent").stdout == (
            "s\nabsent\n"
        )
    finally:
        sandbox.bash(f"rm -f {secret}")  # local: the host's /tmp


# -- the shell ---------------------------------------------------------------------------
def test_exit_status_and_output(sandbox_spec: SandboxSpec, sandbox: Sandbox) -> None:
    caps = sandbox_spec.caps
    result = sandbox.bash("echo out; echo err >&2; exit 3")
    if caps.separate_stderr:
        assert (result.stdout, result.stderr) == ("out\n" + caps.exit_echo, "err\n")
    else:
        assert (result.stdout, result.stderr) == ("out\nerr\n" + caps.exit_echo, "")
    assert result.exit_code == 3 and not result.timed_out
    result = sandbox.bash("echo out; echo err >&2")
    streams = ("out\n", "err\n") if caps.separate_stderr else ("out\nerr\n", "")
    assert (result.exit_code, result.stdout, result.stderr) == (0, *streams)
    assert sandbox.bash("echo still here") == ShellResult(0, "still here\n", "")
    assert sandbox.bash("false").exit_code == 1
    assert sandbox.bash("(exit 42)").exit_code == 42
    assert sandbox.bash("printf abc").stdout == "abc"  # no newline added
    assert sandbox.bash("printf 'a\\n\\n'").stdout == "a\n\n"
    assert sandbox.bash("true") == ShellResult(0, "", "")


def test_quotes_heredocs_long_lines_and_syntax_errors(sandbox: Sandbox) -> None:
    command = "cat > f.txt <<'EOF'\nit's \"quoted\" $HOME\nEOF\ncat f.txt"
    assert sandbox.bash(command).stdout == 'it\'s "quoted" $HOME\n'
    assert sandbox.bash("echo " + "x" * 10000).stdout == "x" * 10000 + "\n"
    assert sandbox.bash("echo '&lt;b&gt;'").stdout == "&lt;b&gt;\n"
    assert sandbox.bash("if then", timeout=5).exit_code == 2
    assert sandbox.bash("cat", timeout=5).exit_code == 0  # stdin is empty: no hang
    assert sandbox.bash("echo ok").stdout == "ok\n"


def test_cwd_and_exported_env_carry_across_commands(
    sandbox_spec: SandboxSpec, sandbox: Sandbox
) -> None:
    root = sandbox_spec.root(sandbox)
    sandbox.bash("mkdir -p sub/deeper && cd sub && export GREETING=hi && PLAIN=1")
    plain = "1" if sandbox_spec.caps.persistent_shell else ""
    assert sandbox.bash('pwd; echo "$GREETING $PLAIN"').stdout == f"{root}/sub\nhi {plain}\n"
    sandbox.bash("cd deeper && export GREETING=again")
    assert sandbox.bash('pwd; echo "$GREETING"').stdout == f"{root}/sub/deeper\nagain\n"
    sandbox.bash("echo here > mine.txt")  # relative to the shell's cwd, not the root
    assert sandbox.read("sub/deeper/mine.txt") == "here\n"


def test_a_hung_command_times_out_and_the_shell_keeps_its_state(
    sandbox_spec: SandboxSpec, sandbox: Sandbox
) -> None:
    root = sandbox_spec.root(sandbox)
    sandbox.bash("mkdir -p w && cd w && export KEPT=yes")
    for command in RUNAWAY:
        started = time.monotonic()
        result = sandbox.bash(f"echo started; {command}", timeout=1)
        assert time.monotonic() - started < 3, command
        assert result.timed_out and result.exit_code == 124, (command, result)
        assert "timed out after 1s" in result.stdout + result.stderr
        assert ("started" in result.stdout) is sandbox_spec.caps.partial_output_on_timeout
        assert sandbox.bash("pwd; echo $KEPT").stdout == f"{root}/w\nyes\n"


def test_real_programs_only_where_the_backend_has_them(
    sandbox_spec: SandboxSpec, sandbox: Sandbox
) -> None:
    result = sandbox.bash("/usr/bin/env true")
    assert result.exit_code == (0 if sandbox_spec.caps.real_binaries else 127)


# -- state -------------------------------------------------------------------------------
def test_state_export_matches_the_declared_persistence(
    sandbox_spec: SandboxSpec, sandbox: Sandbox
) -> None:
    """Only a journaled or snapshotting sandbox exports its state; the others refuse."""
    assert sandbox_spec.caps.exports_state is (sandbox.journaled or sandbox.snapshots)
    if not sandbox_spec.caps.exports_state:  # the state test below runs only on the others
        with pytest.raises(NotImplementedError):
            sandbox.export_state()
        with pytest.raises(NotImplementedError):
            sandbox.import_state(SandboxState(files={}, cwd=sandbox_spec.root(sandbox)))


FILES = {
    "bin/blob": bytes(range(256)),
    "empty": b"",
    "run.sh": b"#!/bin/sh\necho ran\n",
    "src/a.py": b"x = 1\n",
}


def test_state_round_trip_into_a_fresh_sandbox(exporting_spec: SandboxSpec) -> None:
    box = exporting_spec.open()
    root = exporting_spec.root(box)
    box.import_state(SandboxState(files=FILES, cwd=root, executable=frozenset({"run.sh"})))
    box.write("notes.md", "kept\n")
    box.bash("mkdir -p deep/empty && cd deep/empty")
    state = box.export_state()
    assert state.files == {**FILES, "notes.md": b"kept\n"}
    assert list(state.files) == sorted(state.files)
    assert state.cwd == exporting_spec.state_cwd(box, "deep/empty")

    fresh = exporting_spec.open()
    fresh.import_state(state)
    assert fresh.export_state() == state
    assert fresh.read("notes.md") == "kept\n"
    assert fresh.bash("pwd").stdout == f"{exporting_spec.root(fresh)}/deep/empty\n"
    assert fresh.bash("cat ../../bin/blob > ../../copy").exit_code == 0
    assert fresh.export_state().files["copy"] == bytes(range(256))
    assert fresh.bash("cd ../.. && ./run.sh").stdout == "ran\n"  # scripts stay executable


def test_what_git_keeps_round_trips(exporting_spec: SandboxSpec) -> None:
    """Links (to a file, to a folder, and one leading out of the workspace: kept as a link,
    never followed), the executable bit (a ``#!`` file without it stays without), empty
    folders and a ``.git`` folder survive export -> import, and changes to each (chmod
    both ways, a new link, an emptied folder) are seen by the next export (the
    incremental ones too) and restored into a fresh workspace."""
    box = exporting_spec.open()
    state = SandboxState(
        files={
            ".git/HEAD": b"ref: refs/heads/main\n",
            ".git/objects/ab/cdef": bytes(range(200)),
            "notes.sh": b"#!/bin/sh\necho notes\n",
            "run.sh": b"#!/bin/sh\necho ran\n",
            "src/a.py": b"x = 1\n",
        },
        cwd=exporting_spec.state_cwd(box, ""),
        executable=frozenset({"run.sh"}),
        links={"a.py": "src/a.py", "lib": "src", "out": "/etc/passwd", "gone": "../nowhere"},
        dirs=frozenset({".git/refs/tags", "empty/inner"}),
    )
    box.import_state(state)
    assert box.export_state() == state
    assert box.bash("./run.sh").stdout == "ran\n"
    assert box.bash("./notes.sh").exit_code != 0  # not executable
    assert box.read("a.py") == box.read("lib/a.py") == "x = 1\n"
    with pytest.raises(SandboxError):
        box.read("out")  # the link is kept, but nothing reads through it
    script = (
        "chmod 755 notes.sh && chmod 644 run.sh && mkdir -p more/void && ln -s ../run.sh more/up"
    )
    assert box.bash(f"{script} && rmdir empty/inner && echo 2 > src/b.py").exit_code == 0
    changed = box.export_state()
    assert changed.executable == {"notes.sh"}
    assert changed.links == {**state.links, "more/up": "../run.sh"}
    assert changed.dirs == {".git/refs/tags", "empty", "more/void"}
    assert changed.files == {**state.files, "src/b.py": b"2\n"}
    fresh = exporting_spec.open()
    fresh.import_state(changed)
    assert fresh.export_state() == changed
    assert fresh.bash("./notes.sh").stdout == "notes\n"


def test_export_is_sorted_and_deterministic(exporting_spec: SandboxSpec) -> None:
    first, second = exporting_spec.open(), exporting_spec.open()
    for name in ("b", "a", "c/d"):
        first.write(name, name)
    for name in ("c/d", "a", "b"):
        second.write(name, name)
    assert first.export_state() == second.export_state()
    assert list(first.export_state().files) == ["a", "b", "c/d"]


def test_import_replaces_the_whole_workspace(exporting_spec: SandboxSpec) -> None:
    box = exporting_spec.open()
    root = exporting_spec.root(box)
    box.write("old", "gone")
    box.bash("mkdir -p sub && cd sub")
    box.import_state(SandboxState(files={"new": b"here", "x/y": b"z"}, cwd=f"{root}/x"))
    assert box.export_state().files == {"new": b"here", "x/y": b"z"}
    assert box.bash("pwd; find .. -type f | sort").stdout == f"{root}/x\n../new\n../x/y\n"
    with pytest.raises(SandboxError, match="no such file"):
        box.read("old")


def test_import_refuses_bad_states_and_changes_nothing(exporting_spec: SandboxSpec) -> None:
    box = exporting_spec.open()
    root = exporting_spec.root(box)
    box.write("keep", "1")
    for bad in ("../x", "/abs", "a/./b", ".", ""):
        with pytest.raises(SandboxError):
            box.import_state(SandboxState(files={bad: b""}, cwd=root))
    with pytest.raises(SandboxError, match="file and a directory"):
        box.import_state(SandboxState(files={"a": b"", "a/b": b""}, cwd=root))
    assert box.export_state().files == {"keep": b"1"}


# -- caps --------------------------------------------------------------------------------
def test_caps_are_options_of_the_backends_that_have_them(sandbox_spec: SandboxSpec) -> None:
    if sandbox_spec.caps.byte_cap is None:  # the cap test below runs only on the others
        with pytest.raises(ConfigError, match="does not take"):
            sandbox_spec.open(max_bytes=1000)
    else:
        assert sandbox_spec.open(**sandbox_spec.caps.byte_cap) is not None


def test_a_byte_cap_is_a_sandbox_error_and_the_sandbox_stays_usable(
    capped_spec: SandboxSpec,
) -> None:
    assert capped_spec.caps.byte_cap is not None
    box = capped_spec.open(**capped_spec.caps.byte_cap)
    box.write("a", "x" * 600)
    assert box.export_state().files == {"a": b"x" * 600}
    # Where the cap is met is the backend's: the write (a workspace cap) or the next
    # snapshot (a snapshot cap); either way a SandboxError that names the cap.
    with pytest.raises(SandboxError, match="1,000"):
        box.write("b", "y" * 600)
        box.export_state()
    box.bash("rm -f b")
    assert box.bash("echo fine > f; cat f").stdout == "fine\n"
    assert box.export_state().files == {"a": b"x" * 600, "f": b"fine\n"}


def test_open_sandbox_names_the_backend(sandbox_spec: SandboxSpec, sandbox: Sandbox) -> None:
    assert type(sandbox).__module__ == f"durable_harness.sandbox.{sandbox_spec.name}"
    assert sandbox.__enter__() is sandbox


def test_edit_refuses_a_file_that_is_not_utf8(sandbox_spec: SandboxSpec) -> None:
    """A latin-1 file: read shows its é as U+FFFD, and edit refuses to write that back
    (it would rewrite every such byte); the file keeps its bytes. A UTF-8 file next to it
    is edited as usual."""
    box = sandbox_spec.open()
    latin1 = "café old\n".encode("latin-1")
    if sandbox_spec.caps.exports_state:
        box.import_state(SandboxState(files={"l1.txt": latin1}, cwd=sandbox_spec.root(box)))
    else:  # a real bash: printf writes the byte itself
        assert box.bash(r"printf 'caf\351 old\n' > l1.txt").exit_code == 0
    assert box.read_data("l1.txt") == latin1
    assert box.read("l1.txt") == "caf\ufffd old\n"
    with pytest.raises(SandboxError, match=r"not UTF-8 text .*byte 0xe9 at offset 3"):
        box.edit("l1.txt", "old", "new")
    assert box.read_data("l1.txt") == latin1
    box.write("u8.txt", "café old\n")
    box.edit("u8.txt", "old", "new")
    assert box.read_data("u8.txt") == "café new\n".encode()
