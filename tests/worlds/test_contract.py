"""The World contract (``durable_harness/core/world.py``), run against every backend.

Nothing here may depend on one backend: the Postgres and S3+SQS Worlds run this file
unchanged (see ``conftest.py``). Lease timing uses short real leases and sleeps, since an
SQS visibility timeout cannot be faked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import durable_harness
from durable_harness.core.errors import LeaseLost, NotFound, StepConflict
from durable_harness.core.types import Lease, Step, StepStatus, TurnCounts, TurnStatus
from durable_harness.core.world import World

if TYPE_CHECKING:
    from conftest import WorldSpec

SHORT_LEASE = 0.2
AFTER_SHORT_LEASE = 0.35


def new_turn(world: World, turn_id: str = "t1", session_id: str = "s1", **config: Any) -> str:
    world.create_session(session_id)
    world.create_turn(session_id, turn_id, f"prompt of {turn_id}", dict(config))
    return turn_id


def claimed(world: World, turn_id: str = "t1", lease_seconds: float = 30.0) -> Lease:
    new_turn(world, turn_id)
    lease = world.claim("w1", lease_seconds)
    assert lease is not None and lease.turn_id == turn_id
    return lease


def intent(lease: Lease, seq: int, key: str | None = None, **fields: Any) -> Step:
    return Step(
        turn_id=lease.turn_id,
        seq=seq,
        key=key if key is not None else f"k{seq}",
        kind=fields.pop("kind", "tool"),
        name=fields.pop("name", "bash"),
        input_hash=fields.pop("input_hash", f"hash{seq}"),
        epoch=fields.pop("epoch", lease.epoch),
        **fields,
    )


def finish(world: World, lease: Lease, seq: int, output: str = '"ok"', **meta: Any) -> None:
    world.finish_step(lease.turn_id, seq, lease.epoch, StepStatus.DONE, output, None, meta)


# -- blobs -----------------------------------------------------------------------------
def test_blob_round_trip_by_sha256(world: World) -> None:
    for data in (b"hello", b"", bytes(range(256)) * 1000):
        digest = world.put_blob(data)
        assert digest == hashlib.sha256(data).hexdigest()
        assert world.get_blob(digest) == data


def test_put_blob_is_idempotent(world: World) -> None:
    assert world.put_blob(b"same") == world.put_blob(b"same")
    assert world.get_blob(hashlib.sha256(b"same").hexdigest()) == b"same"


def test_missing_blob_is_not_found(world: World) -> None:
    with pytest.raises(NotFound):
        world.get_blob(hashlib.sha256(b"never stored").hexdigest())


# -- sessions and turns ----------------------------------------------------------------
def test_session_create_get_and_existing_id_returned(world: World) -> None:
    created = world.create_session("s1", {"agent": "builtin"})
    assert created.session_id == "s1" and created.meta == {"agent": "builtin"}
    assert world.get_session("s1") == created
    assert world.create_session("s1", {"other": 1}) == created


def test_missing_session_and_turn_are_not_found(world: World) -> None:
    with pytest.raises(NotFound):
        world.get_session("nope")
    with pytest.raises(NotFound):
        world.get_turn("nope")
    with pytest.raises(NotFound):
        world.create_turn("nope", "t1", "hi", {})
    with pytest.raises(NotFound):
        world.load_steps("nope")


def test_list_sessions_newest_first(world: World) -> None:
    for name in ("a", "b", "c"):
        world.create_session(name)
    assert [s.session_id for s in world.list_sessions()] == ["c", "b", "a"]
    assert [s.session_id for s in world.list_sessions(limit=2)] == ["c", "b"]


def test_turns_get_the_next_index_and_start_queued(world: World) -> None:
    world.create_session("s1")
    world.create_session("s2")
    first = world.create_turn("s1", "t1", "one", {"agent": "builtin", "n": [1, 2]})
    world.create_turn("s2", "u1", "other session", {})
    second = world.create_turn("s1", "t2", "two", {})
    assert (first.index, second.index) == (0, 1)
    assert world.create_turn("s2", "u2", "again", {}).index == 1
    turn = world.get_turn("t1")
    assert turn == first
    assert turn.session_id == "s1" and turn.prompt == "one"
    assert turn.config == {"agent": "builtin", "n": [1, 2]}
    assert turn.status == TurnStatus.QUEUED
    assert (turn.attempts, turn.lease_owner, turn.result, turn.finished_at) == (0, None, None, None)


def test_list_turns_by_session_in_index_order_and_all_newest_first(world: World) -> None:
    world.create_session("s1")
    world.create_session("s2")
    world.create_turn("s1", "t1", "one", {})
    world.create_turn("s2", "u1", "uno", {})
    world.create_turn("s1", "t2", "two", {})
    assert [t.turn_id for t in world.list_turns("s1")] == ["t1", "t2"]
    assert [t.index for t in world.list_turns("s1")] == [0, 1]
    assert [t.turn_id for t in world.list_turns()] == ["t2", "u1", "t1"]
    assert [t.turn_id for t in world.list_turns(limit=1)] == ["t2"]
    assert world.list_turns("empty") == []


def test_has_unfinished_turns_counts_queued_running_and_waiting_only(world: World) -> None:
    """What ``worker --until-idle`` asks: an older waiting turn behind newer finished ones
    is found; done and failed turns are not work."""
    assert not world.has_unfinished_turns()
    new_turn(world, "t1")
    assert world.has_unfinished_turns()  # queued
    lease = world.claim("w1", 30.0)
    assert lease is not None and lease.turn_id == "t1"
    assert world.has_unfinished_turns()  # running
    world.suspend(lease, time.time() + 3600, "timer")
    for n in range(3):  # newer turns, all finished
        new_turn(world, f"d{n}", session_id=f"s-d{n}")
        done = world.claim("w1", 30.0)
        assert done is not None and done.turn_id == f"d{n}"
        world.complete_turn(done, "ok")
    assert world.has_unfinished_turns()  # waiting
    world.enqueue("t1")  # woken
    woken = world.claim("w1", 30.0)
    assert woken is not None and woken.turn_id == "t1"
    world.complete_turn(woken, "ok")
    new_turn(world, "f1", session_id="s-f1")
    failed = world.claim("w1", 30.0)
    assert failed is not None and failed.turn_id == "f1"
    world.fail_turn(failed, "broken")
    assert not world.has_unfinished_turns()


def test_session_records_point_at_blobs(world: World) -> None:
    world.create_session("s1")
    assert world.get_session_record("s1", "transcript") is None
    first = world.put_blob(b"v1")
    world.put_session_record("s1", "transcript", first)
    assert world.get_session_record("s1", "transcript") == first
    second = world.put_blob(b"v2")
    world.put_session_record("s1", "transcript", second)
    assert world.get_session_record("s1", "transcript") == second
    assert world.get_session_record("s1", "other") is None


# -- queue and leases ------------------------------------------------------------------
def test_claim_on_empty_queue_returns_none(world: World) -> None:
    assert world.claim("w1", 30) is None


def test_claim_bumps_epoch_and_attempt(world: World) -> None:
    new_turn(world)
    before = time.time()
    lease = world.claim("w1", 30)
    assert lease is not None
    assert (lease.turn_id, lease.session_id, lease.owner) == ("t1", "s1", "w1")
    assert (lease.epoch, lease.attempt) == (1, 1)
    assert before + 29 < lease.expires_at < time.time() + 31
    turn = world.get_turn("t1")
    assert turn.status == TurnStatus.RUNNING
    assert (turn.epoch, turn.attempts, turn.lease_owner) == (1, 1, "w1")


def test_claim_takes_the_oldest_turn_first(world: World) -> None:
    for turn_id in ("t1", "t2", "t3"):
        new_turn(world, turn_id)
    order = [lease.turn_id for lease in iter(lambda: world.claim("w", 30), None)]
    assert order == ["t1", "t2", "t3"]


def test_live_lease_is_not_claimed_twice(world: World) -> None:
    claimed(world)
    assert world.claim("w2", 30) is None


def test_expired_lease_is_delivered_again_with_higher_epoch(world: World) -> None:
    first = claimed(world, lease_seconds=SHORT_LEASE)
    time.sleep(AFTER_SHORT_LEASE)
    second = world.claim("w2", 30)
    assert second is not None and second.turn_id == first.turn_id
    assert second.epoch > first.epoch and second.attempt == 2
    assert world.get_turn("t1").lease_owner == "w2"


def test_renew_extends_the_lease(world: World) -> None:
    lease = claimed(world, lease_seconds=SHORT_LEASE)
    renewed = world.renew(lease, 30)
    assert renewed.expires_at > lease.expires_at + 20
    assert renewed.epoch == lease.epoch
    time.sleep(AFTER_SHORT_LEASE)
    assert world.claim("w2", 30) is None  # the renewed lease still holds


def test_renew_after_another_claim_is_lease_lost(world: World) -> None:
    old = claimed(world, lease_seconds=SHORT_LEASE)
    time.sleep(AFTER_SHORT_LEASE)
    assert world.claim("w2", 30) is not None
    with pytest.raises(LeaseLost):
        world.renew(old, 30)


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda w, old: w.insert_intent(intent(old, 1)), id="insert_intent"),
        pytest.param(lambda w, old: finish(w, old, 0), id="finish_step"),
        pytest.param(lambda w, old: w.restart_intent(old.turn_id, 0, old.epoch), id="restart"),
        pytest.param(lambda w, old: w.complete_turn(old, "stale"), id="complete_turn"),
        pytest.param(lambda w, old: w.fail_turn(old, "stale"), id="fail_turn"),
        pytest.param(lambda w, old: w.release(old), id="release"),
    ],
)
def test_stale_epoch_writes_are_fenced(
    world: World, write: Callable[[World, Lease], object]
) -> None:
    old = claimed(world)
    world.insert_intent(intent(old, 0))
    new = world.claim_turn("t1", "w2", 30, force=True)
    assert new is not None and new.epoch > old.epoch
    with pytest.raises(LeaseLost):
        write(world, old)
    # Nothing the zombie tried changed the turn or its journal.
    turn = world.get_turn("t1")
    assert turn.status == TurnStatus.RUNNING and turn.epoch == new.epoch
    [step] = world.load_steps("t1")
    assert step.status == StepStatus.INTENT and step.attempts == 1
    world.insert_intent(intent(new, 1))  # the new holder writes freely


def test_release_with_delay_hides_the_turn_until_then(world: World) -> None:
    lease = claimed(world)
    # Long enough that the claim below comes before it ends on a loaded machine too (with
    # 0.35 s, three pytest workers on one shared moto server sometimes took longer).
    delay = 2.0
    world.release(lease, delay=delay, error="model timed out")
    turn = world.get_turn("t1")
    assert turn.status == TurnStatus.QUEUED and turn.error == "model timed out"
    assert turn.lease_owner is None
    assert world.claim("w2", 30) is None
    time.sleep(delay + 0.1)
    again = world.claim("w2", 30)
    assert again is not None and again.attempt == 2 and again.epoch > lease.epoch


def test_release_without_delay_is_claimable_at_once(world: World) -> None:
    world.release(claimed(world))
    assert world.claim("w2", 30) is not None


def test_dead_letter_after_max_attempts_with_the_last_error(
    open_test_world: Callable[..., World],
) -> None:
    world = open_test_world(max_attempts=2)
    new_turn(world)
    for _ in range(2):
        lease = world.claim("w", 30)
        assert lease is not None
        world.release(lease, error="boom: upstream 500")
    assert world.claim("w", 30) is None
    turn = world.get_turn("t1")
    assert turn.status == TurnStatus.FAILED and turn.attempts == 2
    assert turn.error is not None
    assert "dead-lettered after 2 deliveries" in turn.error and "boom: upstream 500" in turn.error
    assert world.claim("w", 30) is None
    assert world.claim_turn("t1", "w", 30, force=True) is None


def test_count_turns_by_status_with_dead_letters_apart(
    open_test_world: Callable[..., World],
) -> None:
    """What the metrics exporter reads: every status counted, and among the failed turns
    those the queue dead-lettered (a turn failed for good is not one of them)."""
    world = open_test_world(max_attempts=1)
    assert world.count_turns() == TurnCounts()
    new_turn(world, "dead", session_id="s-dead")
    lease = world.claim("w", 30)
    assert lease is not None and lease.turn_id == "dead"
    world.release(lease, error="boom")
    assert world.claim("w", 30) is None  # dead-lettered instead
    new_turn(world, "failed", session_id="s-failed")
    lease = world.claim("w", 30)
    assert lease is not None and lease.turn_id == "failed"
    world.fail_turn(lease, "failed for good")
    new_turn(world, "waiting", session_id="s-waiting")
    lease = world.claim("w", 30)
    assert lease is not None and lease.turn_id == "waiting"
    world.suspend(lease, time.time() + 3600, "timer")
    new_turn(world, "running", session_id="s-running")
    assert world.claim("w", 30) is not None
    new_turn(world, "queued", session_id="s-queued")
    assert world.count_turns() == TurnCounts(
        queued=1, running=1, waiting=1, failed=2, dead_lettered=1
    )


def test_dead_letter_after_leases_ran_out_says_so(open_test_world: Callable[..., World]) -> None:
    world = open_test_world(max_attempts=1)
    new_turn(world, "t1")
    new_turn(world, "t2")
    first = world.claim("w", SHORT_LEASE)
    assert first is not None and first.turn_id == "t1"
    time.sleep(AFTER_SHORT_LEASE)
    # t1 is dead-lettered and skipped: the same claim goes on to t2.
    nxt = world.claim("w", 30)
    assert nxt is not None and nxt.turn_id == "t2"
    turn = world.get_turn("t1")
    assert turn.status == TurnStatus.FAILED
    assert turn.error is not None and "lease expired" in turn.error
    with pytest.raises(LeaseLost):  # the zombie of the dead-lettered turn is fenced out
        world.complete_turn(first, "late")


def test_claim_turn_without_and_with_force(world: World) -> None:
    new_turn(world)
    lease = world.claim_turn("t1", "w1", 30)
    assert lease is not None and (lease.epoch, lease.attempt) == (1, 1)
    assert world.claim_turn("t1", "w2", 30) is None  # live lease
    forced = world.claim_turn("t1", "w2", 30, force=True)
    assert forced is not None and forced.owner == "w2"
    assert (forced.epoch, forced.attempt) == (2, 2)
    with pytest.raises(LeaseLost):
        world.renew(lease, 30)
    with pytest.raises(NotFound):
        world.claim_turn("nope", "w", 30)


def test_claim_turn_respects_delay_unless_forced(world: World) -> None:
    world.release(claimed(world), delay=60)
    assert world.claim_turn("t1", "w2", 30) is None
    assert world.claim_turn("t1", "w2", 30, force=True) is not None


def test_claim_turn_takes_an_expired_lease(world: World) -> None:
    claimed(world, lease_seconds=SHORT_LEASE)
    time.sleep(AFTER_SHORT_LEASE)
    lease = world.claim_turn("t1", "w2", 30)
    assert lease is not None and lease.attempt == 2


def test_complete_turn_is_final(world: World) -> None:
    lease = claimed(world, lease_seconds=SHORT_LEASE)
    world.complete_turn(lease, "all done")
    turn = world.get_turn("t1")
    assert turn.status == TurnStatus.DONE and turn.result == "all done"
    assert turn.finished_at is not None and turn.lease_owner is None
    time.sleep(AFTER_SHORT_LEASE)
    world.enqueue("t1")
    assert world.claim("w2", 30) is None
    assert world.claim_turn("t1", "w2", 30, force=True) is None
    assert world.get_turn("t1").status == TurnStatus.DONE
    with pytest.raises(LeaseLost):  # the lease ended with the turn
        world.release(lease)


def test_fail_turn_is_final(world: World) -> None:
    world.fail_turn(claimed(world), "tool registry is broken")
    turn = world.get_turn("t1")
    assert turn.status == TurnStatus.FAILED and turn.error == "tool registry is broken"
    assert world.claim("w2", 30) is None
    assert world.claim_turn("t1", "w2", 30, force=True) is None


def test_enqueue_is_deduplicated_by_turn(world: World) -> None:
    new_turn(world)
    world.enqueue("t1")
    world.enqueue("t1")
    assert world.claim("w", 30) is not None
    assert world.claim("w", 30) is None


def test_enqueue_with_delay(world: World) -> None:
    new_turn(world)
    delay = 1.0
    started = time.monotonic()
    world.enqueue("t1", delay=delay)
    early = world.claim("w", 30)
    # Under a loaded machine enqueue + claim can outlast the delay: only a claim that
    # returned before the delay was over says anything about it.
    if time.monotonic() - started < delay:
        assert early is None
    if early is None:
        # Deliverable once the delay is over: SQS counts its DelaySeconds in whole seconds
        # on its own clock, so a claim just past the delay may still find it hidden.
        time.sleep(max(0.0, delay - (time.monotonic() - started)))
        deadline = time.monotonic() + 3.0
        while (late := world.claim("w", 30)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert late is not None


# -- journal ---------------------------------------------------------------------------
def test_duplicate_seq_is_a_step_conflict(world: World) -> None:
    lease = claimed(world)
    world.insert_intent(intent(lease, 0, key="a"))
    with pytest.raises(StepConflict):
        world.insert_intent(intent(lease, 0, key="b"))


def test_duplicate_key_is_a_step_conflict(world: World) -> None:
    lease = claimed(world)
    world.insert_intent(intent(lease, 0, key="toolu_01"))
    with pytest.raises(StepConflict):
        world.insert_intent(intent(lease, 1, key="toolu_01"))
    assert [s.seq for s in world.load_steps("t1")] == [0]


def test_steps_are_unique_per_turn_not_globally(world: World) -> None:
    lease = claimed(world, "t1")
    other = claimed(world, "t2")
    world.insert_intent(intent(lease, 0, key="same"))
    world.insert_intent(intent(other, 0, key="same"))


def test_finishing_twice_is_a_step_conflict(world: World) -> None:
    lease = claimed(world)
    world.insert_intent(intent(lease, 0))
    finish(world, lease, 0)
    with pytest.raises(StepConflict):
        finish(world, lease, 0, output='"again"')
    with pytest.raises(StepConflict):
        world.restart_intent("t1", 0, lease.epoch)
    assert world.load_steps("t1")[0].output == '"ok"'


def test_load_steps_in_seq_order_with_outputs_and_meta(world: World) -> None:
    lease = claimed(world)
    assert world.load_steps("t1") == []
    blob = world.put_blob(b'"a large output"')
    for seq in (2, 0, 1):
        world.insert_intent(
            intent(lease, seq, kind="model" if seq == 0 else "tool", input='{"cmd": "ls"}')
        )
    finish(world, lease, 0, output='{"text": "hi"}', tokens=12, nested={"a": [1, None]})
    world.finish_step("t1", 1, lease.epoch, StepStatus.DONE, None, blob, {})
    world.finish_step("t1", 2, lease.epoch, StepStatus.POSSIBLY_RAN, '"maybe"', None, {})
    steps = world.load_steps("t1")
    assert [s.seq for s in steps] == [0, 1, 2]
    model, big, maybe = steps
    assert (model.kind, model.name, model.key, model.input_hash) == ("model", "bash", "k0", "hash0")
    assert model.input == '{"cmd": "ls"}'
    assert model.status == StepStatus.DONE and model.output == '{"text": "hi"}'
    assert model.meta == {"tokens": 12, "nested": {"a": [1, None]}}
    assert model.epoch == lease.epoch and model.attempts == 1
    assert model.finished_at is not None and model.finished_at >= model.started_at > 0
    assert big.output is None and big.output_blob == blob
    assert world.get_blob(big.output_blob) == b'"a large output"'
    assert maybe.status == StepStatus.POSSIBLY_RAN and maybe.output == '"maybe"'


def test_an_open_intent_is_reported_as_intent(world: World) -> None:
    lease = claimed(world)
    world.insert_intent(intent(lease, 0, meta={"idempotency_key": "t1:0"}))
    [step] = world.load_steps("t1")
    assert step.status == StepStatus.INTENT and step.output is None and step.finished_at is None
    assert step.meta == {"idempotency_key": "t1:0"}


def test_restart_intent_increments_attempts(world: World) -> None:
    lease = claimed(world, lease_seconds=SHORT_LEASE)
    first_start = time.time() - 100.0
    world.insert_intent(intent(lease, 0, started_at=first_start))
    time.sleep(AFTER_SHORT_LEASE)
    second = world.claim("w2", 30)
    assert second is not None
    assert world.restart_intent("t1", 0, second.epoch) == 2
    assert world.restart_intent("t1", 0, second.epoch) == 3
    [step] = world.load_steps("t1")
    assert step.attempts == 3 and step.status == StepStatus.INTENT
    # The first start is kept: a wait's deadline is measured from it, on every delivery.
    assert step.started_at == pytest.approx(first_start, abs=0.01)
    finish(world, second, 0)
    assert world.load_steps("t1")[0].status == StepStatus.DONE


def test_a_renewal_thread_shares_the_world_with_the_turn(world: World) -> None:
    lease = claimed(world)
    errors: list[BaseException] = []
    stop = threading.Event()

    def renew_loop() -> None:
        try:
            while not stop.is_set():
                world.renew(lease, 30)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=renew_loop)
    thread.start()
    try:
        for seq in range(30):
            world.insert_intent(intent(lease, seq))
            finish(world, lease, seq)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert len(world.load_steps("t1")) == 30


# -- several processes -----------------------------------------------------------------
CLAIMER = r"""
import json, sys, time
from durable_harness.worlds import open_world
from durable_harness.core.types import Step, StepStatus

