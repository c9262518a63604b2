"""The operator's ceiling on tool timeouts (``DURABLE_HARNESS_MAX_TOOL_TIMEOUT``) in the
sandboxes that run without Docker: a model asking for 10**9 seconds gets the ceiling, and
the result says so. (Docker: tests/security/test_limits_escape.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_harness.core.errors import ConfigError
from durable_harness.core.sandbox import Sandbox
from durable_harness.core.settings import Settings
from durable_harness.sandbox import open_sandbox

CEILING = 1.0


@pytest.fixture(params=["virtual", "local"])
def box(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    spec = "virtual" if request.param == "virtual" else str(tmp_path / "ws")
    with open_sandbox(spec) as sandbox:
        yield sandbox


def test_a_larger_timeout_is_capped_and_said(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_HARNESS_MAX_TOOL_TIMEOUT", str(CEILING))
    started = time.monotonic()
    result = box.bash("sleep 30; echo AFTER-SLEEP", timeout=10**9)
    assert time.monotonic() - started < 10
    assert result.timed_out and result.exit_code == 124
    assert "AFTER-SLEEP" not in result.stdout
    assert "the timeout of 1e+09s was capped at 1s" in result.stderr, result
    assert "DURABLE_HARNESS_MAX_TOOL_TIMEOUT" in result.stderr


def test_a_timeout_under_the_ceiling_is_kept(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_HARNESS_MAX_TOOL_TIMEOUT", "30")
    result = box.bash("echo ok", timeout=5)
    assert result.exit_code == 0 and "ok" in result.stdout and "capped" not in result.stderr


def test_the_ceiling_defaults_to_600_seconds_and_must_be_positive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DURABLE_HARNESS_MAX_TOOL_TIMEOUT", raising=False)
    assert Settings.load().max_tool_timeout == 600
    monkeypatch.setenv("DURABLE_HARNESS_MAX_TOOL_TIMEOUT", "0")
    with pytest.raises(ConfigError, match="DURABLE_HARNESS_MAX_TOOL_TIMEOUT"):
        Settings.load()
