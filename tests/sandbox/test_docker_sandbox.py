"""The Docker sandbox alone, against a real Docker Engine: the agent user, limits, re-attach,
hardening, snapshots. (The Sandbox contract, run on every backend: test_contract.py.)"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_harness.core.errors import ResourceLimit, SandboxError, SandboxUnavailable
from durable_harness.core.tree import RACY_SECONDS
from durable_harness.harness.workspace import SnapshotStore, restore_workspace, save_workspace
from durable_harness.sandbox import open_sandbox
from durable_harness.sandbox.docker import LABEL_MANAGED, LABEL_SESSION, DockerSandbox, files
from durable_harness.sandbox.docker_image import IMAGE_DIR
from durable_harness.worlds import open_world

LIMITS: dict[str, Any] = {"memory": "256m", "pids": 128, "cpus": 1.0, "timeout": 30.0}


@pytest.fixture
def session(docker_host: str) -> Iterator[str]:
    """A fresh session id; its container and volumes are removed afterwards."""
    session_id = f"test-{uuid.uuid4().hex[:12]}"
    yield session_id
    with DockerSandbox(session_id, **LIMITS) as box:
        box.remove()


@pytest.fixture
def box(session: str) -> Iterator[DockerSandbox]:
    with DockerSandbox(session, **LIMITS) as sandbox:
        yield sandbox


def test_files_are_written_as_the_agent_user(box: DockerSandbox) -> None:
    # (reading, writing, editing and confinement: test_contract.py)
    box.write("src/app.py", "print('héllo')\n")
    assert box.bash("stat -c '%u %a' src/app.py").stdout == "1000 644\n"
    box.bash("ln -s /etc/passwd leak")
    with pytest.raises(SandboxError, match="outside the workspace"):
        box.read("leak")
    with pytest.raises(SandboxError, match="outside the workspace"):
        box.write("leak", "x")


def test_session_records_outside_the_workspace(box: DockerSandbox) -> None:
    record = "/home/agent/.claude/projects/-workspace/abc.jsonl"
    assert box.read_bytes(record) is None
    box.write_bytes(record, b'{"type":"user"}\n')
    assert box.read_bytes(record) == b'{"type":"user"}\n'
    with pytest.raises(SandboxError, match="outside the workspace"):
        box.write_bytes("/etc/x", b"")
    with pytest.raises(SandboxError, match="outside the workspace"):
        box.read_bytes("/home/agent/../../etc/passwd")


def test_a_read_cut_by_the_output_cap_fails_loudly(
    box: DockerSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session record or file longer than a read may take is an error, never the cap's
    head, note and tail taken for its contents (then saved as the record, or edited)."""
    record = "/home/agent/.claude/projects/-workspace/big.jsonl"
    box.write_bytes(record, b'{"type":"user"}\n' * 100)
    box.write("big.txt", "x" * 1600)
    monkeypatch.setattr(files, "READ_CAP", 1000)
    with pytest.raises(SandboxError, match="cut by 600 bytes at the read's cap"):
        box.read_bytes(record)
    with pytest.raises(SandboxError, match="cut by 600 bytes"):
        box.read("big.txt")
    with pytest.raises(SandboxError, match="cut by 600 bytes"):
        box.edit("big.txt", "x" * 1600, "y")
    monkeypatch.undo()
    assert box.read_bytes(record) == b'{"type":"user"}\n' * 100
    assert box.read("big.txt") == "x" * 1600


def test_large_files_and_large_output(box: DockerSandbox) -> None:
    big = "".join(f"line {i}\n" for i in range(300_000))  # ~3.4 MB
    box.write("big.txt", big)
    assert box.read("big.txt") == big
    box.bash("ln -s /etc/passwd out")
    with pytest.raises(SandboxError, match="outside the workspace"):
        box.write("out", big)  # refused before reading its input
    result = box.bash("yes 0123456789 | head -c 5000000")
    assert result.exit_code == 0 and "bytes of output left out" in result.stdout
    assert result.stdout.startswith("0123456789\n") and len(result.stdout) < 1_100_000