spec = json.loads(sys.argv[1])
world = open_world(spec["name"], **spec["options"])
time.sleep(max(0.0, spec["start_at"] - time.time()))
claimed, errors = [], []
try:
    while (lease := world.claim(spec["owner"], 60)) is not None:
        claimed.append(lease.turn_id)
        time.sleep(0.02)  # the turn's work: the other processes claim meanwhile
        step = Step(turn_id=lease.turn_id, seq=0, key="k", kind="tool", name="n",
                    input_hash="h", epoch=lease.epoch)
        world.insert_intent(step)
        world.finish_step(lease.turn_id, 0, lease.epoch, StepStatus.DONE, "1", None, {})
        world.complete_turn(lease, spec["owner"])
except Exception as exc:
    errors.append(repr(exc))
print(json.dumps({"claimed": claimed, "errors": errors}))
"""


def test_several_processes_claim_each_turn_exactly_once(
    world_spec: WorldSpec, world: World
) -> None:
    turn_ids = [f"t{i:02d}" for i in range(20)]
    for turn_id in turn_ids:
        new_turn(world, turn_id, session_id=f"s{turn_id}")
    package_root = str(Path(durable_harness.__file__).resolve().parents[1])
    pythonpath = [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    start_at = time.time() + 2.0  # every child is up before anyone claims
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CLAIMER,
                json.dumps(
                    {
                        "name": world_spec.name,
                        "options": world_spec.options,
                        "owner": f"p{n}",
                        "start_at": start_at,
                    }
                ),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env,
        )
        for n in range(4)
    ]
    reports = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        reports.append(json.loads(out))
    assert [r["errors"] for r in reports] == [[]] * 4
    everything = [turn_id for r in reports for turn_id in r["claimed"]]
    assert sorted(everything) == turn_ids
    for turn_id in turn_ids:
        turn = world.get_turn(turn_id)
        assert turn.status == TurnStatus.DONE and turn.attempts == 1
        assert [s.status for s in world.load_steps(turn_id)] == [StepStatus.DONE]


# -- dead holders ------------------------------------------------------------------------
HOLDER = r"""
import json, sys, time
from durable_harness.worlds import open_world

