"""The viewer's browser tests: Debian's Chromium driven by Playwright, one browser per
module, a harness whose fake model plays ``tests/fixtures/viewer.toml``, and no `serve`
or worker left running after a test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from support import FIXTURES, STARTED_SERVES, Harness, make_harness
from viewer_cases import CHROMIUM, CHROMIUM_ARGS, TOOL_SETS

# A worker on a busy CI machine may take seconds to claim a turn: page assertions wait.
expect.set_options(timeout=30_000)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run scripts/setup (as root)"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, f"the page threw: {errors}"


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    for h in make_harness(tmp_path, FIXTURES / "viewer.toml", lease="2"):
        h.env["DURABLE_HARNESS_TOOL_SETS"] = TOOL_SETS
        yield h


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Workers a test starts (killed as a group at its end), and every `serve`."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in [*started, *STARTED_SERVES]:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    STARTED_SERVES.clear()
