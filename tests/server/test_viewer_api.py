"""The viewer's half of `serve`, as a real subprocess on the local World: a turn's steps
and one step's input and output (blobs fetched on demand, cut at 256 KiB), the
``status`` and ``q`` filters with keyset paging that stays correct under them, the
``/ui`` files with the viewer's headers, and ``durable-harness ui`` (its token printed
once, never in the URL, revoked at a clean exit)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from serve_cases import error_of, token, world_of
from support import (
    DEMO,
    DEMO_PROMPT,
    DEMO_REPLY,
    DEMO_TOOLS,
    STARTED_SERVES,
    Harness,
    Serve,
    ids_of,
    make_harness,
    start_serve,
)

from durable_harness.core.keys import blob_ref
from durable_harness.core.types import Step, StepStatus
from durable_harness.core.world import World
from durable_harness.runtime.turns import new_id
from durable_harness.server.ui import CSP

UI_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}
KIB = 1024


@pytest.fixture
def serve(harness: Harness) -> Iterator[Serve]:
    started = start_serve(harness, DURABLE_HARNESS_API_LIST_SCAN="10")
    try:
        yield started
    finally:
        started.stop()


def made_turn(world: World, tenant: str, session_id: str, prompt: str, status: str) -> str:
    """A turn of ``tenant`` brought to ``status`` through the World's own queue calls
    (no worker runs it: nothing else moves it on while the test looks)."""
    turn_id = new_id("turn")
    world.put_owner("turn", turn_id, tenant, time.time())
    world.create_turn(session_id, turn_id, prompt, {})
    if status == "queued":
        return turn_id
    lease = world.claim_turn(turn_id, "test", 0.05 if status == "dead" else 600.0)
    assert lease is not None
    if status == "waiting":
        world.suspend(lease, time.time() + 3600, "signal approve", "approve")
    elif status == "done":
        world.complete_turn(lease, "ok")
    elif status == "failed":
        world.fail_turn(lease, "boom: the agent failed")
    elif status == "cancelled":
        world.cancel_turn(lease, "stopped")
    elif status == "dead":
        time.sleep(0.1)  # the lease runs out; a second delivery is past max_attempts 1
        kept, world.max_attempts = world.max_attempts, 1
        try:
            assert world.claim_turn(turn_id, "test", 600.0) is None
        finally:
            world.max_attempts = kept
    return turn_id


def made_session(world: World, tenant: str) -> str:
    session_id = new_id("ses")
    world.put_owner("session", session_id, tenant, time.time())
    world.create_session(session_id, {"agent": "builtin"})
    return session_id


def walk(api: httpx2.Client, path: str, field: str, **params: Any) -> list[list[str]]:
    """Every page of a list route, following the cursors: the ids on each page."""
    pages: list[list[str]] = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = api.get(path, params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        key = "turn_id" if field == "turns" else "session_id"
        pages.append([item[key] for item in body[field]])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 50, "the cursors go on forever"


def test_the_steps_of_a_real_turn_and_who_may_read_them(harness: Harness, serve: Serve) -> None:
    """A turn the built-in agent ran (a real worker, the fake model): its seven steps in
    order, each live, recorded by delivery 1, with times and the model steps' tokens; a
    model step's detail is the model's reply, a tool step's the call and its result.
    Another tenant gets the 404 of an unknown turn; no token, a token in the query string
    or a cookie get 401; a cross-origin request gets no CORS header."""
    with world_of(harness) as world:
        acme, other = token(world, "acme"), token(world, "other")
    with serve.http(acme) as api, serve.http(other) as stranger, serve.http() as anon:
        sid = api.post("/v1/sessions", json={"agent": "builtin"}).json()["session_id"]
        tid = api.post(f"/v1/sessions/{sid}/turns", json={"prompt": "count to three"}).json()[
            "turn_id"
        ]
        worker = harness.cli("worker", "--until-idle", timeout=120)
        assert worker.returncode == 0, worker.stderr

        steps = api.get(f"/v1/turns/{tid}/steps").json()["steps"]
        assert [s["seq"] for s in steps] == list(range(7))
        assert [s["kind"] for s in steps] == ["model", "tool"] * 3 + ["model"]
        assert {(s["status"], s["how"], s["delivery"], s["epoch"]) for s in steps} == {
            ("done", "live", 1, 1)
        }
        for s in steps:
            assert s["started_at"] <= s["finished_at"] and s["duration"] >= 0
            assert set(s) >= {"key", "attempts", "cache_read_tokens", "cost_usd"}
        assert all(s["input_tokens"] > 0 and s["output_tokens"] > 0 for s in steps[::2])

        model = api.get(f"/v1/turns/{tid}/steps/0").json()
        assert (model["seq"], model["kind"], model["status"]) == (0, "model", "done")
        assert "Counting." in model["output"] and model["truncated"] is False
        assert model["output_bytes"] == len(model["output"].encode())
        tool = api.get(f"/v1/turns/{tid}/steps/1").json()
        assert tool["kind"] == "tool" and tool["name"] == "bash"
        assert "echo step-1" in tool["input"] and "step-1" in tool["output"]

        missing = error_of(api.get(f"/v1/turns/{tid}/steps/99"))
        assert missing[:2] == (404, "step_not_found")
        assert error_of(api.get(f"/v1/turns/{tid}/steps/-1"))[0] == 422
        for path in (f"/v1/turns/{tid}/steps", f"/v1/turns/{tid}/steps/0"):
            theirs = error_of(stranger.get(path))
            unknown = error_of(stranger.get(path.replace(tid, "turn_00000000000000000000")))
            assert theirs[:2] == unknown[:2] == (404, "turn_not_found")
            assert unknown[2].replace("turn_00000000000000000000", tid) == theirs[2]
            assert error_of(anon.get(path))[0] == 401
            # The token counts only in the Authorization header.
            for name in ("token", "access_token", "authorization"):
                assert error_of(anon.get(path, params={name: acme}))[0] == 401
            cookies = {"token": acme, "authorization": f"Bearer {acme}"}
            assert error_of(anon.get(path, headers={"Cookie": _cookie(cookies)}))[0] == 401

        # No CORS: a page of another origin can neither read an answer nor preflight.
        hostile = {"Origin": "https://evil.example"}
        read = api.get(f"/v1/turns/{tid}/steps", headers=hostile)
        assert read.status_code == 200
        assert not [h for h in read.headers if h.lower().startswith("access-control-")]
        preflight = anon.options(
            f"/v1/turns/{tid}/signals/approve",
            headers={**hostile, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization"},
        )  # fmt: skip
        assert preflight.status_code == 405
        assert not [h for h in preflight.headers if h.lower().startswith("access-control-")]


def _cookie(values: dict[str, str]) -> str:
    return "; ".join(f"{k}={v.replace(' ', '%20')}" for k, v in values.items())


def test_a_crashed_and_resumed_turns_steps_say_how_each_came(tmp_path: Path) -> None:
    """The demo turn, its worker killed by crash injection right after the refund's
    intent (a ``never`` tool) and resumed by a second process: the steps recorded by the
    first delivery are ``replayed`` (delivery 1), the refund ``not re-run``
    (``possibly_ran``, its output the possibly-ran message), the rest ``live`` by
    delivery 2. A turn made outside serve is an operator's to see (a tenant: 404)."""
    for h in make_harness(tmp_path, DEMO / "script.toml"):
        crashed = h.cli(
            "run", "--tools", DEMO_TOOLS, DEMO_PROMPT, DURABLE_HARNESS_CRASH_AT="3:after_intent"
        )
        assert crashed.returncode == 86, crashed.stderr
        tid = ids_of(crashed)["turn"]
        resumed = h.cli("resume", tid)
        assert resumed.returncode == 0 and resumed.stdout.strip() == DEMO_REPLY, resumed.stderr
        with world_of(h) as world:
            op, acme = token(world, "ops", operator=True), token(world, "acme")
        serve = start_serve(h)
        try:
            with serve.http(op) as api, serve.http(acme) as tenant:
                steps = api.get(f"/v1/turns/{tid}/steps").json()["steps"]
                hows = [(s["seq"], s["how"], s["delivery"]) for s in steps]
                assert hows[:4] == [
                    (0, "replayed", 1), (1, "replayed", 1), (2, "replayed", 1),
                    (3, "not re-run", 2),
                ]  # fmt: skip
                assert {(how, delivery) for _seq, how, delivery in hows[4:]} == {("live", 2)}
                assert steps[3]["status"] == "possibly_ran" and steps[3]["name"] == "refund"
                detail = api.get(f"/v1/turns/{tid}/steps/3").json()
                assert "may or may not have taken effect" in detail["output"]
                done = api.get("/v1/turns", params={"status": "done", "q": "refund"}).json()
                assert [t["turn_id"] for t in done["turns"]] == [tid]
                assert error_of(tenant.get(f"/v1/turns/{tid}/steps"))[0] == 404
        finally:
            serve.stop()


