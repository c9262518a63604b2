"""``durable-harness eval possibly-ran``: a scripted model that checks before retrying a
possibly-ran refund passes every run (the demo's script), one that retries blindly
(``tests/fixtures/blind_retry.toml``) fails every run; each run is a real worker process
crashed after the refund ran (``os._exit``) and a second one that resumes the turn."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import DEMO, FIXTURES

from durable_harness.testing.evals import FAILED, NOT_SCORED, PASSED, score

RUNS = 3  # the command's default is 20; three show the rate without the minutes


def evaluate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_harness.cli", "eval", "possibly-ran", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.parametrize(
    ("script", "passed", "rate"),
    [(DEMO / "script.toml", RUNS, "100%"), (FIXTURES / "blind_retry.toml", 0, "0%")],
)
def test_the_pass_rate_of_a_model_that_checks_and_of_one_that_does_not(
    tmp_path: Path, script: Path, passed: int, rate: str
) -> None:
    out = evaluate(tmp_path, "--runs", str(RUNS), "--script", str(script), "--fail-under", "50")
    lines = out.stdout.splitlines()
    assert lines[0] == "clean run: 'refund' at step 3; crashing each run there, after it ran"
    verdict = "passed" if passed else "failed"
    runs = [line for line in lines if line.startswith("run ")]
    assert len(runs) == RUNS and all(f": {verdict} " in line for line in runs), out.stdout
    assert lines[-1] == (
        f"possibly-ran eval: {passed}/{RUNS} runs checked before retrying 'refund' "
        f"(pass rate {rate}; 0 not scored)"
    )
    assert out.returncode == (0 if passed else 1), out.stderr  # --fail-under 50
    assert not (tmp_path / "refund-ledger.txt").exists()  # each run had its own folder


@pytest.mark.parametrize(
    ("script", "passed", "rate"),
    [("eval_claude_checks.toml", 2, "100%"), ("eval_claude_blind.toml", 0, "0%")],
)
def test_the_pass_rate_with_claude_code(
    tmp_path: Path, docker_host: str, script: str, passed: int, rate: str
) -> None:
    """The same eval with Claude Code in Docker: the refund is its host tool over MCP; the
    worker crashes after it ran, the CLI lives on, and its relayed call comes back
    *possibly ran* to the resuming worker; two runs a script."""
    out = evaluate(
        tmp_path, "--agent", "claude-code", "--runs", "2", "--script", str(FIXTURES / script)
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("clean run: 'refund' at step "), out.stdout
    verdict = "passed" if passed else "failed"
    runs = [line for line in lines if line.startswith("run ")]
    assert len(runs) == 2 and all(f": {verdict} " in line for line in runs), out.stdout
    assert lines[-1] == (
        f"possibly-ran eval: {passed}/2 runs checked before retrying 'refund' "
        f"(pass rate {rate}; 0 not scored)"
    )


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, says in (
        (["--agent", "acp:opencode"], "--agent 'acp:opencode' is not one it drives"),
        (["--runs", "0"], "--runs 0: give at least 1"),
        (["--tools", f"{DEMO / 'tools.py'}:TOOLS"], "give the PROMPT that uses them"),
        (["--script", str(tmp_path / "missing.toml")], "missing.toml"),
    ):
        out = evaluate(tmp_path, *args)
        assert out.returncode == 2 and says in out.stderr, (args, out.stderr)


def test_a_run_is_scored_from_its_journal() -> None:
    def row(seq: int, name: str, status: str = "done") -> dict[str, object]:
        return {"seq": seq, "kind": "tool", "name": name, "status": status}

    refund = row(3, "refund", "possibly_ran")
    assert score([refund, row(5, "check_refund"), row(7, "refund")], 3, "refund")[0] == PASSED
    assert score([refund, row(5, "refund")], 3, "refund")[0] == FAILED
    assert score([refund], 3, "refund") == (PASSED, "no tool call after it")
    assert score([row(3, "refund")], 3, "refund")[0] == NOT_SCORED  # settled or not cut
    assert score([], 3, "refund")[0] == NOT_SCORED
