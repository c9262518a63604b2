"""codex bad input: one clear error each, nothing recorded as finished that did not finish."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from codex_cases import codex_harness, run_args
from support import Harness, ids_of
from test_claude_bad_input import no_turns, one_line_error

from durable_harness.adapters.codex.spec import CODEX_VERSION


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from codex_harness(tmp_path)


def test_host_folder_without_the_opt_in(h: Harness) -> None:
    out = h.cli(*run_args(h), DURABLE_HARNESS_UNSAFE_HOST_AGENT="")
    one_line_error(out, "codex", "--workspace docker", "UNSAFE_HOST_AGENT=1")
    no_turns(h)


@pytest.mark.parametrize("opt_in", ["", "1"])
def test_virtual_workspace_is_refused(h: Harness, opt_in: str) -> None:
    """The virtual workspace never hosts the CLI, with or without the developer opt-in."""
    args = run_args(h)
    args[args.index(str(h.tmp / "ws"))] = "virtual"
    one_line_error(h.cli(*args, DURABLE_HARNESS_UNSAFE_HOST_AGENT=opt_in), "--workspace docker")
    no_turns(h)


def test_a_missing_host_tools_file_is_refused(h: Harness) -> None:
    missing = f"{h.tmp / 'missing.py'}:TOOLS"
    one_line_error(h.cli(*run_args(h, "--tools", missing)), "missing.py")
    no_turns(h)


def test_wrong_cli_version(h: Harness, tmp_path: Path) -> None:
    fake = tmp_path / "codex"
    fake.write_text("#!/bin/sh\necho 'codex-cli 0.1.0'\n")
    fake.chmod(0o755)
    out = h.cli(*run_args(h), DURABLE_HARNESS_CODEX_BIN=str(fake))
    one_line_error(out, "0.1.0", CODEX_VERSION, "scripts/setup")
    no_turns(h)


def _failed_model_turn(h: Harness, **env: str) -> tuple[str, str]:
    out = h.cli(*run_args(h), DURABLE_HARNESS_CODEX_MAX_RETRIES="0", **env)
    assert out.returncode == 1, out.stderr
    show = h.show(ids_of(out)["turn"])
    assert show["turn"]["status"] == "queued"  # released for a later retry, not lost
    models = [s for s in show["steps"] if s["kind"] == "model"]
    assert models and all(s["status"] == "intent" for s in models), show
    assert all(s["status"] != "done" for s in show["steps"])
    return out.stderr, str(show["turn"]["error"])


def test_upstream_unreachable(h: Harness) -> None:
    stderr, error = _failed_model_turn(h, OPENAI_BASE_URL="http://127.0.0.1:9")
    assert "cannot reach the model endpoint http://127.0.0.1:9" in error, stderr
    assert "will be resumed" in error


@pytest.mark.parametrize("fault", ["malformed", "drop"])
def test_broken_upstream_stream(tmp_path: Path, fault: str) -> None:
    for h in codex_harness(tmp_path, fault=fault):
        stderr, error = _failed_model_turn(h)
        expected = "malformed stream" if fault == "malformed" else "stream broke off"
        assert expected in error, (error, stderr)