spec = json.loads(sys.argv[1])
world = open_world(spec["name"], **spec["options"])
lease = world.claim("holder", 30)
print(json.dumps(None if lease is None else lease.epoch), flush=True)
time.sleep(120)
"""


def holding(world_spec: WorldSpec) -> tuple[subprocess.Popen[str], int]:
    """A child process that claims the one queued turn with a 30 s lease and keeps it;
    returns it and the lease's epoch."""
    package_root = str(Path(durable_harness.__file__).resolve().parents[1])
    pythonpath = [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER,
            json.dumps({"name": world_spec.name, "options": world_spec.options}),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)},
    )
    assert child.stdout is not None
    epoch = json.loads(child.stdout.readline() or "null")
    assert epoch is not None, "the holder process claimed nothing"
    return child, int(epoch)


def test_a_killed_holders_turn_is_claimed_before_its_lease_ends(
    world_spec: WorldSpec, world: World
) -> None:
    new_turn(world)
    child, epoch = holding(world_spec)
    child.kill()  # SIGKILL: nothing of the holder runs again
    child.wait()
    killed = time.monotonic()
    lease = None
    # A World that detects dead holders hands the turn out well before the 30 s lease;
    # one that does not (S3+SQS) keeps it held for the lease.
    while lease is None and time.monotonic() - killed < (
        10.0 if world.detects_dead_holders else 2.0
    ):
        lease = world.claim("w2", 30)
        time.sleep(0.05)
    if not world.detects_dead_holders:
        assert lease is None and world.claim_turn("t1", "w2", 30) is None
        return
    assert lease is not None and lease.turn_id == "t1"
    assert lease.epoch == epoch + 1 and lease.attempt == 2  # fenced like any takeover
    assert world.get_turn("t1").lease_owner == "w2"
    with pytest.raises(LeaseLost):
        world.insert_intent(intent(dataclasses.replace(lease, epoch=epoch), 0))


