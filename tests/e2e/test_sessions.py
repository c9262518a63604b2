"""Sessions: a later turn sees the earlier conversation and the workspace it left,
both read from the journal by whichever worker runs it."""

from __future__ import annotations

from conftest import DEMO_PROMPT, DEMO_REPLY, DEMO_TOOLS, Harness, ids_of


def test_second_turn_sees_first(demo_harness: Harness) -> None:
    h = demo_harness
    first = h.cli("run", "--tools", DEMO_TOOLS, DEMO_PROMPT)
    assert first.returncode == 0, first.stderr
    session = ids_of(first)["session"]

    # A detached turn, run by a separate worker process: history comes from the journal.
    second = h.cli("run", "--detach", "--session", session, "--tools", DEMO_TOOLS,
                   "What did you do before?")
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
    h.ledger.unlink()  # so the rules take the "not refunded" path only if asked again
    second = h.cli("run", "--session", session, "--tools", DEMO_TOOLS, "show the notes",
                   "--max-model-calls", "5")
    # The script answers "show the notes" by cat-ing refunds.md, written in turn one.
    assert second.returncode == 0, second.stderr
    out = h.cli("show", ids_of(second)["turn"], "--json")
    assert out.returncode == 0
    assert second.stdout.strip().splitlines()[-1] == DEMO_REPLY
