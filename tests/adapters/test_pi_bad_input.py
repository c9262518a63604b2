"""pi bad input and failures: one clear error each, nothing recorded as finished that did
not finish, and no tool run without its intent recorded."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import AGENT_CONFIG, TOOLS
from pi_cases import bash_runs, pi_harness, run_args
from support import Harness, ids_of, make_harness
from test_claude_bad_input import no_turns, one_line_error

from durable_harness.adapters.pi.spec import ENDPOINT_ENV, EXTENSION, PI_VERSION, find_pi


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from pi_harness(tmp_path)


def test_cli_not_installed(h: Harness, tmp_path: Path) -> None:
    out = h.cli(*run_args(h), DURABLE_HARNESS_PI_BIN=str(tmp_path / "no-pi"))
    one_line_error(out, "DURABLE_HARNESS_PI_BIN", "not an executable")
    no_turns(h)


def test_wrong_cli_version(h: Harness, tmp_path: Path) -> None:
    fake = tmp_path / "pi"
    fake.write_text("#!/bin/sh\necho 0.1.0 >&2\n")
    fake.chmod(0o755)
    out = h.cli(*run_args(h), DURABLE_HARNESS_PI_BIN=str(fake))
    one_line_error(out, "0.1.0", PI_VERSION, "scripts/setup")
    no_turns(h)


def test_virtual_workspace_is_refused(h: Harness) -> None:
    out = h.cli("run", "--agent", "pi", "--workspace", "virtual", "--tools", TOOLS, "x")
    one_line_error(out, "--workspace docker", "--workspace DIR", "pi")
    no_turns(h)


def test_bad_agent_config(h: Harness, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[replay]\ntools = { bash = "sometimes" }\n')
    args = run_args(h)
    args[args.index(str(AGENT_CONFIG))] = str(bad)
    one_line_error(h.cli(*args), "agent config", "bash")
    no_turns(h)


def test_upstream_unreachable(h: Harness) -> None:
    out = h.cli(
        *run_args(h), DURABLE_HARNESS_PI_MAX_RETRIES="0", ANTHROPIC_BASE_URL="http://127.0.0.1:9"
    )
    assert out.returncode == 1, out.stderr
    show = h.show(ids_of(out)["turn"])
    assert show["turn"]["status"] == "queued"  # released for a later retry, not lost
    models = [s for s in show["steps"] if s["kind"] == "model"]
    assert models and all(s["status"] == "intent" for s in models), show
    assert all(s["status"] != "done" for s in show["steps"])
    error = str(show["turn"]["error"])
    assert "cannot reach the model endpoint http://127.0.0.1:9" in error, out.stderr
    assert "will be resumed" in error


_BLOCKED_SCRIPT = """
[[rule]]
name = "stop"
when.conversation = "so this tool is blocked"
reply.text = "The tool was blocked."

[[rule]]
name = "bash"
reply.tool_use = [ { name = "bash", input = { command = "echo ran >> bash_runs.txt" } } ]
"""


def test_tool_blocked_when_the_harness_cannot_be_reached(tmp_path: Path) -> None:
    """Fail closed: the real Pi with the durable-harness extension, talking straight to the
    fake model, its harness endpoint a closed port: the bash call is blocked, not run."""
    (tmp_path / "ws").mkdir()
    script = tmp_path / "script.toml"
    script.write_text(_BLOCKED_SCRIPT)
    for h in make_harness(tmp_path, script):
        _run_blocked(h, tmp_path)


def _run_blocked(h: Harness, tmp_path: Path) -> None:
    home = tmp_path / "home"
    agent = home / ".pi" / "agent"
    agent.mkdir(parents=True)
    provider = {
        "baseUrl": h.server.url,
        "api": "anthropic-messages",
        "apiKey": "test",
        "models": [{"id": "claude-sonnet-4-5"}],
    }
    (agent / "models.json").write_text(json.dumps({"providers": {"fake": provider}}))
    endpoint = agent / "endpoint.json"
    endpoint.write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "x", "hostTools": []}))
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "PI_OFFLINE": "1",
        ENDPOINT_ENV: str(endpoint),
    }
    command = [find_pi(), "-p", "--mode", "json", "--model", "fake/claude-sonnet-4-5"]
    command += ["--no-extensions", "-e", str(EXTENSION), "--no-session"]
    out = subprocess.run(
        command,
        input="add a pricing page",
        cwd=tmp_path / "ws",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bash_runs(h) == 0, out.stdout[-2000:]
    results = [
        json.loads(line)
        for line in out.stdout.splitlines()
        if line.startswith("{") and '"tool_execution_end"' in line
    ]
    assert results and all(r["isError"] for r in results), out.stdout[-2000:]
    text = json.dumps(results[0]["result"])
    assert "durable-harness is not reachable, so this tool is blocked" in text
    assert [r["rule"] for r in h.requests()] == ["bash", "stop"]
