"""claude-code bad input: one clear error each, nothing recorded as finished that did not
finish."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import AGENT_CONFIG, TOOLS, claude_harness, run_args
from support import Harness, ids_of

from durable_harness.adapters.claude_code.spec import CLAUDE_CODE_VERSION


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from claude_harness(tmp_path)


def one_line_error(out: object, *needles: str) -> str:
    err = out.stderr.strip()  # type: ignore[attr-defined]
    assert out.returncode == 2, err  # type: ignore[attr-defined]
    assert len(err.splitlines()) == 1, err
    assert err.startswith("durable-harness: error: ")
    for needle in needles:
        assert needle in err, err
    return err


def no_turns(h: Harness) -> None:
    out = h.cli("ls", "--json")
    assert out.returncode == 0 and json.loads(out.stdout) == []


def test_cli_not_installed(h: Harness, tmp_path: Path) -> None:
    out = h.cli(*run_args(h), DURABLE_HARNESS_CLAUDE_BIN=str(tmp_path / "no-claude"))
    one_line_error(out, "DURABLE_HARNESS_CLAUDE_BIN", "not an executable")
    no_turns(h)


def test_wrong_cli_version(h: Harness, tmp_path: Path) -> None:
    fake = tmp_path / "claude"
    fake.write_text("#!/bin/sh\necho '1.0.0 (Claude Code)'\n")
    fake.chmod(0o755)
    out = h.cli(*run_args(h), DURABLE_HARNESS_CLAUDE_BIN=str(fake))
    one_line_error(out, "1.0.0", CLAUDE_CODE_VERSION, "scripts/setup")
    no_turns(h)


def test_virtual_workspace_is_refused(h: Harness) -> None:
    out = h.cli("run", "--agent", "claude-code", "--workspace", "virtual", "--tools", TOOLS, "x")
    one_line_error(out, "--workspace docker", "claude-code")
    no_turns(h)


def test_bad_agent_config(h: Harness, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[replay]\ntools = { Bash = "sometimes" }\n')
    args = run_args(h)
    args[args.index(str(AGENT_CONFIG))] = str(bad)
    one_line_error(h.cli(*args), "agent config", "Bash")
    no_turns(h)


def _failed_model_turn(h: Harness, **env: str) -> tuple[str, dict[str, object], str]:
    out = h.cli(*run_args(h), DURABLE_HARNESS_CLAUDE_MAX_RETRIES="0", **env)
    assert out.returncode == 1, out.stderr
    turn = ids_of(out)["turn"]
    show = h.show(turn)
    assert show["turn"]["status"] == "queued"  # released for a later retry, not lost
    # Nothing that did not finish is recorded as finished.
    models = [s for s in show["steps"] if s["kind"] == "model"]
    assert models and all(s["status"] == "intent" for s in models), show
    assert all(s["status"] != "done" for s in show["steps"])
    return out.stderr, show, str(show["turn"]["error"])


def test_upstream_unreachable(h: Harness) -> None:
    stderr, _, error = _failed_model_turn(h, ANTHROPIC_BASE_URL="http://127.0.0.1:9")
    assert "cannot reach the model endpoint http://127.0.0.1:9" in error, stderr
    assert "will be resumed" in error


@pytest.mark.parametrize("fault", ["malformed", "drop"])
def test_broken_upstream_stream(tmp_path: Path, fault: str) -> None:
    for h in claude_harness(tmp_path, fault=fault):
        stderr, _, error = _failed_model_turn(h)
        expected = "malformed stream" if fault == "malformed" else "stream broke off"
        assert expected in error, (error, stderr)
        # Claude Code then retried without streaming, and that reply broke as well.
        assert ("malformed reply" if fault == "malformed" else "broke off") in error
