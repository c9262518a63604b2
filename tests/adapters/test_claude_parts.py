"""The claude-code adapter's parts on their own: replay labels, the reaper, the transcript
store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from claude_cases import alive, wait_for

from durable_harness.adapters.cli import reaper
from durable_harness.adapters.cli.hooks import AgentConfig, ReplayPolicy
from durable_harness.adapters.cli.records import TranscriptStore
from durable_harness.core.errors import ConfigError
from durable_harness.worlds import open_world


def test_default_labels() -> None:
    policy = ReplayPolicy()
    assert policy.label("Read", {"file_path": "/x"}) == "safe"
    assert policy.label("Grep", {}) == "safe"
    for name in ("Bash", "Edit", "Write", "NotebookEdit", "Agent", "SomethingNew"):
        assert policy.label(name, {"command": "ls"}) == "never"


def test_user_marks_bash_commands_and_tools() -> None:
    config = AgentConfig.parse(
        {"replay": {"safe_bash": ["ls*", "git status"], "tools": {"WebFetch": "never"}}}, "t"
    )
    policy = ReplayPolicy(config)
    assert policy.label("Bash", {"command": "ls -la"}) == "safe"
    assert policy.label("Bash", {"command": "git status"}) == "safe"
    assert policy.label("Bash", {"command": "git push"}) == "never"
    # A pattern never vouches for a command that chains, redirects or substitutes.
    for command in ("ls; rm -rf x", "ls && rm x", "ls > f", "ls $(rm x)", "ls `rm x`", "ls\nrm x"):
        assert policy.label("Bash", {"command": command}) == "never", command
    assert policy.label("WebFetch", {}) == "never"


def test_bad_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="replay"):
        AgentConfig.parse({"replay": {"tools": {"Bash": "maybe"}}}, "t")
    with pytest.raises(ConfigError, match="replays"):
        AgentConfig.parse({"replays": {}}, "t")


NAP = "2.0417"  # the detached command's sleep: a duration no other process uses


def test_reaper_kills_a_detached_shell_when_the_worker_dies(tmp_path: Path) -> None:
    """Claude Code runs each Bash command in a new session: a process-group kill misses
    it. The reaper, told its worker died, still kills it."""
    marker = tmp_path / "late.txt"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys, time\n"
            f"subprocess.Popen([sys.executable, '-I', '-S', {reaper.__file__!r}, "
            "str(os.getpid()), '--', 'sh', '-c', "
            f"'setsid sh -c \\'sleep {NAP}; echo late > {marker}\\' & wait'])\n"
            "time.sleep(60)\n",
        ],
        start_new_session=True,
    )
    wait_for(lambda: _sleepers(worker.pid), 10, "the detached command to start")
    sleepers = _sleepers(worker.pid)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    wait_for(lambda: not alive(sleepers), 10, "the detached command to die")
    time.sleep(float(NAP) + 0.5)
    assert not marker.exists()


def test_reaper_passes_the_exit_status() -> None:
    code = subprocess.run(
        [sys.executable, reaper.__file__, str(os.getpid()), "--", "sh", "-c", "exit 3"],
        check=False,
    )
    assert code.returncode == 3


def _sleepers(root: int) -> list[int]:
    from claude_cases import cmdline, descendants

    # Matched by its unique duration: other tests' (or containers') sleeps are not ours.
    mine = f"sleep {NAP} "
    return [p for p in descendants(root) if cmdline(p) == mine] or [
        p for p in _all_pids() if cmdline(p) == mine
    ]


def _all_pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def test_transcript_saves_are_deltas(tmp_path: Path) -> None:
    world = open_world("local", data_dir=tmp_path / "world")
    store = TranscriptStore(world)
    lines = [f'{{"n": {i}, "pad": "{"x" * 1000}"}}\n'.encode() for i in range(50)]
    saves = [store.save(b"".join(lines[: i + 1])) for i in range(50)]
    assert TranscriptStore(world).load(saves[-1].digest) == b"".join(lines)
    # Linear, not quadratic: the blob folder holds about one copy of the transcript.
    blob_bytes = sum(f.stat().st_size for f in (tmp_path / "world").rglob("*") if f.is_file())
    assert blob_bytes < 3 * len(b"".join(lines)) + 200_000
    # A line still being written is left for the next save.
    partial = store.save(b"".join(lines) + b'{"n": 50, "half')
    assert partial.size == len(b"".join(lines))
    world.close()
