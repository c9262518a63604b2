"""The journal runner against a real local World: DESIGN.md's table, row by row."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_harness.core.errors import (
    LeaseLost,
    ReplayDivergence,
    StepConflict,
    TurnCancelled,
    TurnFailed,
)
from durable_harness.core.keys import input_digest
from durable_harness.core.types import Lease, Step, StepStatus
from durable_harness.harness.journal import BLOB_THRESHOLD, Journal, OpenStep, Outcome, StepResult
from durable_harness.harness.tools import ABSENT, UNKNOWN, Checked, done
from durable_harness.worlds.local import LocalWorld


@pytest.fixture
def world(tmp_path: Path) -> Iterator[LocalWorld]:
    with LocalWorld(tmp_path) as w:
        w.create_session("s")
        w.create_turn("s", "t", "prompt", {"agent": "builtin"})
        yield w


def claim(world: LocalWorld, force: bool = True) -> Lease:
    lease = world.claim_turn("t", "w", 30, force=force)
    assert lease is not None
    return lease


class Calls:
    def __init__(self) -> None:
        self.seqs: list[int] = []

    def __call__(self, value: Any) -> Any:
        def call(seq: int) -> Outcome:
            self.seqs.append(seq)
            return Outcome(value, {"n": len(self.seqs)})

        return call


def step(journal: Journal, calls: Calls, value: Any, replay: Any = "safe", **kw: Any) -> Any:
    args = {"kind": "tool", "name": "t", "key": f"k{journal.next_seq}", "input": {"a": 1}}
    args.update(kw)
    return journal.run(call=calls(value), replay=replay, **args)


def test_nothing_recorded_runs_and_records(world: LocalWorld) -> None:
    calls = Calls()
    r = step(Journal(world, claim(world)), calls, {"x": 1})
    assert (r.value, r.status, r.replayed) == ({"x": 1}, StepStatus.DONE, False)
    (row,) = world.load_steps("t")
    assert row.status is StepStatus.DONE and row.input == '{"a":1}'
    assert row.meta["n"] == 1 and row.meta["turn_attempt"] == 1


def test_outcome_recorded_is_returned_without_calling(world: LocalWorld) -> None:
    calls = Calls()
    step(Journal(world, claim(world)), calls, "first")
    r = step(Journal(world, claim(world)), calls, "second")
    assert (r.value, r.replayed) == ("first", True)
    assert calls.seqs == [0]


def test_interrupted_safe_step_runs_again(world: LocalWorld) -> None:
    world.insert_intent(_intent(claim(world)))  # what a crash after the intent leaves
    calls = Calls()
    r = step(Journal(world, claim(world)), calls, "again")
    assert (r.value, r.status, r.replayed) == ("again", StepStatus.DONE, False)
    assert world.load_steps("t")[0].attempts == 2


def test_interrupted_never_step_is_not_run(world: LocalWorld) -> None:
    world.insert_intent(_intent(claim(world)))
    calls = Calls()
    r = step(Journal(world, claim(world)), calls, "refund", replay="never")
    assert r.status is StepStatus.POSSIBLY_RAN and calls.seqs == []
    assert "may or may not have taken effect" in r.value and "t:0" in r.value
    assert world.load_steps("t")[0].status is StepStatus.POSSIBLY_RAN
    # Read back as possibly_ran on the next replay too, still without running.
    r2 = step(Journal(world, claim(world)), calls, "refund", replay="never")
    assert r2.status is StepStatus.POSSIBLY_RAN and r2.replayed and calls.seqs == []


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ({"kind": "model"}, "kind"),
        ({"name": "other"}, "name"),
        ({"key": "other"}, "key"),
        ({"input": {"a": 2}}, "input hash"),
    ],
)
def test_replay_divergence(world: LocalWorld, change: dict[str, Any], what: str) -> None:
    calls = Calls()
    step(Journal(world, claim(world)), calls, "v")
    with pytest.raises(ReplayDivergence, match=what):
        step(Journal(world, claim(world)), calls, "v", **change)


def test_stale_epoch_is_fenced(world: LocalWorld) -> None:
    old = Journal(world, claim(world))
    claim(world)  # another worker takes the turn over
    with pytest.raises(LeaseLost):
        step(old, Calls(), "late")
    assert world.load_steps("t") == []


def test_idempotency_key_is_turn_and_seq(world: LocalWorld) -> None:
    calls = Calls()
    journal = Journal(world, claim(world))
    step(journal, calls, 1)
    step(journal, calls, 2)
    assert calls.seqs == [0, 1]


def test_large_outputs_and_inputs_go_to_blobs(world: LocalWorld) -> None:
    big = "x" * (BLOB_THRESHOLD + 1)
    calls = Calls()
    r = step(Journal(world, claim(world)), calls, big, input={"big": big})
    (row,) = world.load_steps("t")
    assert row.output is None and row.output_blob is not None
    assert row.input is not None and row.input.startswith("blob:")
    again = step(Journal(world, claim(world)), calls, "ignored", input={"big": big})
    assert again.value == r.value == big and again.replayed


def test_replay_only_refuses_to_call(world: LocalWorld) -> None:
    calls = Calls()
    step(Journal(world, claim(world)), calls, "v")
    journal = Journal(world, claim(world), replay_only=True)
    assert step(journal, calls, "v").replayed
    assert journal.replayed == 1
    with pytest.raises(ReplayDivergence, match="no recorded outcome"):
        step(journal, calls, "w")
    assert calls.seqs == [0]


def _intent(lease: Lease) -> Step:
    return Step(
        turn_id="t",
        seq=0,
        key="k0",
        kind="tool",
        name="t",
        input_hash=input_digest({"a": 1}),
        epoch=lease.epoch,
    )


def test_keyed_steps_are_found_by_key_not_position(world: LocalWorld) -> None:
    journal = Journal(world, claim(world))
    opened = journal.begin_keyed(kind="model", name="m", key="h:aaa", input={"r": 1}, replay="safe")
    assert isinstance(opened, OpenStep) and opened.step.seq == 0
    journal.end(opened, Outcome("reply a"))
    b = journal.begin_keyed(kind="model", name="m", key="h:bbb", input={"r": 2}, replay="safe")
    assert isinstance(b, OpenStep) and b.step.seq == 1  # left open: "killed" mid-call

    again = Journal(world, claim(world))
    # A resumed CLI asks in its own order: b again first (interrupted: runs again), then a.
    b2 = again.begin_keyed(kind="model", name="m", key="h:bbb", input={"r": 2}, replay="safe")
    assert isinstance(b2, OpenStep) and b2.step.seq == 1 and b2.step.attempts == 2
    a2 = again.begin_keyed(kind="model", name="m", key="h:aaa", input={"r": 1}, replay="safe")
    assert isinstance(a2, StepResult) and a2.replayed and a2.value == "reply a"
    c = again.begin_keyed(kind="tool", name="Bash", key="tool:x", input={}, replay="never")
    assert isinstance(c, OpenStep) and c.step.seq == 2


def test_keyed_steps_from_many_threads_get_distinct_seqs(world: LocalWorld) -> None:
    from concurrent.futures import ThreadPoolExecutor

    journal = Journal(world, claim(world))

    def one(i: int) -> int:
        opened = journal.begin_keyed(kind="tool", name="t", key=f"k{i}", input=i, replay="safe")
        assert isinstance(opened, OpenStep)
        return journal.end(opened, Outcome(i)).step.seq

    with ThreadPoolExecutor(8) as pool:
        seqs = list(pool.map(one, range(16)))
    assert sorted(seqs) == list(range(16))
    assert [s.seq for s in world.load_steps("t")] == list(range(16))


def test_keyed_model_calls_past_the_budget_end_the_turn(world: LocalWorld) -> None:
    journal = Journal(world, claim(world), max_model_calls=2)
    for key in ("model:a", "model:b"):
        opened = journal.begin_keyed(kind="model", name="m", key=key, input={}, replay="safe")
        assert isinstance(opened, OpenStep)
        journal.end(opened, Outcome("reply", {}))
    # Tool calls are not counted; recorded model calls are read back past the budget.
    tool = journal.begin_keyed(kind="tool", name="t", key="tool:1", input={}, replay="safe")
    assert isinstance(tool, OpenStep)
    again = journal.begin_keyed(kind="model", name="m", key="model:a", input={}, replay="safe")
    assert isinstance(again, StepResult) and again.value == "reply"
    with pytest.raises(TurnFailed, match=r"made 2 model calls .* limit is 2"):
        journal.begin_keyed(kind="model", name="m", key="model:c", input={}, replay="safe")
    assert [s.key for s in world.load_steps(journal.turn_id)] == ["model:a", "model:b", "tool:1"]


class Checks:
    """A never tool's check that answers ``answer`` (raises it, if an exception)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.seqs: list[int] = []

    def __call__(self, seq: int) -> Checked:
        self.seqs.append(seq)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("answer", "rerun", "status", "settled", "ran"),
    [
        (done({"content": "refunded"}), False, StepStatus.DONE, "done", False),
        (ABSENT, True, StepStatus.DONE, "ran again", True),
        (ABSENT, False, StepStatus.POSSIBLY_RAN, "absent", False),
        (UNKNOWN, True, StepStatus.POSSIBLY_RAN, "unknown", False),
        (OSError("ledger down"), True, StepStatus.POSSIBLY_RAN, "check failed", False),
    ],
)
def test_an_interrupted_never_step_is_settled_by_its_check(
    world: LocalWorld, answer: Any, rerun: bool, status: StepStatus, settled: str, ran: bool
) -> None:
    world.insert_intent(_intent(claim(world)))  # the refund's intent, then a crash
    calls, check = Calls(), Checks(answer)
    journal = Journal(world, claim(world))
    r = step(journal, calls, "refund issued", "never", settle=check, rerun_if_absent=rerun)
    assert check.seqs == [0] and r.status is status and not r.replayed
    assert calls.seqs == ([0] if ran else [])
    (row,) = world.load_steps("t")
    assert row.status is status and row.meta["settled"] == settled
    assert row.attempts == (2 if ran else 1)
    if settled == "done":
        assert r.value == {"content": "refunded"} == json.loads(row.output or "")
    elif ran:
        assert r.value == "refund issued"
    else:
        assert "may or may not have taken effect" in r.value
    if settled == "check failed":
        assert row.meta["error"] == "OSError: ledger down"
    # Settled once: read back on the next delivery, the check not asked again.
    again = step(Journal(world, claim(world)), Calls(), "x", "never", settle=check)
    assert again.replayed and again.status is status and check.seqs == [0]