def test_timeout_stops_the_command_and_its_children(box: DockerSandbox) -> None:
    result = box.bash("sleep 60 & sleep 60", timeout=1)
    assert result.timed_out and result.exit_code == 124
    assert "timed out after 1s" in result.stderr
    assert "sleep 60" not in box.bash("ps -eo args").stdout


def test_background_jobs_end_with_their_command(box: DockerSandbox) -> None:
    assert box.bash("sleep 60 & echo started").stdout == "started\n"
    assert "sleep 60" not in box.bash("ps -eo args").stdout


def test_a_fork_bomb_is_a_tool_error_and_the_container_survives(box: DockerSandbox) -> None:
    # Each copy waits for the two it started, so the tree stays until a fork fails: the
    # classic `:(){ :|:& };:` returns at once and, on a loaded machine, can be killed with
    # its command before it ever reaches the limit (then nothing was hit, rightly).
    before = box.container_id()
    with pytest.raises(ResourceLimit, match="process limit"):
        box.bash(":(){ :|:& wait; };:", timeout=5)
    assert box.bash("echo alive").stdout == "alive\n"
    assert box.container_id() == before


def test_a_memory_hog_is_a_tool_error_and_the_container_survives(box: DockerSandbox) -> None:
    before = box.container_id()
    with pytest.raises(ResourceLimit, match="out of memory"):
        box.bash("head -c 1G /dev/zero | tail", timeout=20)
    assert box.bash("echo alive").stdout == "alive\n"
    assert box.container_id() == before


def test_a_new_worker_reattaches_by_label(session: str, docker_host: str) -> None:
    with DockerSandbox(session, **LIMITS) as first:
        first.write("notes.md", "kept\n")
        first.bash("cd /tmp && export MODE=x")
        container = first.container_id()
    with DockerSandbox(session, **LIMITS) as second:
        assert second.container_id() == container
        assert second.read("notes.md") == "kept\n"
        assert second.bash('pwd; echo "$MODE"').stdout == "/tmp\nx\n"
        attrs = second.client.containers.get(container).attrs
    assert attrs["Config"]["Labels"][LABEL_SESSION] == session
    assert attrs["Config"]["Labels"][LABEL_MANAGED] == "1"


def test_a_stopped_container_is_started_again(box: DockerSandbox) -> None:
    box.write("f.txt", "x")
    box.client.containers.get(box.container_id()).stop(timeout=1)
    assert box.read("f.txt") == "x"


