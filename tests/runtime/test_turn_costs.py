"""runtime/costs.py on a real local World: a turn's cost from its model steps' meta, its
savings from its ``step.replayed`` events, and a session's sum, with unknown prices kept
unknown (null), never counted as 0."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_harness.core import events as ev
from durable_harness.core.keys import input_digest
from durable_harness.core.pricing import Price, PriceTable, step_cost
from durable_harness.core.types import Step, StepStatus
from durable_harness.runtime.costs import Costs, session_costs, turn_costs
from durable_harness.worlds.local import LocalWorld

PRICES = PriceTable({"cheap": Price(1.0, 2.0, 0.5, 1.5)})  # USD per million tokens


@pytest.fixture
def world(tmp_path: Path) -> Iterator[LocalWorld]:
    with LocalWorld(tmp_path) as w:
        w.create_session("s")
        yield w


def _turn(world: LocalWorld, turn_id: str, models: list[str], replayed: list[int]) -> None:
    """A turn whose steps alternate model (1M input, 1M cache reads each) and tool, and
    whose log holds a read-back of each seq in ``replayed``."""
    world.create_turn("s", turn_id, "p", {"agent": "builtin"})
    lease = world.claim_turn(turn_id, "w", 30, force=True)
    assert lease is not None
    seq = 0
    for model in models:
        for kind, name in (("model", model), ("tool", "bash")):
            step = Step(
                turn_id, seq, f"{kind}:{seq}", kind, name, input_digest(seq), epoch=lease.epoch
            )
            world.insert_intent(step)
            meta = (
                {"input_tokens": 1_000_000, "cache_read_tokens": 1_000_000}
                if kind == "model"
                else {}
            )
            world.finish_step(turn_id, seq, lease.epoch, StepStatus.DONE, "1", None, meta)
            seq += 1
    for n in replayed:
        step = world.load_steps(turn_id)[n]
        data = {
            "seq": n,
            "epoch": lease.epoch,
            "kind": step.kind,
            "name": step.name,
            "status": "done",
        }
        key = ev.step_replayed_key(n, lease.epoch)
        world.append_event(turn_id, key, ev.STEP_REPLAYED, data, epoch=lease.epoch)


def test_a_turns_cost_and_savings(world: LocalWorld) -> None:
    _turn(world, "t", ["cheap", "cheap", "unknown-model"], replayed=[0, 1, 2])
    steps = world.load_steps("t")
    assert [step_cost(s, PRICES) for s in steps] == [1.5, None, 1.5, None, None, None]
    costs = turn_costs(world, "t", PRICES)
    assert costs == Costs(
        input_tokens=3_000_000,
        cache_read_tokens=3_000_000,
        cost_usd=3.0,  # the priced steps; the unknown model's is not 0, it is left out
        saved_model_calls=2,  # seq 0 and 2; the tool read back (1) saves no model call
        saved_usd=3.0,
    )


def test_unknown_prices_stay_unknown(world: LocalWorld) -> None:
    _turn(world, "none", ["unknown-model"], replayed=[0])
    costs = turn_costs(world, "none", PRICES)
    assert (costs.cost_usd, costs.saved_model_calls, costs.saved_usd) == (None, 1, None)
    _turn(world, "fresh", ["cheap"], replayed=[])
    assert turn_costs(world, "fresh", PRICES).saved_usd == 0.0  # nothing saved: 0, known
    total = session_costs(world, "s", PRICES)
    # The session: one turn saved a call of unknown price, the other saved none.
    assert (total.cost_usd, total.saved_model_calls, total.saved_usd) == (1.5, 1, None)
    assert Costs() + Costs() == Costs()  # an empty session saved 0, known


def test_an_older_journal_step_is_priced_by_its_name(world: LocalWorld) -> None:
    """Journals before the split recorded no ``model``: the step's name is the request's."""
    _turn(world, "old", ["cheap"], replayed=[])
    (model, _tool) = world.load_steps("old")
    assert "model" not in model.meta and step_cost(model, PRICES) == 1.5
