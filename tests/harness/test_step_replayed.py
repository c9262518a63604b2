"""``step.replayed`` (core/events.py): the journal appends one per finished step a delivery
reads back instead of running, fenced by that delivery's lease, against a real local
World."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_harness.core import events as ev
from durable_harness.core.errors import LeaseLost
from durable_harness.core.keys import input_digest
from durable_harness.core.pricing import price_table
from durable_harness.core.types import Lease, Step, StepStatus
from durable_harness.harness.events import TurnEvents, read_all
from durable_harness.harness.journal import Journal, Outcome
from durable_harness.runtime.costs import turn_costs
from durable_harness.worlds.local import LocalWorld


@pytest.fixture
def world(tmp_path: Path) -> Iterator[LocalWorld]:
    with LocalWorld(tmp_path) as w:
        w.create_session("s")
        w.create_turn("s", "t", "prompt", {"agent": "builtin"})
        yield w


def _delivery(world: LocalWorld) -> tuple[Lease, Journal]:
    lease = world.claim_turn("t", "w", 30, force=True)
    assert lease is not None
    events = TurnEvents(world, "t", lease.epoch, lease.attempt, flush_seconds=60)
    events.begin_attempt("w")
    return lease, Journal(world, lease, events=events)


def _turn(journal: Journal, ran: list[str]) -> None:
    """A model call, then a ``never`` tool; ``ran`` records what actually ran."""

    def model(_seq: int) -> Outcome:
        ran.append("model")
        return Outcome({"role": "assistant", "content": []}, {"model": "m", "input_tokens": 5})

    def refund(_seq: int) -> Outcome:
        ran.append("refund")
        return Outcome("refunded")

    journal.run(kind="model", name="m", key="model:0", input={"q": 1}, call=model, replay="safe")
    journal.run(kind="tool", name="refund", key="tool:1", input={}, call=refund, replay="never")


def _replayed(world: LocalWorld) -> list[tuple[str, dict[str, object]]]:
    return [(e.key, e.data) for e in read_all(world, "t") if e.kind == ev.STEP_REPLAYED]


def test_each_read_back_is_one_event_of_its_delivery(world: LocalWorld) -> None:
    ran: list[str] = []
    first, journal = _delivery(world)
    _turn(journal, ran)
    assert ran == ["model", "refund"]
    assert _replayed(world) == []  # a live step is no read-back

    second, journal = _delivery(world)
    _turn(journal, ran)
    _turn(Journal(world, second, events=journal.events), ran)  # read again: still once
    assert ran == ["model", "refund"]
    assert _replayed(world) == [
        (
            f"step:0:replayed:{second.epoch}",
            {
                "seq": 0,
                "epoch": second.epoch,
                "kind": "model",
                "name": "m",
                "status": "done",
                "after": "lost",  # the first delivery never said how it ended
            },
        ),
        (
            f"step:1:replayed:{second.epoch}",
            {
                "seq": 1,
                "epoch": second.epoch,
                "kind": "tool",
                "name": "refund",
                "status": "done",
                "after": "lost",
            },
        ),
    ]
    assert first.epoch != second.epoch


def test_a_read_back_after_a_wait_is_no_saving(world: LocalWorld) -> None:
    """A parked turn reads its calls back at every wake: that is what waiting with no
    process costs, not what a crash would have; savings count only the others."""
    ran: list[str] = []
    _first, journal = _delivery(world)
    _turn(journal, ran)
    assert journal.events is not None
    journal.events.waiting("ci", 0.0)  # the delivery parks the turn
    _second, journal = _delivery(world)
    _turn(journal, ran)
    assert ran == ["model", "refund"]
    assert {e["after"] for _k, e in _replayed(world)} == {"woken"}
    costs = turn_costs(world, "t", price_table())
    assert costs.saved_model_calls == 0
    third, journal = _delivery(world)  # the second delivery died: this one saves
    _turn(journal, ran)
    after = {e["epoch"]: e["after"] for _k, e in _replayed(world)}
    assert after[third.epoch] == "lost"
    assert turn_costs(world, "t", price_table()).saved_model_calls == 1


def test_a_possibly_ran_step_read_back_says_so(world: LocalWorld) -> None:
    lease, journal = _delivery(world)
    journal.run(
        kind="model",
        name="m",
        key="model:0",
        input={"q": 1},
        call=lambda _s: Outcome("hi"),
        replay="safe",
    )
    intent = Step("t", 1, "tool:1", "tool", "refund", input_digest({}), epoch=lease.epoch)
    world.insert_intent(intent)
    # The worker died with the never tool's intent open: the next delivery finishes it as
    # possibly ran (that is no read-back), the one after reads that outcome back.
    ran: list[str] = []
    second, journal = _delivery(world)
    _turn(journal, ran)
    assert ran == [] and world.load_steps("t")[1].status is StepStatus.POSSIBLY_RAN
    third, journal = _delivery(world)
    _turn(journal, ran)
    statuses = {(e["seq"], e["epoch"]): e["status"] for _k, e in _replayed(world)}
    assert statuses == {
        (0, second.epoch): "done",
        (0, third.epoch): "done",
        (1, third.epoch): "possibly_ran",
    }


def test_a_stale_delivery_cannot_append_one(world: LocalWorld) -> None:
    _lease, journal = _delivery(world)
    _turn(journal, [])
    stale, old = _delivery(world)
    _delivery(world)  # a newer delivery took the turn: the old lease is fenced out
    with pytest.raises(LeaseLost):
        _turn(Journal(world, stale, events=old.events), [])
    assert all(e["epoch"] != stale.epoch for _k, e in _replayed(world))


def test_a_step_settled_by_its_check_says_so_in_its_finished_event(world: LocalWorld) -> None:
    """The viewer draws a settled step from its ``step.finished`` event before the
    journal row is read: the event carries what the check answered."""
    from durable_harness.harness.tools import done

    lease, _ = _delivery(world)
    world.insert_intent(
        Step("t", 0, "tool:0", "tool", "refund", input_digest({}), epoch=lease.epoch)
    )
    _, journal = _delivery(world)  # the next delivery finds the intent, and asks the check
    journal.run(
        kind="tool",
        name="refund",
        key="tool:0",
        input={},
        call=lambda _seq: Outcome("refunded again"),
        replay="never",
        settle=lambda _seq: done("refunded"),
    )
    journal.events.close()  # type: ignore[union-attr]
    (finished,) = [e.data for e in read_all(world, "t") if e.kind == ev.STEP_FINISHED]
    assert finished["settled"] == "done" and finished["status"] == "done"