def test_claim_turn_takes_a_killed_holders_turn_at_once(
    world_spec: WorldSpec, world: World
) -> None:
    """What ``resume`` calls, without ``--force``."""
    new_turn(world)
    child, epoch = holding(world_spec)
    child.kill()
    child.wait()
    killed = time.monotonic()
    lease = None
    while lease is None and time.monotonic() - killed < (
        10.0 if world.detects_dead_holders else 2.0
    ):
        lease = world.claim_turn("t1", "w2", 30)
        time.sleep(0.05)
    assert (lease is not None) == world.detects_dead_holders
    if lease is not None:
        assert lease.epoch == epoch + 1


def test_a_stopped_holder_keeps_its_lease(world_spec: WorldSpec, world: World) -> None:
    """SIGSTOP: alive, just not running. Nobody takes its turn before the lease ends."""
    new_turn(world)
    child, epoch = holding(world_spec)
    child.send_signal(signal.SIGSTOP)
    try:
        until = time.monotonic() + 3.0  # well past any grace period of a takeover
        while time.monotonic() < until:
            assert world.claim("w2", 30) is None
            assert world.claim_turn("t1", "w2", 30) is None
            time.sleep(0.1)
        turn = world.get_turn("t1")
        assert turn.status == TurnStatus.RUNNING and turn.epoch == epoch
    finally:
        child.kill()
        child.wait()
