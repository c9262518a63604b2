"""The serve tests' fixtures: a harness whose operator registers the demo tool set, and no
`serve` left running after a test (what they import is in ``serve_cases.py``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_cases import TOOL_SETS
from support import FIXTURES, STARTED_SERVES, Harness, make_harness


@pytest.fixture(autouse=True)
def _no_serve_left() -> Iterator[None]:
    yield
    while STARTED_SERVES:
        proc = STARTED_SERVES.pop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    for h in make_harness(tmp_path, FIXTURES / "serve.toml"):
        h.env["DURABLE_HARNESS_TOOL_SETS"] = TOOL_SETS
        yield h
