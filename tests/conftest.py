"""Fixtures shared by every test. Tests never reach a provider: ANTHROPIC_BASE_URL points
at the bundled fake model (or at a closed loopback port) and ANTHROPIC_API_KEY is removed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import DEMO, Harness, make_harness


@pytest.fixture(autouse=True)
def _no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")  # closed: fails fast
    monkeypatch.delenv("DURABLE_HARNESS_CRASH_AT", raising=False)


@pytest.fixture
def demo_harness(tmp_path: Path) -> Iterator[Harness]:
    yield from make_harness(tmp_path, DEMO / "script.toml")
