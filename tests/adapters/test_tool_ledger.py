"""The ledger of model-made tool uses (``adapters/cli/ledger.py``), filled from what the
journaling proxy recorded, for every wire format it speaks (``proxy_cases.WIRES``), over
real sockets to the fake model: a streamed and a JSON answer, and a new Journal on the
same turn (a resume, a re-attach) rebuilding it from the recorded steps alone."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_cases import RESPONSES_CASE, WIRES, Rig, WireCase, open_rig

from durable_harness.adapters.cli.ledger import ToolLedger
from durable_harness.harness.journal import Journal


@pytest.fixture(params=list(WIRES))
def case(request: pytest.FixtureRequest) -> WireCase:
    return WIRES[request.param]


@pytest.fixture
def rig(tmp_path: Path, case: WireCase) -> Iterator[Rig]:
    with open_rig(tmp_path, case) as rig:
        yield rig


@pytest.mark.parametrize("stream", [True, False])
def test_a_served_tool_use_is_in_the_ledger_and_nothing_else(
    rig: Rig, case: WireCase, stream: bool
) -> None:
    ledger = ToolLedger(rig.journal)
    assert ledger.find("call_made_up") is None  # nothing recorded yet
    rig.ask("use a tool", stream=stream)
    (step,) = rig.steps()
    (call_id,) = step.meta["tool_use_ids"]
    model_input = tomllib.loads(f"v = {case.tool_input}")["v"]

    use = ledger.find(call_id)
    assert use is not None and use.name == case.tool and use.input == model_input
    assert ledger.refusal(call_id, [case.tool], model_input) is None
    assert "no model response" in str(ledger.refusal("call_made_up", [case.tool], model_input))
    assert "not of" in str(ledger.refusal(call_id, ["notify"], model_input))
    other = {**model_input, "extra": 1}
    assert "input differs" in str(ledger.refusal(call_id, [case.tool], other))
    # Each id is claimed once per worker.
    assert ledger.claim(call_id) and not ledger.claim(call_id)

    # A new worker on the same turn: the ledger comes from the journal's recorded steps.
    fresh = ToolLedger(Journal(rig.world, rig.journal.lease))
    assert fresh.find(call_id) == use
    assert fresh.claim(call_id)


@pytest.mark.parametrize("stream", [True, False])
def test_a_responses_call_is_one_call_under_both_its_ids(tmp_path: Path, stream: bool) -> None:
    """Pi presents a Responses call as ``<call_id>|<item id>``, Codex by its ``call_id``:
    the ledger knows both, and they share one claim, so neither id runs it again."""
    with open_rig(tmp_path, RESPONSES_CASE) as rig:
        rig.ask("use a tool", stream=stream)
        ledger = ToolLedger(rig.journal)
        (step,) = rig.steps()
        (call_id,) = step.meta["tool_use_ids"]
        use = ledger.find(call_id)
        assert use is not None and use.alias is not None
        assert use.alias.startswith(f"{call_id}|") and ledger.find(use.alias) == use
        assert ledger.same_call(use.alias) == {call_id, use.alias}
        assert ledger.claim(use.alias) and not ledger.claim(call_id)
        assert ledger.find(f"{call_id}|made-up") is None
