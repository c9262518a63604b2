"""opencode bad input: one clear error each (exit 2), no turn recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from opencode_cases import opencode_harness, run_args
from support import Harness

from durable_harness.adapters.opencode.spec import OPENCODE_VERSION


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from opencode_harness(tmp_path)


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
    out = h.cli(*run_args(h), DURABLE_HARNESS_OPENCODE_BIN=str(tmp_path / "no-opencode"))
    one_line_error(out, "DURABLE_HARNESS_OPENCODE_BIN", "not an executable")
    no_turns(h)


def test_wrong_cli_version(h: Harness, tmp_path: Path) -> None:
    fake = tmp_path / "opencode"
    fake.write_text("#!/bin/sh\necho '1.0.0'\n")
    fake.chmod(0o755)
    out = h.cli(*run_args(h), DURABLE_HARNESS_OPENCODE_BIN=str(fake))
    one_line_error(out, "1.0.0", OPENCODE_VERSION, "scripts/setup")
    no_turns(h)


def test_virtual_workspace_is_refused(h: Harness) -> None:
    out = h.cli("run", "--agent", "opencode", "--workspace", "virtual", "x")
    one_line_error(out, "--workspace docker", "--workspace DIR", "opencode")
    no_turns(h)


def test_bad_agent_config(h: Harness, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[replay]\ntools = { bash = "sometimes" }\n')
    ws = str(h.tmp / "ws")
    out = h.cli("run", "--agent", "opencode", "--workspace", ws, "--agent-config", str(bad), "x")
    one_line_error(out, "agent config", "replay.tools.bash")
    no_turns(h)
