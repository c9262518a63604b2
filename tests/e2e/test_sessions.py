"""Sessions: a later turn sees the earlier conversation and the workspace it left,
both read from the journal by whichever worker runs it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from support import DEMO_PROMPT, DEMO_REPLY, DEMO_TOOLS, Harness, ids_of


def test_second_turn_sees_first(demo_harness: Harness) -> None:
    h = demo_harness
    first = h.cli("run", "--tools", DEMO_TOOLS, DEMO_PROMPT)
    assert first.returncode == 0, first.stderr
    session = ids_of(first)["session"]

    # A detached turn, run by a separate worker process: history comes from the journal.
    second = h.cli(
        "run", "--detach", "--session", session, "--tools", DEMO_TOOLS, "What did you do before?"
    )
    assert second.returncode == 0, second.stderr
    assert ids_of(second)["session"] == session
    worker = h.cli("worker", "--until-idle")
    assert worker.returncode == 0, worker.stderr
    data = h.show(ids_of(second)["turn"])
    assert data["turn"]["index"] == 1
    assert data["turn"]["result"] == "Earlier in this session I refunded order 42 once."
    assert len(h.ledger_lines()) == 1


def test_workspace_carries_over(demo_harness: Harness) -> None:
    h = demo_harness
    first = h.cli("run", "--tools", DEMO_TOOLS, DEMO_PROMPT)
    session = ids_of(first)["session"]
    # The script answers "show the notes" with `cat refunds.md`: the file turn one wrote
    # in the virtual workspace, which exists only as a snapshot in the journal.
    second = h.cli("run", "--session", session, "--tools", DEMO_TOOLS, "show the notes")
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == DEMO_REPLY
    db = Path(h.env["DURABLE_HARNESS_DATA_DIR"]) / "world.sqlite3"
    with sqlite3.connect(db) as conn:
        (output,) = conn.execute(
            "SELECT output FROM steps WHERE turn_id=? AND name='bash'", (ids_of(second)["turn"],)
        ).fetchone()
    assert json.loads(output)["content"] == "exit code 0\n- order 42: refunded\n"


def test_queued_turns_of_a_session_run_in_order(demo_harness: Harness) -> None:
    """Two turns queued at once in one session: two workers, and the second still runs
    after the first (parked meanwhile, without using up its deliveries) and sees it."""
    h = demo_harness
    first = h.cli("run", "--detach", "--tools", DEMO_TOOLS, DEMO_PROMPT)
    session = ids_of(first)["session"]
    second = h.cli(
        "run", "--detach", "--session", session, "--tools", DEMO_TOOLS, "What did you do before?"
    )
    assert second.returncode == 0, second.stderr
    refused = h.cli("run", "--session", session, "--tools", DEMO_TOOLS, "and now?")
    assert refused.returncode == 2 and "--detach" in refused.stderr
    workers = [h.popen("worker", "--until-idle") for _ in range(2)]
    for w in workers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    one, two = (h.show(ids_of(x)["turn"])["turn"] for x in (first, second))
    assert one["status"] == two["status"] == "done"
    assert two["result"] == "Earlier in this session I refunded order 42 once."
    assert two["finished_at"] > one["finished_at"]
    assert len(h.ledger_lines()) == 1
