"""The worker's event log (``harness/events.py``) against a real local World: the
reconciliation at claim, ``settle_finished`` from several processes' worth of threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_harness.core.errors import LeaseLost
from durable_harness.core.types import Lease, Step, StepStatus
from durable_harness.harness.events import MAX_DELTA_CHARS, TurnEvents, read_all, settle_finished
from durable_harness.worlds.local import LocalWorld


@pytest.fixture
def world(tmp_path: Path) -> Iterator[LocalWorld]:
    with LocalWorld(tmp_path) as w:
        w.create_session("s")
        w.create_turn("s", "t", "prompt", {"agent": "builtin"})
        yield w


def _claim(world: LocalWorld) -> Lease:
    lease = world.claim_turn("t", "w", 30, force=True)
    assert lease is not None
    return lease


def _intent(world: LocalWorld, lease: Lease, seq: int, kind: str) -> Step:
    step = Step("t", seq, f"{kind}:{seq}", kind, "n", "h" * 64, epoch=lease.epoch)
    world.insert_intent(step)
    return step


def test_reconciliation_and_settling_make_each_event_once_in_order(world: LocalWorld) -> None:
    # Attempt 1 runs a tool (its worker dies after the outcome, before step.finished) and
    # starts a model call whose text streams, then dies.
    first = _claim(world)
    one = TurnEvents(world, "t", first.epoch, first.attempt, flush_seconds=60)
    one.begin_attempt("w1")
    tool = _intent(world, first, 0, "tool")
    one.step_started(tool)
    world.finish_step("t", 0, first.epoch, StepStatus.DONE, '"ok"', None, {"secret": "x"})
    model = _intent(world, first, 1, "model")
    one.step_started(model)
    one.text(1, "Hel")
    one.flush(1)
    one.close()
    # Attempt 2: the reconciliation comes before its own attempt.started; the model call
    # runs again, says something else, and the worker dies after completing the turn.
    second = _claim(world)
    two = TurnEvents(world, "t", second.epoch, second.attempt, flush_seconds=60)
    two.begin_attempt("w2")
    attempts = world.restart_intent("t", 1, second.epoch)
    two.step_started(Step("t", 1, "model:1", "model", "n", "h" * 64, attempts=attempts))
    for piece in ("Hel", "lo", " there"):
        two.text(1, piece)
    two.flush(1)
    meta = {"input_tokens": 3, "output_tokens": 2, "workspace": "abc"}
    world.finish_step("t", 1, second.epoch, StepStatus.DONE, '"x"', None, meta)
    world.complete_turn(second, "Hello there")
    two.close()

    threads = [threading.Thread(target=settle_finished, args=(world, "t")) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    settle_finished(world, "t")  # idempotent

    events = read_all(world, "t")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.key for e in events] == [
        "turn:created",
        f"attempt:{first.epoch}:started",
        "step:0:1:started",
        "step:1:1:started",
        "step:1:1:delta:0",
        f"attempt:{first.epoch}:lost",
        "step:0:finished",
        "step:1:1:abandoned",
        f"attempt:{second.epoch}:started",
        "step:1:2:started",
        "step:1:2:delta:0",
        "step:1:finished",
        "turn:ended",
    ]
    by_key = {e.key: e for e in events}
    assert by_key["turn:created"].data == {"session_id": "s", "index": 0, "agent": "builtin"}
    assert by_key["turn:created"].epoch == first.epoch
    assert by_key[f"attempt:{second.epoch}:started"].data == {
        "epoch": second.epoch,
        "attempt": second.attempt,
        "worker": "w2",
    }
    # The tool's finished event comes from the journal: its output, and no meta but
    # tokens and cost; the model step's output is the text its last attempt streamed.
    assert by_key["step:0:finished"].data["output"] == "ok"
    assert by_key["step:0:finished"].data["meta"] == {}
    finished = by_key["step:1:finished"].data
    assert (finished["attempt"], finished["output"]) == (2, "Hello there")
    assert finished["meta"] == {"input_tokens": 3, "output_tokens": 2}
    assert by_key["step:1:2:delta:0"].data == {
        "seq": 1,
        "attempt": 2,
        "n": 0,
        "text": "Hello there",
    }
    assert by_key["turn:ended"].data == {"status": "done", "result": "Hello there", "error": None}
    assert by_key["turn:ended"].epoch is None


def test_text_goes_in_by_the_timer_in_capped_pieces_and_a_fenced_out_writer_stops(
    world: LocalWorld,
) -> None:
    lease = _claim(world)
    writer = TurnEvents(world, "t", lease.epoch, lease.attempt, flush_seconds=0.02)
    writer.begin_attempt("w")
    writer.step_started(_intent(world, lease, 0, "model"))
    writer.text(0, "Hello")
    # The model pauses: the timer appends what came so far, without a flush.
    deadline = time.monotonic() + 10
    while not any(e.kind == "text.delta" for e in read_all(world, "t")):
        assert time.monotonic() < deadline, "the timer appended nothing"
        time.sleep(0.01)
    writer.text(0, "x" * (MAX_DELTA_CHARS + 10))
    writer.flush(0)
    deltas = [e.data for e in read_all(world, "t") if e.kind == "text.delta"]
    assert [(d["n"], d["text"]) for d in deltas] == [
        (0, "Hello"),
        (1, "x" * MAX_DELTA_CHARS),
        (2, "x" * 10),
    ]
    # Another worker takes the turn over: this writer's next piece is refused, and the
    # step's flush (before its outcome would be recorded) raises, stopping the turn.
    _claim(world)
    writer.text(0, "late")
    with pytest.raises(LeaseLost):
        writer.flush(0)
    writer.close()
    assert not any("late" in str(e.data) for e in read_all(world, "t"))


def test_a_long_reply_is_cut_in_turn_ended(world: LocalWorld) -> None:
    """A reply of any length ends the log (an event holds 256 KiB at most): cut, marked."""
    lease = _claim(world)
    reply = "x" * 300_000
    world.complete_turn(lease, reply)
    settle_finished(world, "t")
    [ended] = [e for e in read_all(world, "t") if e.kind == "turn.ended"]
    assert ended.data["truncated"] is True
    assert ended.data["result"] == reply[: 64 * 1024]
    assert world.get_turn("t").result == reply  # the whole reply stays the turn's
