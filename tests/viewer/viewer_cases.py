"""What the viewer's browser tests share (a module of its own, not conftest: see
tests/server/serve_cases.py): the browser's path and flags, where screenshots go, and
the page-level checks."""

from __future__ import annotations

import json
import re
from pathlib import Path

from playwright.sync_api import Page, expect
from support import DEMO, ROOT

#: Debian's package (scripts/setup installs it): Playwright's own browser download
#: cannot reach its servers here, so it is pointed at this one.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # as root in CI; the page under test is ours
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Where the screenshots go (gitignored): CI keeps them as the test's artifacts.
ARTIFACTS = ROOT / "artifacts" / "viewer"
TOOL_SETS = json.dumps(
    [f"demo={DEMO / 'tools.py'}:TOOLS", f"demo_checked={DEMO / 'tools.py'}:TOOLS_CHECKED"]
)


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


#: Every control on the page (hidden ones too) that has no label element, aria-label,
#: aria-labelledby or text of its own: each must have one.
UNNAMED_CONTROLS_JS = """() =>
  [...document.querySelectorAll("button, input, select, textarea, a[href]")]
    .filter((e) => {
      if ((e.getAttribute("aria-label") || "").trim()) return false;
      const by = (e.getAttribute("aria-labelledby") || "").split(/\\s+/).filter(Boolean);
      if (by.some((id) => (document.getElementById(id)?.textContent || "").trim())) return false;
      if (e.labels && [...e.labels].some((l) => l.textContent.trim())) return false;
      if (["BUTTON", "A"].includes(e.tagName) && e.textContent.trim()) return false;
      return true;
    })
    .map((e) => e.outerHTML.slice(0, 160))
"""


def check_labels(page: Page) -> int:
    """Every control has a label in the DOM, and every visible one an accessible name as
    the browser computes it (Playwright's role queries); the number of visible controls."""
    assert page.evaluate(UNNAMED_CONTROLS_JS) == []
    seen = 0
    for role in ("button", "link", "textbox", "combobox", "searchbox"):
        controls = page.get_by_role(role)
        for i in range(controls.count()):
            expect(controls.nth(i)).to_have_accessible_name(re.compile(r"\S"))
            seen += 1
    return seen


def sign_in(page: Page, token: str) -> None:
    page.fill("#token-input", token)
    page.click("#token-submit")
