"""The viewer's Approve and Reject buttons on a turn parked at an approval step: the page
shows the step and the call it holds back, and Reject (with a reason) records the
decision through ``POST /v1/turns/{id}/steps/{seq}/approval``; the gated tool never runs,
and the model's reply quotes the reason (``tests/fixtures/approval.toml``)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from support import FIXTURES, Harness, make_harness, start_serve
from viewer_cases import check_labels, screenshot, sign_in

from durable_harness.client import Client
from durable_harness.core.types import TurnStatus
from durable_harness.server.auth import create_token
from durable_harness.worlds import open_world

TOOLS = FIXTURES / "approval_tools.py"


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    for h in make_harness(tmp_path, FIXTURES / "approval.toml", lease="2"):
        h.env["APPROVAL_RUNS"] = str(tmp_path / "refunds.txt")
        h.env["DURABLE_HARNESS_TOOL_SETS"] = json.dumps([f"approval={TOOLS}:TOOLS"])
        yield h


def test_the_reject_button_decides_an_approval_step(
    harness: Harness, page: Page, processes: list[subprocess.Popen[str]]
) -> None:
    h = harness
    with open_world("local", data_dir=h.env["DURABLE_HARNESS_DATA_DIR"]) as world:
        token, secret = create_token(world, "acme")
        serve = start_serve(h, DURABLE_HARNESS_API_APPROVER_TOKENS=token.token_id)
        processes.append(h.popen("worker"))
        with Client(serve.url, secret) as api:
            session = api.create_session("builtin", tools=["approval"])
            turn_id = api.start_turn(session.session_id, "Refund orders 1 and 7").turn_id
        page.goto(f"{serve.url}/ui/#/turn/{turn_id}")
        sign_in(page, secret)
        expect(page.locator("#waiting-panel")).to_be_visible()
        expect(page.locator("#waiting-text")).to_contain_text("approval of step 2 (refund)")
        expect(page.locator('#timeline button.step[data-state="waiting"]')).to_have_count(1)
        expect(page.get_by_label("Signal payload (JSON)")).to_be_hidden()
        check_labels(page)
        reject = page.get_by_role("button", name="Reject: run refund (step 2)")
        expect(page.get_by_role("button", name="Approve: run refund (step 2)")).to_be_visible()
        page.get_by_label("Reason (the model reads it)").fill("over the daily limit")
        screenshot(page, "approval-waiting")
        reject.click()
        expect(page.locator("#signal-result")).to_contain_text("Rejected step 2.")
        expect(page.locator("#turn-facts")).to_contain_text(
            "order 7 was rejected: over the daily limit", timeout=90_000
        )
        assert world.get_turn(turn_id).status is TurnStatus.DONE
        runs = Path(h.env["APPROVAL_RUNS"]).read_text().split()
        assert runs[::2] == ["1"]  # order 7's refund never ran
        [decision] = world.list_signals(turn_id, "dh.approval.2")
        assert json.loads(decision.payload)["by"] == f"token:{token.token_id} (acme)"
