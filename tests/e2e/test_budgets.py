"""Spend limits end to end (harness/budget.py): real worker processes, the real CLI and
``serve``, the scripted fake model whose every reply reports 1100 tokens
(``tests/fixtures/budget_loop.toml``: a turn that never ends by itself).

* a turn crashed (``os._exit``) after the call at every model step stops at its budget
  within one model call, the lost calls counted;
* a session's budget spans its turns and is read from the World by a new worker; the
  session goes on with a raised limit in a new turn;
* two turns of one tenant on two workers at once overshoot the tenant's budget by at
  most one model call per worker.

The figures are worked out by hand in the comments (``max_tokens`` is 1000: a lost call
counts the tokens of the model step before it, 1100, plus 1000; the first one 1000).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import FIXTURES, Harness, ids_of, make_harness, start_serve

from durable_harness.harness.crash import CRASH_EXIT_CODE

CALL = 1100  # every scripted reply's usage: 1000 in, 100 out
LOOP = "Write n.txt, and go on writing it."


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    for harness in make_harness(tmp_path, FIXTURES / "budget_loop.toml"):
        harness.env["DURABLE_HARNESS_MAX_TOKENS"] = "1000"
        yield harness


def enqueue(h: Harness, *args: str) -> dict[str, str]:
    out = h.cli("run", "--detach", *args)
    assert out.returncode == 0, out.stderr
    return ids_of(out)


def test_a_turn_crashed_at_every_model_step_stops_within_one_call(h: Harness) -> None:
    turn = enqueue(h, "--budget-turn-tokens", "9000", LOOP)["turn"]
    codes = []
    for seq in range(0, 40, 2):  # model steps are 0, 2, 4, ... (a write after each)
        ran = h.cli("worker", "--until-idle", DURABLE_HARNESS_CRASH_AT=f"{seq}:after_run")
        codes.append(ran.returncode)
        if ran.returncode != CRASH_EXIT_CODE:
            assert ran.returncode == 0, ran.stderr
            break
    # Spend counted before each call (a crash after every call's return):
    #   step 0: 0; again after the crash: 1000 (lost) -> done 1100 + 1000 = 2100
    #   step 2: 2100; again: 2100 + 2100 (lost: 1100 + 1000) -> 2100 + 3200 = 5300
    #   step 4: 5300; again: 7400 -> 8500;  step 6: 8500; again: 8500 + 2100 = 10600 >= 9000
    assert codes == [CRASH_EXIT_CODE] * 4 + [0]
    assert h.server.request_count == 7  # steps 0, 2, 4 twice, step 6 once
    data = h.show(turn)
    assert data["turn"]["status"] == "failed"
    assert data["turn"]["budget_exceeded"] == {
        "scope": "turn",
        "unit": "tokens",
        "spent": 10600,
        "limit": 9000,
    }
    models = [(s["seq"], s["status"], s["attempts"]) for s in data["steps"] if s["kind"] == "model"]
    assert models == [(0, "done", 2), (2, "done", 2), (4, "done", 2), (6, "intent", 1)]
    # Within one model call: the last call made began at 8500, under the limit; what was
    # billed (7 calls) is below the limit plus one call.
    assert 8500 < 9000 and h.server.request_count * CALL < 9000 + CALL
    text = h.cli("show", turn)
    assert "budget exceeded: turn tokens 10600 of 9000" in text.stdout, text.stdout


def test_a_sessions_budget_spans_its_turns_and_a_worker_restart(h: Harness) -> None:
    limit = ("--budget-session-tokens", "5000")
    first = enqueue(h, *limit, LOOP)
    # Five calls of 1100 (the fifth begins at 4400); the worker dies right after the fifth
    # outcome is recorded: the next worker reads 5500 from the World and calls nothing.
    crashed = h.cli("worker", "--until-idle", DURABLE_HARNESS_CRASH_AT="8:after_outcome")
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert h.server.request_count == 5
    resumed = h.cli("worker", "--until-idle")
    assert resumed.returncode == 0, resumed.stderr
    assert h.server.request_count == 5
    exceeded = {"scope": "session", "unit": "tokens", "spent": 5500, "limit": 5000}

    # The session's next turn, with the same limit: spent already, it makes no call.
    session = first["session"]
    second = h.cli("run", "--session", session, *limit, "Say done.")
    assert second.returncode != 0
    assert h.server.request_count == 5
    # A raised limit, in a new turn: the session goes on.
    third = h.cli("run", "--session", session, "--budget-session-tokens", "7000", "Say done.")
    assert third.returncode == 0, third.stderr
    assert third.stdout.strip().endswith("done")
    assert h.server.request_count == 6

    listed = h.cli("ls")
    assert listed.stdout.count("budget exceeded") == 2, listed.stdout
    rows = {r["turn_id"]: r for r in json.loads(h.cli("ls", "--json").stdout)}
    assert rows[first["turn"]]["budget_exceeded"] == exceeded
    assert rows[ids_of(second)["turn"]]["budget_exceeded"] == exceeded
    assert rows[ids_of(third)["turn"]]["budget_exceeded"] is None


def test_two_workers_overshoot_a_tenants_budget_by_one_call_each(h: Harness) -> None:
    h.env["DURABLE_HARNESS_BUDGET_TENANT_TOKENS"] = "6000"
    made = h.cli("token", "create", "--tenant", "acme")
    assert made.returncode == 0, made.stderr
    serve = start_serve(h)
    api = serve.http(made.stdout.strip())
    try:
        turns = []
        for _ in range(2):
            session = api.post("/v1/sessions", json={"agent": "builtin"})
            assert session.status_code == 201, session.text
            sid = session.json()["session_id"]
            # A tenant may lower a turn's limit, never raise one above the operator's.
            assert api.post(f"/v1/sessions/{sid}/turns", json={"prompt": LOOP}).status_code == 202
            turns.append(api.get(f"/v1/sessions/{sid}/turns").json()["turns"][0]["turn_id"])
        workers = [h.popen("worker", "--until-idle", "--quiet") for _ in range(2)]
        for worker in workers:
            _, err = worker.communicate(timeout=120)
            assert worker.returncode == 0, err
        # Each check counts the other worker's call in flight (an intent: 1000 or 2100),
        # so neither begins a call once 5500 (5 calls) are spent and seen: at most
        # 5 + 1 + 1 calls; at least 4 finished + 1 in flight before the first stop.
        assert 5 <= h.server.request_count <= 7, h.server.request_count
        assert h.server.request_count * CALL < 6000 + 2 * CALL
        for turn_id in turns:
            got = api.get(f"/v1/turns/{turn_id}").json()
            assert got["status"] == "failed", got
            assert got["budget_exceeded"]["scope"] == "tenant", got
            assert got["budget_exceeded"]["limit"] == 6000
            assert got["budget_exceeded"]["spent"] >= 6000
    finally:
        api.close()
        serve.stop()


def test_a_tenants_own_budget_overrides_the_default(h: Harness) -> None:
    """DURABLE_HARNESS_TENANT_BUDGETS gives one tenant its own limit (the operator's, in
    the workers' environment): acme stops at its 3000 tokens, globex at the default 5000;
    the error names where acme's limit comes from."""
    h.env["DURABLE_HARNESS_BUDGET_TENANT_TOKENS"] = "5000"
    h.env["DURABLE_HARNESS_TENANT_BUDGETS"] = json.dumps({"acme": {"tokens": 3000}})
    tokens = {}
    for tenant in ("acme", "globex"):
        made = h.cli("token", "create", "--tenant", tenant)
        assert made.returncode == 0, made.stderr
        tokens[tenant] = made.stdout.strip()
    serve = start_serve(h)
    try:
        turns = {}
        for tenant, token in tokens.items():
            with serve.http(token) as api:
                sid = api.post("/v1/sessions", json={"agent": "builtin"}).json()["session_id"]
                started = api.post(f"/v1/sessions/{sid}/turns", json={"prompt": LOOP})
                assert started.status_code == 202, started.text
                turns[tenant] = started.json()["turn_id"]
        ran = h.cli("worker", "--until-idle", "--quiet")
        assert ran.returncode == 0, ran.stderr
        calls = {}
        for tenant, turn_id in turns.items():
            data = h.show(turn_id)
            assert data["turn"]["budget_exceeded"]["scope"] == "tenant", data["turn"]
            calls[tenant] = sum(s["kind"] == "model" for s in data["steps"])
            limit = data["turn"]["budget_exceeded"]["limit"]
            assert limit == (3000 if tenant == "acme" else 5000)
        # 1100 tokens a call, counted before each: acme calls until 3300 >= 3000 (3
        # calls), globex until 5500 >= 5000 (5 calls).
        assert calls == {"acme": 3, "globex": 5}
        assert "TENANT_BUDGETS entry of tenant 'acme'" in h.show(turns["acme"])["turn"]["error"]
        assert "DURABLE_HARNESS_BUDGET_TENANT_TOKENS" in h.show(turns["globex"])["turn"]["error"]
    finally:
        serve.stop()