def test_workers_racing_to_create_share_one_container(session: str) -> None:
    ids: list[str] = []

    def attach() -> None:
        with DockerSandbox(session, **LIMITS) as box:
            ids.append(box.container_id())

    threads = [threading.Thread(target=attach) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 4 and len(set(ids)) == 1


def test_the_container_is_hardened(box: DockerSandbox) -> None:
    host = box.client.containers.get(box.container_id()).attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["ReadonlyRootfs"] is True and host["Privileged"] is False
    assert host["NetworkMode"] == "none"
    assert host["Memory"] == 256 * 1024 * 1024 == host["MemorySwap"]
    assert host["PidsLimit"] == 128 and host["NanoCpus"] == 10**9
    assert host["Init"] is True
    status = box.bash("id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status").stdout.split()
    assert status == ["1000", "CapEff:", "0000000000000000", "NoNewPrivs:", "1"]


def test_a_vanished_container_is_a_retry_not_a_tool_error(box: DockerSandbox) -> None:
    box.write("f.txt", "x")
    box.client.containers.get(box.container_id()).remove(force=True)
    with pytest.raises(SandboxUnavailable, match="vanished"):
        box.read("f.txt")


def test_an_exec_the_runtime_refuses_is_run_again_and_told_apart_from_exit_126(
    box: DockerSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load the runtime may refuse an exec (exit 126, "OCI runtime exec failed"), which
    once failed a snapshot with an empty tar. Docker records no pid for a process that never
    started: such an exec is run again; a command that itself exits 126 is not."""
    from durable_harness.sandbox.docker import exec as docker_exec

    cid = box.container_id()
    calls: list[list[str]] = []
    real_run = docker_exec.run

    def counted(api: Any, container: str, command: list[str], **options: Any) -> Any:
        calls.append(command)
        return real_run(api, container, command, **options)

    monkeypatch.setattr(docker_exec, "run", counted)
    # A binary that is not there: the runtime refuses it as it refuses one under load.
    refused = box._run(cid, ["/nonexistent"], within=0.5, timeout=10)
    assert refused.refused and refused.exit_code == 126
    assert b"OCI runtime exec failed" in refused.stdout + refused.stderr
    assert len(calls) >= 3  # tried again until `within` ran out
    calls.clear()
    ran = box.exec("echo ran; exit 126")
    assert (ran.exit_code, ran.refused, ran.stdout, len(calls)) == (126, False, b"ran\n", 1)


def test_open_sandbox_docker_and_unknown_options(session: str) -> None:
    with open_sandbox("docker", session_id=session, **LIMITS) as box:
        assert isinstance(box, DockerSandbox)
        assert box.snapshots and not box.journaled
    with pytest.raises(Exception, match="does not take max_files"):
        open_sandbox("docker", max_files=3)


def test_a_throwaway_sandbox_is_removed_on_close(docker_host: str) -> None:
    with DockerSandbox(**LIMITS) as box:
        box.write("x", "y")
        name = box.container_name
        client = box.client
        assert client.containers.get(name)
    with DockerSandbox(**LIMITS) as other:
        assert not other.client.containers.list(all=True, filters={"name": name})


def _command_left_running(
    session: str, command: str = "echo start >> left.txt; sleep 30; echo end >> left.txt"
) -> tuple[threading.Thread, list[Any]]:
    """A bash-tool command of another (worker's) sandbox, by default one that runs on for
    30 s after it wrote its first line: the command a killed worker leaves behind."""
    ended: list[Any] = []

    def worker() -> None:
        with DockerSandbox(session, **LIMITS) as other:
            ended.append(other.bash(command))

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    return thread, ended


def _wait_started(box: DockerSandbox) -> None:
    deadline = time.monotonic() + 30
    while box.read("left.txt") != "start\n":
        assert time.monotonic() < deadline, "the command did not start"
        time.sleep(0.1)


def test_a_command_ending_reaps_a_job_started_during_its_life(
    box: DockerSandbox, session: str
) -> None:
    """Why a new worker stops a dead worker's commands before it starts a launch: a command
    ending kills what was started during its life outside the harness's own execs."""
    box.write("left.txt", "")
    thread, ended = _command_left_running(session, "echo start >> left.txt; sleep 4")
    _wait_started(box)
    assert box.jobs.start("launch", "sleep 60", contain=True)
    thread.join(30)
    assert ended and ended[0].exit_code == 0
    assert box.jobs.status("launch").state != "running"


def test_stop_commands_ends_a_dead_workers_command_before_a_launch(
    box: DockerSandbox, session: str
) -> None:
    box.write("left.txt", "")
    thread, ended = _command_left_running(session)
    _wait_started(box)
    started = time.monotonic()
    assert box.stop_commands() == 1
    assert time.monotonic() - started < 10  # not the command's 30 s
    thread.join(10)
    assert ended and ended[0].exit_code != 0  # it did not finish: no "end" line
    assert box.read("left.txt") == "start\n"
    # A launch started now is not reaped by the stopped command's end, which is over.
    assert box.jobs.start("launch", "sleep 60", contain=True)
    time.sleep(1)
    assert box.jobs.status("launch").state == "running"
    # Command files the agent planted (it can write there) name no wrapper: init's pid, the
    # launch's sleep, a name that is no pid. None is signalled: the launch lives on.
    planted = box.bash(
        "s=$HOME/.durable-harness/shell; "
        'touch "$s/command.1" "$s/command.$(pgrep -n -x sleep)" "$s/command.x;y"'
    )
    assert planted.exit_code == 0, planted.stderr
    assert box.stop_commands() == 0
    assert box.jobs.status("launch").state == "running"
    box.jobs.stop("launch")


# -- snapshots -------------------------------------------------------------------------


def test_only_changed_files_are_copied_out(
    box: DockerSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(20):
        box.write(f"f{i}.txt", f"{i}\n")
    time.sleep(RACY_SECONDS * 2)  # a file changed just before an export is copied again
    box.export_state()
    box.bash("echo changed > f3.txt; echo new > g.txt; rm f5.txt")
    asked: list[bytes] = []
    real_exec = box.exec

    def spy(script: str, *args: str, **kwargs: Any) -> Any:
        if "tar" in script and kwargs.get("stdin") is not None:
            asked.append(kwargs["stdin"])
        return real_exec(script, *args, **kwargs)

    monkeypatch.setattr(box, "exec", spy)
    state = box.export_state()
    assert sorted(asked[0].split(b"\0")[:-1]) == [b"f3.txt", b"g.txt"]
    assert state.files["f3.txt"] == b"changed\n" and "f5.txt" not in state.files
    assert len(state.files) == 20


def test_restore_only_when_the_workspace_lacks_the_snapshot(session: str, tmp_path: Path) -> None:
    with open_world("local", data_dir=tmp_path / "world") as world:
        store = SnapshotStore(world)
        with DockerSandbox(session, **LIMITS) as box:
            box.write("keep.txt", "v1\n")
            # What git keeps, and the agent's own commit in the workspace's .git.
            made = box.bash(
                "printf '#!/bin/sh\\necho hi\\n' > run.sh && chmod +x run.sh && "
                "ln -s keep.txt link && ln -s /etc/passwd out && mkdir -p empty/dir && "
                "git init -q && git add -A && "
                "git -c user.name=a -c user.email=a@b commit -qm one"
            )
            assert made.exit_code == 0, made.stderr
            digest = save_workspace(box, store)
            assert digest is not None and box.snapshot_mark() == digest
            # Effects after the snapshot (an interrupted step) stay in a live workspace.
            box.write("later.txt", "after\n")
            assert restore_workspace(box, store, digest) is False
            assert box.read("later.txt") == "after\n"
            # The machine is lost: container and volumes gone.
            box.remove()
        with DockerSandbox(session, **LIMITS) as fresh:
            assert fresh.snapshot_mark() is None
            assert restore_workspace(fresh, store, digest) is True
            assert fresh.read("keep.txt") == "v1\n"
            with pytest.raises(SandboxError):
                fresh.read("later.txt")
            back = fresh.bash(
                "stat -c '%a %U' run.sh; readlink link out; ./run.sh; test -d empty/dir && "
                "git log --format=%s && git status --porcelain"
            )
            # The mode, the links (not followed) and the commit are back, and git sees
            # the checkout exactly as committed (no mode or type change).
            assert back.stdout == "755 agent\nkeep.txt\n/etc/passwd\nhi\none\n", back.stderr
            # The session went on elsewhere: this workspace's mark is stale.
            fresh.set_snapshot_mark("0" * 64)
            fresh.write("keep.txt", "stale\n")
            assert restore_workspace(fresh, store, digest) is True
            assert fresh.read("keep.txt") == "v1\n"


def test_the_image_has_every_pinned_cli(box: DockerSandbox) -> None:
    """The agent image holds the CLIs and ACP agents at the versions the shipped package.json
    pins."""
    import json

    pins = json.loads((IMAGE_DIR / "tools/npm/package.json").read_text())
    binaries = {
        "@anthropic-ai/claude-code": "claude",
        "@openai/codex": "codex",
        "opencode-ai": "opencode",
        "@mariozechner/pi-coding-agent": "pi",
        "@zed-industries/claude-code-acp": "claude-code-acp",
        "@zed-industries/codex-acp": "codex-acp",
    }
    assert set(pins["dependencies"]) == set(binaries)
    # The ACP agents have no --version (one speaks ACP whatever its arguments, the other
    # refuses the flag): their installed package.json says the version.
    acp_agents = {"@zed-industries/claude-code-acp", "@zed-industries/codex-acp"}
    for package, version in pins["dependencies"].items():
        if package in acp_agents:
            command = (
                f"command -v {binaries[package]} >/dev/null && "
                f"grep -m1 '\"version\"' /opt/agent-clis/node_modules/{package}/package.json"
            )
        else:
            command = f"PI_OFFLINE=1 {binaries[package]} --version </dev/null 2>&1"
        out = box.bash(command, timeout=120)
        assert out.exit_code == 0 and version in out.stdout, (package, out)