def test_a_check_is_asked_only_for_an_interrupted_never_step(world: LocalWorld) -> None:
    check = Checks(ABSENT)
    journal = Journal(world, claim(world))
    assert step(journal, Calls(), "first", "never", settle=check).value == "first"
    world.insert_intent(dataclasses.replace(_intent(claim(world)), seq=1, key="k1"))
    journal = Journal(world, claim(world))
    assert step(journal, Calls(), "first", "never", settle=check).replayed  # seq 0: done
    assert step(journal, Calls(), "again", "safe", settle=check).value == "again"  # safe
    assert check.seqs == []


def test_a_cancel_during_the_check_stops_the_call_from_running_again(
    world: LocalWorld,
) -> None:
    world.insert_intent(_intent(claim(world)))
    journal, calls = Journal(world, claim(world)), Calls()

    def check(seq: int) -> Checked:
        journal.cancel.request("cancelled while the check ran")
        return ABSENT

    with pytest.raises(TurnCancelled):
        step(journal, calls, "refund issued", "never", settle=check, rerun_if_absent=True)
    assert calls.seqs == [] and world.load_steps("t")[0].status is StepStatus.INTENT


def test_a_keyed_step_is_settled_by_one_caller_at_a_time(world: LocalWorld) -> None:
    """Two callers of one interrupted keyed step (a CLI's call posted twice) at once: one
    asks the check and gets the call to run again; the other is refused, never a second
    check and a second run."""
    world.insert_intent(_intent(claim(world)))
    journal = Journal(world, claim(world))
    asked = threading.Event()
    release = threading.Event()

    def slow_check(_seq: int) -> Checked:
        asked.set()
        release.wait(10)
        return ABSENT

    got: list[Any] = []

    def begin() -> Any:
        return journal.begin_keyed(
            kind="tool",
            name="t",
            key="k0",
            input={"a": 1},
            replay="never",
            settle=slow_check,
            rerun_if_absent=True,
        )

    thread = threading.Thread(target=lambda: got.append(begin()))
    thread.start()
    assert asked.wait(10)
    with pytest.raises(StepConflict, match="being settled or run again"):
        begin()
    release.set()
    thread.join(10)
    (open_step,) = got
    assert isinstance(open_step, OpenStep)
    journal.end(open_step, Outcome("ran again"))
    (row,) = world.load_steps("t")
    assert row.status is StepStatus.DONE and row.attempts == 2