def test_a_step_detail_fetches_blobs_and_cuts_at_256_kib(harness: Harness, serve: Serve) -> None:
    """Steps recorded with their input and output in blobs: a 100 KiB output comes whole;
    a 300 KiB one is cut to the 256 KiB before it (on a character boundary: a two-byte
    letter the cut would split is left out), ``truncated`` true and ``output_bytes`` its
    whole size; an intent without outcome has no output."""
    with world_of(harness) as world:
        acme = token(world, "acme")
        sid = made_session(world, "acme")
        tid = new_id("turn")
        world.put_owner("turn", tid, "acme", time.time())
        world.create_turn(sid, tid, "read big files", {})
        lease = world.claim_turn(tid, "test", 600.0)
        assert lease is not None
        whole = json.dumps({"content": "a" * (100 * KIB)})
        # The opening quote puts every "é" (two bytes) on an odd offset: 256 KiB splits one.
        big = json.dumps("é" * (150 * KIB), ensure_ascii=False)
        call = json.dumps({"path": "big.txt", "pad": "x" * (70 * KIB)})
        for seq, output in ((0, whole), (1, big), (2, None)):
            world.insert_intent(
                Step(
                    turn_id=tid, seq=seq, key=f"k{seq}", kind="tool", name="read",
                    input_hash="0" * 64, input=blob_ref(world.put_blob(call.encode())),
                    epoch=lease.epoch, started_at=time.time(),
                )
            )  # fmt: skip
            if output is not None:
                digest = world.put_blob(output.encode())
                meta = {"turn_attempt": lease.attempt}
                world.finish_step(tid, seq, lease.epoch, StepStatus.DONE, None, digest, meta)
    with serve.http(acme) as api:
        first = api.get(f"/v1/turns/{tid}/steps/0").json()
        assert first["output"] == whole and first["truncated"] is False
        assert first["input"] == call and first["input_bytes"] == len(call)
        assert first["output_bytes"] == len(whole)

        cut = api.get(f"/v1/turns/{tid}/steps/1").json()
        assert cut["truncated"] is True
        assert cut["output_bytes"] == len(big.encode())
        assert cut["output"] == '"' + "é" * (128 * KIB - 1)
        assert len(cut["output"].encode()) == 256 * KIB - 1

        open_step = api.get(f"/v1/turns/{tid}/steps/2").json()
        assert (open_step["status"], open_step["output"], open_step["output_bytes"]) == (
            "intent", None, 0,
        )  # fmt: skip
        rows = api.get(f"/v1/turns/{tid}/steps").json()["steps"]
        assert [r["how"] for r in rows] == ["live", "live", "running"]
        with world_of(harness) as world:
            world.suspend(lease, time.time() + 3600, "signal approve", "approve")
        rows = api.get(f"/v1/turns/{tid}/steps").json()["steps"]
        assert [r["how"] for r in rows] == ["live", "live", "waiting"]


