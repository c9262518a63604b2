"""Cost accounting end to end: a turn started through a real ``serve``, run by real worker
processes against the scripted fake model, whose replies report a known usage
(``tests/fixtures/cost.toml``), priced by an operator's price file
(``DURABLE_HARNESS_PRICES``). ``show --json``, ``ls --json`` and the API report exactly
what the table gives; a turn crashed (``os._exit``) after three model steps and finished
by a second worker saved exactly those three calls, and the model saw none twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import DEMO, DEMO_PROMPT, DEMO_REPLY, FIXTURES, Harness, make_harness, start_serve

from durable_harness.core import events as ev
from durable_harness.harness.crash import CRASH_EXIT_CODE
from durable_harness.harness.events import read_all
from durable_harness.worlds import open_world

MODEL = "priced-model-2026-01-01"  # priced by the prefix "priced-model" of the file below
PRICES = {"priced-model": {"input": 2.0, "output": 10.0, "cache_read": 0.2, "cache_write": 2.5}}

# The scripted usage of the demo turn's five model steps (seq 0, 2, 4, 6, 8):
# (input, output, cache read, cache write), and each step's cost by hand from PRICES
# (USD per million tokens), written out rather than computed by the code under test.
USAGE = {
    0: (1000, 100, 0, 2000),  # 2000 + 1000 + 0 + 5000 = 8000 micro-dollars
    2: (200, 50, 3000, 0),  # 400 + 500 + 600 + 0 = 1500
    4: (300, 80, 3200, 100),  # 600 + 800 + 640 + 250 = 2290
    6: (150, 40, 3400, 0),  # 300 + 400 + 680 + 0 = 1380
    8: (100, 20, 3500, 0),  # 200 + 200 + 700 + 0 = 1100
}
STEP_COST = {0: 0.008, 2: 0.0015, 4: 0.00229, 6: 0.00138, 8: 0.0011}
TURN_COST = 0.01427
TOKENS = {
    "input_tokens": 1750,
    "output_tokens": 290,
    "cache_read_tokens": 13100,
    "cache_write_tokens": 2100,
}


@pytest.fixture
def cost_harness(tmp_path: Path) -> Iterator[Harness]:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(PRICES))
    for h in make_harness(tmp_path, FIXTURES / "cost.toml"):
        h.env["DURABLE_HARNESS_TOOL_SETS"] = json.dumps([f"demo={DEMO / 'tools.py'}:TOOLS"])
        h.env["DURABLE_HARNESS_MODEL"] = MODEL
        h.env["DURABLE_HARNESS_PRICES"] = str(prices)
        yield h


def approx(value: float) -> Any:
    return pytest.approx(value, rel=1e-9, abs=1e-12)


def start_turn(h: Harness) -> tuple[Any, str, str]:
    """A tenant's token, session and turn, through a real ``serve`` (left running)."""
    made = h.cli("token", "create", "--tenant", "acme")
    assert made.returncode == 0, made.stderr
    serve = start_serve(h)
    api = serve.http(made.stdout.strip())
    session = api.post("/v1/sessions", json={"agent": "builtin", "tools": ["demo"]})
    assert session.status_code == 201, session.text
    session_id = session.json()["session_id"]
    turn = api.post(f"/v1/sessions/{session_id}/turns", json={"prompt": DEMO_PROMPT})
    assert turn.status_code == 202, turn.text
    return (serve, api), session_id, turn.json()["turn_id"]


