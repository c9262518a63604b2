"""A human approves before a gated tool runs (docs/tools.md, "Approval").

One scripted turn asks for two refunds in one reply: order 1 (20: under the rule's limit)
runs at once, order 7 (250) parks the turn on an approval step, with no worker held.
The first test approves it with ``durable-harness approve`` after the worker was SIGKILLed
and crashes the next workers at the approval step's ``after_run`` and ``after_outcome``:
the refund still runs exactly once. The second goes through ``serve``: the approve route
refuses an unauthenticated call, the turn's own signal secret, another tenant's token
and a token the operator did not name an approver; a rejection with a reason is what the
model reads, and the refund never runs."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import FIXTURES, Harness, ids_of, make_harness, start_serve, wait_for

from durable_harness.worlds import open_world

TOOLS = FIXTURES / "approval_tools.py"
PROMPT = "Refund orders 1 and 7"
#: seq 0 the model's reply, 1 refund order 1, 2 the approval of refund order 7, 3 that
#: refund, 4 the model's last reply.
APPROVAL_SEQ = 2


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    for harness in make_harness(tmp_path, FIXTURES / "approval.toml", lease="2"):
        harness.env["APPROVAL_RUNS"] = str(tmp_path / "refunds.txt")
        sets = [f"approval={TOOLS}:TOOLS", str(TOOLS)]
        harness.env["DURABLE_HARNESS_TOOL_SETS"] = json.dumps(sets)
        yield harness


def refunds(h: Harness) -> list[str]:
    path = Path(h.env["APPROVAL_RUNS"])
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def test_approved_call_runs_once_through_worker_deaths(h: Harness) -> None:
    out = h.cli("run", "--detach", "--tools", f"{TOOLS}:TOOLS", PROMPT)
    assert out.returncode == 0, out.stderr
    turn_id = ids_of(out)["turn"]
    worker = h.popen("worker")
    wait_for(lambda: h.show(turn_id)["turn"]["status"] == "waiting")
    os.killpg(worker.pid, signal.SIGKILL)  # no worker at all while the human decides
    worker.communicate()

    data = h.show(turn_id)
    assert data["turn"]["lease_owner"] is None
    assert data["turn"]["waiting_for"].startswith(f"approval of step {APPROVAL_SEQ} (refund)")
    gate = data["steps"][APPROVAL_SEQ]
    assert (gate["kind"], gate["status"], gate["approval"]) == (
        "approval",
        "intent",
        {"decision": "pending"},
    )
    assert refunds(h) == ["1"]  # under the limit: ran without waiting
    text = h.cli("show", turn_id).stdout
    assert "waits for a decision: durable-harness approve" in text

    # The doors that take a caller's signal by name do not carry a decision, and a step
    # that is not an approval step takes none.
    forged = h.cli("signal", turn_id, f"dh.approval.{APPROVAL_SEQ}", "--data", "{}")
    assert forged.returncode == 2 and "harness's own" in forged.stderr
    wrong = h.cli("approve", turn_id, "1")
    assert wrong.returncode == 2 and "no approval step 1" in wrong.stderr

    yes = h.cli("approve", turn_id, str(APPROVAL_SEQ), "--reason", "checked the order")
    assert yes.returncode == 0 and "approved by operator:" in yes.stdout, yes.stderr
    again = h.cli("approve", turn_id, str(APPROVAL_SEQ), "--reject")
    assert again.returncode == 0 and "decided already (approved" in again.stdout

    # A crash after the decision was read, then one after it was recorded.
    for point in ("after_run", "after_outcome"):
        crashed = h.cli(
            "worker", "--until-idle", DURABLE_HARNESS_CRASH_AT=f"{APPROVAL_SEQ}:{point}"
        )
        assert crashed.returncode == 86, (point, crashed.stderr)
    done = h.cli("worker", "--until-idle")
    assert done.returncode == 0, done.stderr

    data = h.show(turn_id)
    assert data["turn"]["status"] == "done"
    assert data["turn"]["result"] == "Refunded orders 1 and 7."
    assert sorted(refunds(h)) == ["1", "7"]  # each refund exactly once
    assert h.repeated_requests() == {}  # no model call made twice
    decided = data["steps"][APPROVAL_SEQ]["approval"]
    assert decided["decision"] == "approved" and decided["by"].startswith("operator:")
    assert decided["reason"] == "checked the order"
    assert "approved by operator:" in h.cli("show", turn_id).stdout


def test_api_approval_is_the_approvers_and_a_rejection_never_runs(h: Harness) -> None:
    def token(tenant: str) -> str:
        made = h.cli("token", "create", "--tenant", tenant)
        assert made.returncode == 0, made.stderr
        return made.stdout.strip()

    acme, acme_viewer, beta = token("acme"), token("acme"), token("beta")
    approvers = ",".join(t.split("_")[1] for t in (acme, beta))
    serve = start_serve(h, DURABLE_HARNESS_API_APPROVER_TOKENS=approvers)
    try:
        with serve.http(acme) as api:
            made = api.post("/v1/sessions", json={"agent": "builtin", "tools": ["approval"]})
            assert made.status_code == 201, made.text
            started = api.post(
                f"/v1/sessions/{made.json()['session_id']}/turns", json={"prompt": PROMPT}
            )
            assert started.status_code == 202, started.text
            turn_id = started.json()["turn_id"]
            worker = h.popen("worker")
            wait_for(lambda: api.get(f"/v1/turns/{turn_id}").json()["status"] == "waiting")
            os.killpg(worker.pid, signal.SIGKILL)
            worker.communicate()
            rows = api.get(f"/v1/turns/{turn_id}/steps").json()["steps"]
            assert rows[APPROVAL_SEQ]["approval"] == {"decision": "pending"}

            route = f"/v1/turns/{turn_id}/steps/{APPROVAL_SEQ}/approval"
            body = {"approved": False, "reason": "over the daily limit"}
            with open_world("local", data_dir=h.env["DURABLE_HARNESS_DATA_DIR"]) as world:
                secret = str(world.get_turn(turn_id).config["signal_secret"])
            with serve.http() as anon, serve.http(secret) as sandboxed:
                assert anon.post(route, json=body).status_code == 401
                assert sandboxed.post(route, json=body).status_code == 401
            with serve.http(beta) as other:  # an approver, of another tenant
                assert other.post(route, json=body).status_code == 404
            with serve.http(acme_viewer) as viewer:  # the tenant's, not an approver
                refused = viewer.post(route, json=body)
                assert refused.status_code == 403, refused.text
            forged = api.post(f"/v1/turns/{turn_id}/signals/dh.approval.{APPROVAL_SEQ}", json={})
            assert forged.status_code == 422
            assert api.post(f"/v1/turns/{turn_id}/steps/1/approval", json=body).status_code == 404

            decided = api.post(route, json=body)
            assert decided.status_code == 200, decided.text
            out = decided.json()
            assert out["new"] is True and out["approved"] is False
            assert out["by"] == f"token:{acme.split('_')[1]} (acme)"
            late = api.post(route, json={"approved": True})
            assert late.status_code == 200 and late.json()["new"] is False
            assert late.json()["approved"] is False  # the first decision stands

            done = h.cli("worker", "--until-idle")
            assert done.returncode == 0, done.stderr
            turn = api.get(f"/v1/turns/{turn_id}").json()
            assert turn["status"] == "done"
            # The model read the rejection and its reason (the script's rule matched it).
            assert turn["reply"] == "Order 1 refunded; order 7 was rejected: over the daily limit."
            assert refunds(h) == ["1"]  # the rejected refund never ran
            rows = api.get(f"/v1/turns/{turn_id}/steps").json()["steps"]
            assert rows[APPROVAL_SEQ]["approval"]["decision"] == "rejected"
            assert rows[APPROVAL_SEQ + 1]["approval"] == {"decision": "rejected"}
            detail = api.get(f"/v1/turns/{turn_id}/steps/{APPROVAL_SEQ + 1}").json()
            assert "rejected by token:" in json.loads(detail["output"])["content"]
    finally:
        serve.stop()
