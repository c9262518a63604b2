"""The World contract's event log and tenancy facets (``core/world.py``: ``EventLog``,
``Tenancy``), run against every backend like ``test_contract.py``."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from durable_harness.core.errors import LeaseLost, NotFound, StepConflict, WorldError
from durable_harness.core.types import ApiToken, TurnStatus
from durable_harness.core.world import MAX_EVENT_BYTES, World

if TYPE_CHECKING:
    from conftest import WorldSpec


def new_turn(world: World, turn_id: str = "t1", session_id: str = "s1") -> str:
    world.create_session(session_id)
    world.create_turn(session_id, turn_id, f"prompt of {turn_id}", {})
    return turn_id


# -- the event log ----------------------------------------------------------------------
def test_events_are_numbered_from_one_without_gaps(world: World) -> None:
    new_turn(world)
    first = world.append_event("t1", "a", "turn.created", {"n": 1})
    second = world.append_event("t1", "b", "x.y", {"n": 2, "text": "é\u2028"})
    assert (first.seq, second.seq) == (1, 2)
    events = world.read_events("t1")
    assert [(e.seq, e.key, e.kind, e.data) for e in events] == [
        (1, "a", "turn.created", {"n": 1}),
        (2, "b", "x.y", {"n": 2, "text": "é\u2028"}),
    ]
    assert all(e.turn_id == "t1" and e.at > 0 and e.epoch is None for e in events)
    assert [e.seq for e in world.read_events("t1", after=1)] == [2]
    assert world.read_events("t1", after=2) == []
    assert world.read_events("unknown") == []


def test_a_key_is_appended_once(world: World) -> None:
    new_turn(world)
    first = world.append_event("t1", "a", "k", {"v": 1})
    world.append_event("t1", "b", "k", {})
    again = world.append_event("t1", "a", "k", {"v": "different"})
    assert again.seq == first.seq and again.data == {"v": 1}
    assert [e.key for e in world.read_events("t1")] == ["a", "b"]


def test_events_of_turns_are_apart(world: World) -> None:
    new_turn(world, "t1")
    new_turn(world, "t2", "s2")
    world.append_event("t1", "a", "k", {})
    assert world.append_event("t2", "a", "k", {}).seq == 1
    assert [e.turn_id for e in world.read_events("t2")] == ["t2"]


def test_read_events_pages_by_limit(world: World) -> None:
    new_turn(world)
    for n in range(7):
        world.append_event("t1", f"e{n}", "k", {"n": n})
    assert [e.seq for e in world.read_events("t1", after=0, limit=3)] == [1, 2, 3]
    assert [e.seq for e in world.read_events("t1", after=3, limit=3)] == [4, 5, 6]
    assert [e.seq for e in world.read_events("t1", after=6, limit=3)] == [7]


def test_fenced_append_needs_the_current_epoch_of_a_running_turn(world: World) -> None:
    new_turn(world)
    with pytest.raises(LeaseLost):  # queued: no lease holds it
        world.append_event("t1", "early", "k", {}, epoch=0)
    old = world.claim("w1", 30)
    assert old is not None
    assert world.append_event("t1", "a", "k", {}, epoch=old.epoch).epoch == old.epoch
    new = world.claim_turn("t1", "w2", 30, force=True)
    assert new is not None
    with pytest.raises(LeaseLost):
        world.append_event("t1", "zombie", "k", {}, epoch=old.epoch)
    world.append_event("t1", "b", "k", {}, epoch=new.epoch)
    world.complete_turn(new, "done")
    with pytest.raises(LeaseLost):  # finished: no lease holds it any more
        world.append_event("t1", "late", "k", {}, epoch=new.epoch)
    # A writer without a lease (serve reconciling a finished turn) still appends.
    world.append_event("t1", "turn:ended", "turn.ended", {"status": "done"})
    assert [e.key for e in world.read_events("t1")] == ["a", "b", "turn:ended"]


def test_a_fenced_append_of_a_known_key_returns_it_even_when_fenced(world: World) -> None:
    """A worker that lost its lease after its append landed, and appends again, is told
    LeaseLost or gets its event back; it never makes a second one."""
    new_turn(world)
    lease = world.claim("w1", 30)
    assert lease is not None
    world.append_event("t1", "a", "k", {}, epoch=lease.epoch)
    world.claim_turn("t1", "w2", 30, force=True)
    with contextlib.suppress(LeaseLost):
        world.append_event("t1", "a", "k", {}, epoch=lease.epoch)
    assert [e.key for e in world.read_events("t1")] == ["a"]


def test_append_to_an_unknown_turn_is_not_found(world: World) -> None:
    with pytest.raises(NotFound):
        world.append_event("nope", "a", "k", {})


def test_oversized_event_is_refused(world: World) -> None:
    new_turn(world)
    with pytest.raises(WorldError):
        world.append_event("t1", "big", "k", {"text": "x" * (MAX_EVENT_BYTES + 1)})
    assert world.read_events("t1") == []


def test_concurrent_appends_stay_gap_free_and_once_per_key(world: World) -> None:
    """Threads of one client racing (the proxy's deltas, a signal, serve) and repeating
    each other's keys: every key once, seqs 1..n."""
    new_turn(world)
    keys = [f"k{n}" for n in range(24)]
    errors: list[BaseException] = []

    def writer(offset: int) -> None:
        try:
            for n in range(len(keys)):
                world.append_event("t1", keys[(n + offset) % len(keys)], "k", {})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i * 5,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    events = world.read_events("t1")
    assert [e.seq for e in events] == list(range(1, len(keys) + 1))
    assert sorted(e.key for e in events) == sorted(keys)


_APPENDER = """
import sys
from durable_harness.worlds import open_world
import json
name, options, prefix = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
with open_world(name, **options) as world:
    for n in range(15):
        world.append_event("t1", f"{prefix}{n % 10}", "k", {"by": prefix})
"""


def test_processes_appending_at_once_stay_gap_free(world: World, world_spec: WorldSpec) -> None:
    """Two processes (two serve processes, a worker and a serve): every key once, 1..n,
    and a reader following along never sees a seq out of order."""
    new_turn(world)
    args = [world_spec.name, json.dumps(world_spec.options)]
    children = [
        subprocess.Popen([sys.executable, "-c", _APPENDER, *args, prefix]) for prefix in ("a", "b")
    ]
    seen: list[int] = []
    deadline = time.monotonic() + 120
    while any(c.poll() is None for c in children) and time.monotonic() < deadline:
        after = seen[-1] if seen else 0
        seen.extend(e.seq for e in world.read_events("t1", after=after))
        time.sleep(0.01)
    assert [c.wait(timeout=60) for c in children] == [0, 0]
    seen.extend(e.seq for e in world.read_events("t1", after=seen[-1] if seen else 0))
    assert seen == list(range(1, 21))
    assert sorted(e.key for e in world.read_events("t1")) == sorted(
        [f"a{n}" for n in range(10)] + [f"b{n}" for n in range(10)]
    )


def test_wait_for_events_returns_by_its_timeout(world: World) -> None:
    started = time.monotonic()
    world.wait_for_events(0.2)
    assert time.monotonic() - started < 10


def test_cancel_turn_is_final(world: World) -> None:
    new_turn(world)
    lease = world.claim("w1", 30)
    assert lease is not None
    world.cancel_turn(lease, "cancelled by the API")
    turn = world.get_turn("t1")
    assert turn.status == TurnStatus.CANCELLED and turn.error == "cancelled by the API"
    assert turn.finished_at is not None
    assert world.claim("w2", 30) is None
    assert world.claim_turn("t1", "w2", 30) is None
    assert world.claim_turn("t1", "w2", 30, force=True) is None
    assert not world.has_unfinished_turns()
    world.enqueue("t1")  # a finished turn is not delivered again
    assert world.claim("w2", 30) is None


def test_cancel_needs_the_current_lease(world: World) -> None:
    new_turn(world)
    old = world.claim("w1", 30)
    assert old is not None
    world.claim_turn("t1", "w2", 30, force=True)
    with pytest.raises(LeaseLost):
        world.cancel_turn(old, "stale")
    assert world.get_turn("t1").status == TurnStatus.RUNNING


# -- tenancy ----------------------------------------------------------------------------
def token(token_id: str, tenant: str = "acme", **fields: Any) -> ApiToken:
    return ApiToken(
        token_id=token_id,
        tenant=tenant,
        digest=fields.pop("digest", "d" * 64),
        created_at=fields.pop("created_at", 1000.0),
        **fields,
    )


def test_tokens_round_trip_and_revoke(world: World) -> None:
    world.put_token(token("tok1", label="ci bot"))
    world.put_token(token("tok2", tenant="ops", operator=True, created_at=1001.0))
    assert world.get_token("tok1") == token("tok1", label="ci bot")
    assert world.get_token("tok2").operator is True
    assert [t.token_id for t in world.list_tokens()] == ["tok1", "tok2"]
    revoked = world.revoke_token("tok1", 2000.0)
    assert revoked.revoked_at == 2000.0
    assert world.revoke_token("tok1", 3000.0).revoked_at == 2000.0
    assert world.get_token("tok1").revoked_at == 2000.0
    with pytest.raises(StepConflict):
        world.put_token(token("tok1"))
    with pytest.raises(NotFound):
        world.get_token("nope")
    with pytest.raises(NotFound):
        world.revoke_token("nope", 1.0)


def test_owners_and_their_pages(world: World) -> None:
    for n in range(5):
        world.put_owner("session", f"s{n}", "acme", 100.0 + n)
    world.put_owner("session", "other", "globex", 200.0)
    world.put_owner("turn", "t0", "acme", 300.0)
    world.put_owner("session", "s1", "acme", 101.0)  # idempotent
    with pytest.raises(StepConflict):
        world.put_owner("session", "s1", "globex", 101.0)
    assert world.get_owner("session", "s1") == "acme"
    assert world.get_owner("session", "other") == "globex"
    assert world.get_owner("turn", "s1") is None
    assert world.get_owner("session", "unknown") is None
    page = world.list_owned("acme", "session", limit=2)
    assert page == [(104.0, "s4"), (103.0, "s3")]
    page = world.list_owned("acme", "session", limit=2, before=page[-1])
    assert page == [(102.0, "s2"), (101.0, "s1")]
    assert world.list_owned("acme", "session", limit=2, before=page[-1]) == [(100.0, "s0")]
    assert world.list_owned("acme", "turn") == [(300.0, "t0")]
    assert world.list_owned("nobody", "session") == []


def test_owners_with_the_same_time_page_by_id(world: World) -> None:
    for name in ("a", "b", "c"):
        world.put_owner("turn", name, "acme", 5.0)
    first = world.list_owned("acme", "turn", limit=2)
    assert first == [(5.0, "c"), (5.0, "b")]
    assert world.list_owned("acme", "turn", limit=2, before=first[-1]) == [(5.0, "a")]


def test_take_rate_counts_up_to_the_limit_per_bucket(world: World) -> None:
    assert [world.take_rate("acme:turns", 3, 3600) for _ in range(4)] == [
        True,
        True,
        True,
        False,
    ]
    assert world.take_rate("globex:turns", 3, 3600) is True


def test_take_rate_opens_a_new_window(world: World) -> None:
    window = 1.0
    # Start just after a window boundary so both takes land in one window.
    time.sleep(window - (world.now() % window) + 0.05)
    assert world.take_rate("b", 1, window) is True
    assert world.take_rate("b", 1, window) is False
    time.sleep(window + 0.1)
    assert world.take_rate("b", 1, window) is True


_RATE_TAKER = """
import sys, json
from durable_harness.worlds import open_world
name, options = sys.argv[1], json.loads(sys.argv[2])
with open_world(name, **options) as world:
    print(sum(world.take_rate("shared", 10, 3600) for _ in range(8)))
"""


def test_take_rate_holds_across_processes(world: World, world_spec: WorldSpec) -> None:
    args = [world_spec.name, json.dumps(world_spec.options)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _RATE_TAKER, *args], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    taken = [int(c.communicate(timeout=120)[0]) for c in children]
    assert sum(taken) == 10, taken
    assert world.take_rate("shared", 10, 3600) is False