STATUSES = ("queued", "running", "waiting", "done", "failed", "cancelled", "dead")


def test_status_and_q_filter_the_lists_and_paging_stays_correct(
    harness: Harness, serve: Serve
) -> None:
    """One turn in each status (the dead one dead-lettered by the World after its one
    delivery ran out): each ``status`` lists its own (``failed`` the dead-lettered one
    too, ``dead`` only it); an unknown one is 422. ``q`` finds a turn by its prompt in
    any case, by its turn id and by its session id, and a session by its id or a prompt.
    With this serve's scan cap of 10, 25 turns of which 7 match are paged 3 at a time:
    each match once, newest first, some pages ended early by the cap, the last with no
    cursor; the operator's view pages the same way."""
    with world_of(harness) as world:
        acme, op = token(world, "acme"), token(world, "ops", operator=True)
        other = token(world, "other")
        sid = made_session(world, "acme")
        by_status = {
            s: made_turn(world, "acme", sid, f"Prompt for the {s.upper()} turn", s)
            for s in STATUSES
        }
        dead = world.get_turn(by_status["dead"])
        assert dead.status.value == "failed" and (dead.error or "").startswith("dead-lettered")
        second = made_session(world, "acme")
        needle = made_turn(world, "acme", second, "Refund ORDER 42 twice", "done")
    with serve.http(acme) as api, serve.http(other) as stranger:
        for status in STATUSES:
            listed = api.get("/v1/turns", params={"status": status}).json()["turns"]
            want = {by_status[status]}
            if status == "failed":
                want.add(by_status["dead"])
            if status == "done":
                want.add(needle)
            assert {t["turn_id"] for t in listed} == want, status
        dead_row = api.get(f"/v1/turns/{by_status['dead']}").json()
        assert (dead_row["status"], dead_row["dead_lettered"]) == ("failed", True)
        assert api.get(f"/v1/turns/{by_status['failed']}").json()["dead_lettered"] is False
        assert error_of(api.get("/v1/turns", params={"status": "lost"}))[:2] == (
            422, "unknown_status",
        )  # fmt: skip

        def turns(**params: Any) -> list[str]:
            return [t["turn_id"] for t in api.get("/v1/turns", params=params).json()["turns"]]

        assert turns(q="order 42") == [needle]
        assert turns(q=needle[-8:].upper()) == [needle]
        assert turns(q=second) == [needle]
        assert turns(q="waiting turn", status="waiting") == [by_status["waiting"]]
        assert turns(q="waiting turn", status="done") == []
        assert len(turns(q=sid)) == len(STATUSES)

        def sessions(q: str) -> list[str]:
            page = api.get("/v1/sessions", params={"q": q}).json()["sessions"]
            return [s["session_id"] for s in page]

        assert sessions("REFUND order") == [second]
        assert sessions(sid[-10:]) == [sid]
        assert sessions("builtin") == [second, sid]
        assert sessions("nothing like it") == []
        assert stranger.get("/v1/turns", params={"q": "order 42"}).json()["turns"] == []
        assert stranger.get("/v1/sessions", params={"q": "refund"}).json()["sessions"] == []

    with world_of(harness) as world:
        third = made_session(world, "acme")
        paged = [
            made_turn(world, "acme", third, f"paging {i}", "done" if i % 4 == 0 else "queued")
            for i in range(25)
        ]
    matches = [t for i, t in enumerate(paged) if i % 4 == 0][::-1]  # newest first
    with serve.http(acme) as api, serve.http(op) as ops:
        for client in (api, ops):
            pages = walk(client, "/v1/turns", "turns", q="paging", status="done", limit=3)
            assert [t for page in pages for t in page] == matches
            assert all(len(page) <= 3 for page in pages)
            assert any(len(page) < 3 for page in pages[:-1]), "the scan cap ended a page"
        # Unfiltered paging is the keyset of before: full pages, every turn once.
        pages = walk(api, "/v1/turns", "turns", limit=7)
        flat = [t for page in pages for t in page]
        assert len(flat) == len(set(flat)) == len(STATUSES) + 1 + 25
        assert [len(page) for page in pages] == [7, 7, 7, 7, 5]


