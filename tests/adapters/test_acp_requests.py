"""The ACP client's fs/* and terminal/* requests, served from the host folder as
journaled steps, with the scripted agent (tests/fixtures/acp_agent.py): a write and a
command journaled, a path outside the workspace refused, and the worker killed while the
command runs: the resumed turn answers that command "possibly ran" and its effect (a line
in effects.txt) is not repeated, the finished write is answered from the journal."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from acp_cases import fake_agent_harness, run_args
from claude_cases import dump, kill_worker_and_cli, wait_for

from durable_harness.adapters.acp.requests import command_line
from durable_harness.harness.journal import POSSIBLY_RAN_MESSAGE


def _steps(show: dict[str, object]) -> dict[str, str]:
    return {s["name"]: s["status"] for s in show["steps"] if s["kind"] == "tool"}  # type: ignore[attr-defined, index]


def test_fs_and_terminal_are_journaled_steps(tmp_path: Path) -> None:
    for h in fake_agent_harness(tmp_path, "tools"):
        out = h.cli(*run_args(h))
        assert out.returncode == 0, out.stderr
        reply = json.loads(out.stdout.strip().splitlines()[-1])
        assert reply["wrote"] == {} and "COMMAND-DONE" in reply["output"]["output"]
        assert reply["output"]["exitStatus"]["exitCode"] == 0
        assert reply["read"] == {"content": "HELLO-ACP\n"}
        assert "outside the sandbox folder" in reply["escape"]
        turn_id = out.stdout.splitlines()[1].split()[1]
        show = h.show(turn_id)
        steps = [(s["name"], s["status"]) for s in show["steps"] if s["kind"] == "tool"]
        assert steps == [
            ("fs/write_text_file", "done"),
            ("terminal/create", "done"),
            ("fs/read_text_file", "done"),
            ("fs/read_text_file", "done"),  # the refused read: its error is its outcome
        ], dump(show)
        assert (tmp_path / "ws" / "effects.txt").read_text() == "RAN\n"
        assert h.requests() == []  # the scripted agent calls no model
        replay = h.cli("replay", turn_id)
        assert replay.returncode == 0, replay.stderr
        assert (tmp_path / "ws" / "effects.txt").read_text() == "RAN\n"


def test_worker_killed_while_the_command_runs(tmp_path: Path) -> None:
    effects = tmp_path / "ws" / "effects.txt"
    for h in fake_agent_harness(tmp_path, "tools", sleep=30):
        proc = h.popen(*run_args(h))
        assert proc.stdout is not None
        proc.stdout.readline()
        turn_id = proc.stdout.readline().split()[1]
        wait_for(lambda: effects.exists() and effects.read_text() == "RAN\n", 60, "the command")
        kill_worker_and_cli(proc.pid, "acp_agent.py")
        proc.wait(timeout=30)

        resumed = h.cli("resume", turn_id, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
        reply = json.loads(resumed.stdout.strip().splitlines()[-1])
        possibly = POSSIBLY_RAN_MESSAGE.split(":")[0]
        assert reply["output"]["output"].startswith(possibly), reply
        assert reply["wrote"] == {}  # answered from the journal
        assert effects.read_text() == "RAN\n"  # the command did not run again
        show = h.show(turn_id)
        statuses = _steps(show)
        assert statuses["terminal/create"] == "possibly_ran", dump(show)
        assert statuses["fs/write_text_file"] == "done", dump(show)
        assert show["turn"]["status"] == "done"


FOO_ENV = [{"name": "FOO", "value": "bar"}, {"name": "CLAUDECODE", "value": "1"}]


@pytest.mark.parametrize(
    ("command", "params", "printed"),
    [
        # claude-code-acp: its Bash tool's whole line as the command, no args, an env.
        ('d=$(echo in) && echo "$d $FOO" && echo "$CLAUDECODE"', {"env": FOO_ENV}, "in bar\n1\n"),
        ("printf", {"args": ["%s|", "a b", "$HOME"], "env": FOO_ENV}, "a b|$HOME|"),
        ('echo "$FOO"', {}, "\n"),
        ("pwd", {"cwd": "/"}, "/\n"),
    ],
)
def test_a_terminal_command_line_gets_its_env_whole(
    command: str, params: dict[str, object], printed: str
) -> None:
    """The env of a terminal/create reaches every part of its line (an `env` prefix reached
    only the first simple command, which the escape test inside acp:claude-code found)."""
    line = command_line(command, params)
    out = subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, env={"PATH": os.defpath}, check=True
    )
    assert out.stdout == printed
