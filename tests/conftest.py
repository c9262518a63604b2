"""Fixtures shared by every test. Tests never reach a provider: ANTHROPIC_BASE_URL points
at the bundled fake model (or at a closed loopback port) and ANTHROPIC_API_KEY is removed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import postgres_server
import pytest
from support import DEMO, Harness, make_harness


@pytest.fixture(autouse=True)
def _no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")  # closed: fails fast
    monkeypatch.delenv("DURABLE_HARNESS_CRASH_AT", raising=False)


@pytest.fixture(scope="session")
def postgres() -> Iterator[postgres_server.PostgresServer]:
    """The run's PostgreSQL server (fsync off, 127.0.0.1, a free port, its own temp folder),
    started on first use and stopped by pg_ctl (or PID) when the session ends."""
    if postgres_server.find_bindir() is None:
        pytest.skip("PostgreSQL binaries not found: run scripts/setup")
    yield postgres_server.shared_server()
    postgres_server.stop_shared()


@pytest.fixture
def demo_harness(tmp_path: Path) -> Iterator[Harness]:
    yield from make_harness(tmp_path, DEMO / "script.toml")