def test_the_ui_files_carry_the_viewers_headers(harness: Harness, serve: Serve) -> None:
    """``/ui`` redirects to ``/ui/`` (the page, no token needed), assets come from the
    package folder, and every answer under ``/ui`` (the redirect, the page, an asset, a
    404, a 405) carries the CSP, nosniff and no-referrer; ``/v1`` still needs a token and
    is not given the page's headers; nothing outside the folder is served."""
    with serve.http() as anon:
        moved = anon.get("/ui", follow_redirects=False)
        assert (moved.status_code, moved.headers["location"]) == (307, "/ui/")
        page = anon.get("/ui/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "<html" in page.text
        asset = anon.get("/ui/assets/index.html")
        assert asset.status_code == 200 and asset.text == page.text
        again = anon.get("/ui/assets/index.html", headers={"If-None-Match": asset.headers["etag"]})
        assert again.status_code == 304
        answers = [
            moved,
            page,
            asset,
            again,
            anon.get("/ui/assets/no-such.js"),
            anon.get("/ui/assets/../ui.py"),
            anon.get("/ui/assets/%2e%2e/ui.py"),
            anon.get("/ui/nothing-here"),
            anon.post("/ui/", json={}),
        ]
        assert [r.status_code for r in answers[4:]] == [404, 404, 404, 404, 405]
        for response in answers:
            for name, value in UI_HEADERS.items():
                assert response.headers.get(name) == value, (response.url, name)
            assert not [h for h in response.headers if h.lower().startswith("access-control-")]
        api = anon.get("/v1/turns")
        assert error_of(api)[0] == 401
        assert "content-security-policy" not in api.headers


def test_the_ui_command_prints_a_token_once_and_revokes_it(harness: Harness) -> None:
    """`durable-harness ui` as a real process on the harness's World folder (--world
    PATH): it prints the page's URL (no token in it) and then an operator token labelled
    ui, which reads every tenant's turns; a second ui on its port exits 2 saying so (its
    token revoked); a clean exit (SIGTERM) revokes the first's; --help says so."""
    helped = harness.cli("ui", "--help")
    assert helped.returncode == 0 and "revokes" in helped.stdout and "127.0.0.1" in helped.stdout
    folder = harness.env["DURABLE_HARNESS_DATA_DIR"]
    with world_of(harness) as world:
        sid = made_session(world, "acme")
        tid = made_turn(world, "acme", sid, "a turn of acme", "done")
    env = {k: v for k, v in harness.env.items() if k != "DURABLE_HARNESS_DATA_DIR"}
    proc = subprocess.Popen(
        [*_cli(), "ui", "--world", folder, "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    STARTED_SERVES.append(proc)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    assert lines[0].startswith("ui: the viewer is at http://127.0.0.1:"), lines
    url = lines[0].split(" at ", 1)[1].strip()
    secret = lines[2].strip()
    assert url.endswith("/ui/") and secret.startswith("dh_") and secret not in url
    assert "shown once" in lines[1]
    base = url.removesuffix("/ui/")
    with httpx2.Client(base_url=base, timeout=30) as http:
        assert http.get("/ui/").status_code == 200
        auth = {"Authorization": f"Bearer {secret}"}
        listed = http.get("/v1/turns", headers=auth).json()["turns"]
        assert [t["turn_id"] for t in listed] == [tid]
        with world_of(harness) as world:
            made = [t for t in world.list_tokens() if t.label == "ui"]
            assert len(made) == 1 and made[0].operator and made[0].revoked_at is None
            assert made[0].token_id in lines[1]
        # A second ui on the same port: one line saying what to do, its token revoked.
        busy = harness.cli("ui", "--port", base.rsplit(":", 1)[1], timeout=60)
        assert busy.returncode == 2 and "cannot listen on" in busy.stderr, busy.stderr
        assert "Traceback" not in busy.stderr
        with world_of(harness) as world:
            second = [t for t in world.list_tokens() if t.label == "ui"][1:]
            assert len(second) == 1 and second[0].revoked_at is not None
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "revoked" in err
        assert secret not in err
        with world_of(harness) as world:
            assert world.get_token(made[0].token_id).revoked_at is not None


def _cli() -> list[str]:
    return [sys.executable, "-m", "durable_harness.cli"]