def test_a_turn_with_known_usage_costs_what_the_table_gives(cost_harness: Harness) -> None:
    h = cost_harness
    (serve, api), session_id, turn_id = start_turn(h)
    try:
        ran = h.cli("worker", "--until-idle")
        assert ran.returncode == 0, ran.stderr

        data = h.show(turn_id)
        turn = data["turn"]
        assert turn["status"] == "done" and turn["result"] == DEMO_REPLY
        models = {s["seq"]: s for s in data["steps"] if s["kind"] == "model"}
        assert sorted(models) == sorted(USAGE)
        for seq, (tokens_in, tokens_out, read, write) in USAGE.items():
            step = models[seq]
            assert step["model"] == MODEL  # the model the response named
            assert (
                step["input_tokens"],
                step["output_tokens"],
                step["cache_read_tokens"],
                step["cache_write_tokens"],
            ) == (tokens_in, tokens_out, read, write)
            assert step["cost_usd"] == approx(STEP_COST[seq])
        assert all(s["cost_usd"] is None for s in data["steps"] if s["kind"] == "tool")
        assert {k: turn[k] for k in TOKENS} == TOKENS
        assert turn["cost_usd"] == approx(TURN_COST)
        assert turn["saved_model_calls"] == 0 and turn["saved_usd"] == 0.0

        listed = h.cli("ls", "--json")
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        assert row["turn_id"] == turn_id and row["cost_usd"] == approx(TURN_COST)
        assert {k: row[k] for k in TOKENS} == TOKENS

        got = api.get(f"/v1/turns/{turn_id}").json()
        assert {k: got[k] for k in TOKENS} == TOKENS
        assert got["cost_usd"] == approx(TURN_COST)
        assert (got["saved_model_calls"], got["saved_usd"]) == (0, 0.0)
        ses = api.get(f"/v1/sessions/{session_id}").json()
        assert ses["cost_usd"] == approx(TURN_COST) and ses["cache_read_tokens"] == 13100
        (listed_session,) = api.get("/v1/sessions").json()["sessions"]
        assert listed_session["cost_usd"] == approx(TURN_COST)

        text = h.cli("show", turn_id)
        assert text.returncode == 0, text.stderr
        assert "cost $0.0143" in text.stdout and "saved 0 model call(s)" in text.stdout
    finally:
        api.close()
        serve.stop()


def test_the_savings_of_one_crash_are_the_price_of_the_calls_read_back(
    cost_harness: Harness,
) -> None:
    h = cost_harness
    (serve, api), session_id, turn_id = start_turn(h)
    try:
        # Step 4 is the third model call: the worker dies right after its outcome is
        # recorded, with three model steps (0, 2, 4) finished in the journal.
        crashed = h.cli("worker", "--until-idle", DURABLE_HARNESS_CRASH_AT="4:after_outcome")
        assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
        assert h.server.request_count == 3
        resumed = h.cli("worker", "--until-idle")  # the dead worker's turn, taken over at once
        assert resumed.returncode == 0, resumed.stderr

        # The model saw each request once: five calls in all, none repeated.
        assert h.server.request_count == 5
        assert h.repeated_requests() == {}

        data = h.show(turn_id)
        turn = data["turn"]
        assert turn["status"] == "done" and turn["deliveries"] == 2
        assert [s["how"] for s in data["steps"][:5]] == ["replayed"] * 5
        saved = STEP_COST[0] + STEP_COST[2] + STEP_COST[4]
        assert saved == approx(0.01179)
        assert turn["saved_model_calls"] == 3
        assert turn["saved_usd"] == approx(saved)
        assert turn["cost_usd"] == approx(TURN_COST)  # what was billed, once per call

        got = api.get(f"/v1/turns/{turn_id}").json()
        assert (got["saved_model_calls"], got["saved_usd"]) == (3, approx(saved))
        ses = api.get(f"/v1/sessions/{session_id}").json()
        assert (ses["saved_model_calls"], ses["saved_usd"]) == (3, approx(saved))

        # The read-backs are events of the second delivery's lease, one per step.
        world = open_world("local", data_dir=h.env["DURABLE_HARNESS_DATA_DIR"])
        try:
            replayed = [e for e in read_all(world, turn_id) if e.kind == ev.STEP_REPLAYED]
            epoch = world.get_turn(turn_id).epoch
        finally:
            world.close()
        assert [(e.key, e.data) for e in replayed] == [
            (
                f"step:{seq}:replayed:{epoch}",
                {
                    "seq": seq,
                    "epoch": epoch,
                    "kind": kind,
                    "name": name,
                    "status": "done",
                    "after": "lost",
                },
            )
            for seq, kind, name in [
                (0, "model", MODEL),
                (1, "tool", "check_refund"),
                (2, "model", MODEL),
                (3, "tool", "refund"),
                (4, "model", MODEL),
            ]
        ]
    finally:
        api.close()
        serve.stop()
