"""Issue 16's viewer in a real browser: Debian's Chromium (Playwright) against a real
`serve` on a local World, real workers and the scripted fake model
(``tests/fixtures/viewer.toml``).

1. A turn crashed by crash injection (the `never` refund ran, its outcome unrecorded) and
   finished by a second worker: the timeline shows the replayed steps, the possibly-ran
   step and the two deliveries (and the lost worker); a step opens its output; markup in
   the model's replies runs no script (escaping, and the CSP header is there); the page
   needs a token (a wrong one sends it back to the form) and never puts it in a URL;
   every control has a label and the legend spells out the colours; search and the
   status filter find the turn.
2. A running turn's new steps appear without a reload (the page reads the event stream),
   through a SIGKILL and restart of the `serve` it reads from (Last-Event-ID), and the
   Approve button wakes a turn waiting on a signal.
3. `durable-harness ui` serves the page and its printed token signs in; the page's SSE
   parser takes the framing a stream may arrive in.

Screenshots: ``artifacts/viewer/*.png`` (paths printed).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import httpx2
import pytest
from playwright.sync_api import Locator, Page, expect
from support import Harness, start_serve
from viewer_cases import check_labels, screenshot, sign_in

from durable_harness.client import Client
from durable_harness.core.types import StepStatus, TurnStatus
from durable_harness.core.world import World
from durable_harness.harness.crash import CRASH_EXIT_CODE
from durable_harness.server.auth import create_token
from durable_harness.worlds import open_world

REFUND_PROMPT = "Refund order 42, then note it."
REFUND_SEQ = 3  # model, check_refund, model, refund
PAGE = 20  # the page's list size
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def world_of(h: Harness) -> World:
    return open_world("local", data_dir=h.env["DURABLE_HARNESS_DATA_DIR"])


def wait_status(world: World, turn_id: str, status: TurnStatus, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while world.get_turn(turn_id).status is not status:
        assert time.monotonic() < deadline, (turn_id, world.get_turn(turn_id))
        time.sleep(0.1)


def start_turn(url: str, token: str, prompt: str, tools: str = "demo") -> str:
    with Client(url, token) as api:
        session = api.create_session("builtin", tools=[tools])
        return api.start_turn(session.session_id, prompt).turn_id


def open_turn(page: Page, turn_id: str) -> None:
    """Go to a turn the way a click does: the fragment changes, the page is not reloaded."""
    page.evaluate("(id) => { location.hash = '#/turn/' + encodeURIComponent(id); }", turn_id)
    expect(page.locator("#turn-title")).to_have_text(f"Turn {turn_id}")


def state_count(page: Page, state: str) -> int:
    return page.locator(f'#timeline button.step[data-state="{state}"]').count()


def check_paging(page: Page, newest: list[str]) -> None:
    """The sessions list pages through the API's cursors: the newest 20 first, the 21st
    (the refund's session, made first) on the next page, and back."""
    rows = page.locator("#session-list a.session-link")
    expect(rows).to_have_count(PAGE)
    assert set(rows.all_inner_texts()) == set(newest)
    expect(page.locator("#sessions-prev")).to_be_disabled()
    page.click("#sessions-next")
    expect(rows).to_have_count(1)
    expect(page.locator("#sessions-next")).to_be_disabled()
    page.click("#sessions-prev")
    expect(rows).to_have_count(PAGE)


def check_filters(page: Page, link: Locator) -> None:
    """Search and the status filter are the API's ``q`` and ``status``: they find the
    (done) turn, and a search or a status it does not match leaves the list empty."""
    page.fill("#search-input", "order 42")
    page.click("#search-submit")
    expect(link).to_be_visible()
    page.fill("#search-input", "no such prompt")
    page.click("#search-submit")
    expect(page.locator("#turn-list")).to_contain_text("No turns.")
    page.fill("#search-input", "")
    page.select_option("#status-filter", "running")
    expect(page.locator("#turn-list")).to_contain_text("No turns.")
    page.select_option("#status-filter", "done")
    expect(link).to_be_visible()


def test_a_crashed_and_resumed_turn_in_the_browser(
    harness: Harness, page: Page, processes: list[subprocess.Popen[str]]
) -> None:
    h = harness
    world = world_of(h)
    secret = create_token(world, "acme")[1]
    serve = start_serve(h)
    turn_id = start_turn(serve.url, secret, REFUND_PROMPT)
    with Client(serve.url, secret) as api:  # more sessions than one page (20) holds
        extra = [api.create_session("builtin").session_id for _ in range(PAGE)]
    crashed = h.popen("worker", DURABLE_HARNESS_CRASH_AT=f"{REFUND_SEQ}:after_run")
    processes.append(crashed)
    assert crashed.wait(timeout=120) == CRASH_EXIT_CODE
    processes.append(h.popen("worker"))  # takes the turn once the dead one's lease ran out
    wait_status(world, turn_id, TurnStatus.DONE)
    steps = world.load_steps(turn_id)
    assert steps[REFUND_SEQ].status is StepStatus.POSSIBLY_RAN
    assert len(h.ledger_lines()) == 1  # the refund ran once

    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    response = page.goto(f"{serve.url}/ui/")
    assert response is not None and response.ok
    assert response.headers["content-security-policy"] == CSP
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    # The data needs a token, on loopback too.
    assert httpx2.get(f"{serve.url}/v1/turns").status_code == 401

    # A wrong token: the server says 401 and the page asks again.
    expect(page.locator("#login")).to_be_visible()
    sign_in(page, "dh_0123456789abcdef_" + "x" * 40)
    expect(page.locator("#login-error")).to_contain_text("401")
    expect(page.locator("#login")).to_be_visible()
    screenshot(page, "token-form")

    sign_in(page, secret)
    link = page.locator(f'a.turn-link[href="#/turn/{turn_id}"]')
    expect(link).to_be_visible()
    assert check_labels(page) >= 8
    screenshot(page, "lists")

    check_paging(page, extra)
    check_filters(page, link)

    link.click()
    bars = page.locator("#timeline button.step")
    expect(bars).to_have_count(len(steps))
    # Steps 0-2 were recorded by the first delivery and read back by the second; the
    # refund possibly ran (not run again); the rest ran live in delivery 2.
    expect(page.locator('#timeline button.step[data-state="possibly-ran"]')).to_have_count(1)
    possibly = page.locator(f'#timeline button.step[data-seq="{REFUND_SEQ}"]')
    expect(possibly).to_have_attribute("data-state", "possibly-ran")
    expect(possibly).to_contain_text("possibly ran")
    assert state_count(page, "replayed") == REFUND_SEQ
    assert state_count(page, "live") == len(steps) - REFUND_SEQ - 1
    for seq in range(REFUND_SEQ):
        bar = page.locator(f'#timeline button.step[data-seq="{seq}"]')
        expect(bar).to_have_attribute("data-state", "replayed")
        assert "replayed" in (bar.get_attribute("aria-label") or "")
    expect(page.locator("#timeline .marker.delivery")).to_have_count(2)
    expect(page.locator("#timeline .marker.lost")).to_have_count(1)
    expect(page.locator("#markers-list")).to_contain_text("Delivery 2 started")
    expect(page.locator("#markers-list")).to_contain_text("Worker of delivery 1 died")
    legend = page.locator("#legend")
    for text in ("live", "replayed", "possibly ran", "failed", "waiting"):
        expect(legend).to_contain_text(text)
    # Cost and savings: what the page shows is the price table's figure for the steps,
    # and the savings are the price of the two model calls read back (steps 0 and 2).
    auth = {"Authorization": f"Bearer {secret}"}
    rows = httpx2.get(f"{serve.url}/v1/turns/{turn_id}/steps", headers=auth).json()["steps"]
    shown = httpx2.get(f"{serve.url}/v1/turns/{turn_id}", headers=auth).json()
    read_back = [r for r in rows[:REFUND_SEQ] if r["kind"] == "model"]
    assert len(read_back) == 2 and all(r["cost_usd"] for r in read_back)
    assert shown["saved_model_calls"] == 2
    assert shown["saved_usd"] == pytest.approx(sum(r["cost_usd"] for r in read_back))
    assert shown["cost_usd"] == pytest.approx(sum(r["cost_usd"] or 0 for r in rows))
    cost = page.locator("#turn-cost")
    expect(cost).to_contain_text("Tokens in")
    expect(cost).to_contain_text(usd(shown["cost_usd"]))
    expect(cost).to_contain_text(usd(shown["saved_usd"]))
    expect(cost).to_contain_text(re.compile(r"Model calls saved by replay\s*2"))
    screenshot(page, "crashed-turn-timeline")

    # A step opens its input and output.
    page.locator('#timeline button.step[data-seq="1"]').click()
    expect(page.locator("#step-title")).to_contain_text("check_refund")
    expect(page.locator("#step-output")).to_contain_text("not refunded")
    expect(page.locator("#step-input")).to_contain_text("42")
    possibly.click()
    expect(page.locator("#step-output")).to_contain_text("may or may not have taken effect")
    page.locator('#timeline button.step[data-seq="0"]').click()
    expect(page.locator("#step-output")).to_contain_text("<script>window.__xss = 3</script>")
    screenshot(page, "step-open")

    # The model's markup is shown as text and runs nothing. The CSP alone would keep
    # window.__xss unset; no image and no script element in the page is what shows the
    # page itself inserted the markup as text (escaping, not only the CSP).
    expect(page.locator("#turn-facts")).to_contain_text('<img src=x onerror="window.__xss = 1">')
    assert page.evaluate("() => window.__xss") is None
    assert page.evaluate("() => document.images.length") == 0
    assert page.evaluate("() => document.querySelectorAll('main script').length") == 0
    assert check_labels(page) >= len(steps) + 2  # the bars, Close step, the links

    # The session: its turns and its totals (summed from its turns where the API has none).
    page.locator("#turn-facts a").click()
    expect(page.locator("#session-view")).to_be_visible()
    expect(page.locator(f'#session-turns a[href="#/turn/{turn_id}"]')).to_be_visible()
    turn = world.get_turn(turn_id)
    expect(page.locator("#session-cost")).to_contain_text("Tokens in")
    tokens_in = sum(int(s.meta.get("input_tokens") or 0) for s in steps)
    expect(page.locator("#session-cost")).to_contain_text(str(tokens_in))
    assert turn.session_id in page.locator("#session-title").inner_text()
    screenshot(page, "session")

    # The token was never in a URL (every request the page made, and its own address).
    assert urls and all(secret not in url for url in [*urls, page.url])
    assert page.evaluate("() => document.cookie") == ""
    world.close()


def test_a_step_settled_by_its_check_in_the_browser(
    harness: Harness, page: Page, processes: list[subprocess.Popen[str]]
) -> None:
    """The refund with a check (demo_checked), crashed after it ran: the second worker's
    check finds it in the ledger, and the timeline marks the step settled, not possibly ran."""
    h = harness
    world = world_of(h)
    secret = create_token(world, "acme")[1]
    serve = start_serve(h)
    turn_id = start_turn(serve.url, secret, REFUND_PROMPT, tools="demo_checked")
    crashed = h.popen("worker", DURABLE_HARNESS_CRASH_AT=f"{REFUND_SEQ}:after_run")
    processes.append(crashed)
    assert crashed.wait(timeout=120) == CRASH_EXIT_CODE
    processes.append(h.popen("worker"))
    wait_status(world, turn_id, TurnStatus.DONE)
    assert world.load_steps(turn_id)[REFUND_SEQ].meta["settled"] == "done"
    assert len(h.ledger_lines()) == 1

    page.goto(f"{serve.url}/ui/")
    sign_in(page, secret)
    open_turn(page, turn_id)
    settled = page.locator(f'#timeline button.step[data-seq="{REFUND_SEQ}"]')
    expect(settled).to_have_attribute("data-state", "settled")
    expect(settled).to_contain_text("settled by its check")
    assert state_count(page, "possibly-ran") == 0
    expect(page.locator("#legend")).to_contain_text("settled by its check")
    settled.click()
    expect(page.locator("#step-output")).to_contain_text("refund issued for order 42")
    screenshot(page, "settled-step")


def test_a_running_turn_grows_through_a_serve_restart_and_a_waiting_turn_is_approved(
    harness: Harness, page: Page, processes: list[subprocess.Popen[str]]
) -> None:
    h = harness
    world = world_of(h)
    secret = create_token(world, "acme")[1]
    serve = start_serve(h)
    processes.append(h.popen("worker"))
    page.goto(f"{serve.url}/ui/")
    sign_in(page, secret)
    expect(page.locator("#lists")).to_be_visible()
    page.evaluate("() => { window.__sameDocument = true; }")  # gone if the page reloads
    resumed: list[str] = []
    page.on(
        "request",
        lambda r: (
            resumed.append(r.headers["last-event-id"]) if "last-event-id" in r.headers else None
        ),
    )

    # A running turn: its steps appear as the worker records them.
    counting = start_turn(serve.url, secret, "count slowly")
    open_turn(page, counting)
    bars = page.locator("#timeline button.step")
    expect(bars.first).to_be_visible()
    first_seen = bars.count()
    assert world.get_turn(counting).status is not TurnStatus.DONE
    screenshot(page, "running-turn")
    # The serve the page reads from dies and comes back on its address: the page's
    # stream reconnects with Last-Event-ID and goes on.
    os.killpg(serve.proc.pid, signal.SIGKILL)
    serve.proc.wait(timeout=30)
    serve = start_serve(h, port=serve.port)
    wait_status(world, counting, TurnStatus.DONE)
    final = len(world.load_steps(counting))
    expect(bars).to_have_count(final)
    assert first_seen < final == 7  # model, bash, model, bash, model, bash, model
    expect(page.locator("#turn-facts")).to_contain_text("Counted slowly to three.")
    # The last model step's text, as it streamed (text.delta events).
    expect(page.locator("#live-text-title")).to_have_text("Model text of step #6, attempt 1")
    expect(page.locator("#live-text-body")).to_have_text("Counted slowly to three.")
    expect(page.locator('#timeline button.step[data-state="live"]')).to_have_count(final)
    expect(page.locator("#timeline .marker.delivery")).to_have_count(1)
    assert page.evaluate("() => window.__sameDocument") is True
    assert resumed and all(int(n) > 0 for n in resumed), resumed
    expect(page.locator("#turn-facts")).to_contain_text("ended")  # the stream's state

    # A waiting turn: what it waits for, and the Approve button sends the signal.
    waiting = start_turn(serve.url, secret, "ask for approval")
    open_turn(page, waiting)
    panel = page.locator("#waiting-panel")
    expect(panel).to_be_visible()
    expect(page.locator("#waiting-text")).to_contain_text("signal 'approval' until")
    expect(page.locator('#timeline button.step[data-state="waiting"]')).to_have_count(1)
    assert world.get_turn(waiting).status is TurnStatus.WAITING
    assert check_labels(page) >= 6
    expect(page.get_by_role("button", name="Approve: send signal approval")).to_be_visible()
    expect(page.get_by_role("button", name="Reject: send signal approval")).to_be_visible()
    expect(page.get_by_label("Signal payload (JSON)")).to_be_visible()
    screenshot(page, "waiting-turn")
    page.fill("#signal-payload", '{"note": "ship it"}')
    page.click("#signal-approve")
    expect(page.locator("#signal-result")).to_contain_text("Sent signal approval (approved)")
    wait_status(world, waiting, TurnStatus.DONE)
    expect(page.locator("#turn-facts")).to_contain_text("The approval arrived; shipping.")
    expect(panel).to_be_hidden()
    [sent] = world.list_signals(waiting, "approval")
    assert json.loads(sent.payload) == {"approved": True, "payload": {"note": "ship it"}}
    assert page.evaluate("() => window.__sameDocument") is True
    screenshot(page, "approved-turn")
    world.close()


SSE_CASES_JS = """async () => {
  const { SseParser } = await import("./assets/api.js");
  const seen = [];
  const parser = new SseParser((e) => seen.push(e));
  // Split mid-line and mid-field, CRLF and LF, a comment, two data lines, no space.
  for (const piece of [": hi\\r\\nid: 7\\r\\nevent: text.de", "lta\\ndata: {\\"a\\"", ":1}\\n\\n",
                       "id:8\\ndata: x\\ndata: y\\n\\n: heartbeat\\n\\n",
                       "id: 9\\r", "\\ndata: z\\r", "\\n\\r\\n"]) parser.push(piece);
  return seen;
}"""


def test_the_ui_command_serves_the_page_and_its_sse_parser(
    harness: Harness, page: Page, processes: list[subprocess.Popen[str]]
) -> None:
    """`durable-harness ui`: the page at the URL it prints, signed in with the token it
    prints (an empty local World). Then the page's own SSE reader (EventSource cannot
    send the token): framing split across reads (a CRLF too), CRLF, comments and
    heartbeats, multi-line data."""
    ui = harness.popen("ui", "--port", "0")
    processes.append(ui)
    assert ui.stdout is not None
    lines = [ui.stdout.readline() for _ in range(3)]
    url = lines[0].split("the viewer is at ", 1)[1].strip()
    token = lines[2].strip()
    assert url.endswith("/ui/") and token.startswith("dh_") and token not in url
    page.goto(url)
    sign_in(page, token)
    expect(page.locator("#turn-list")).to_contain_text("No turns.")
    expect(page.locator("#session-list")).to_contain_text("No sessions.")
    assert page.evaluate(SSE_CASES_JS) == [
        {"id": "7", "event": "text.delta", "data": '{"a":1}'},
        {"id": "8", "event": "message", "data": "x\ny"},
        {"id": "9", "event": "message", "data": "z"},  # a CRLF split across reads
    ]


def usd(value: float) -> str:
    """Money as the page writes it (dom.js fmtUsd): 6 decimals under a cent, else 4."""
    return f"${value:.6f}" if 0 < value < 0.01 else f"${value:.4f}"
