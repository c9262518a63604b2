"""What only the S3+SQS World's event log and tenancy promise, on moto and SeaweedFS: the
races between clients that each keep their own cache of a turn's log (separate
processes, in effect), a log read past what a writer left, and owners raced for by two
tenants. The contract suite (``test_contract_events.py``) runs on this World too."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import services_s3

from durable_harness.core.errors import LeaseLost, StepConflict
from durable_harness.core.types import Event, Lease
from durable_harness.worlds import open_world
from durable_harness.worlds.s3sqs import S3SqsWorld
from durable_harness.worlds.s3sqs.store import Doc, Precondition
from durable_harness.worlds.s3sqs.tenancy import from_order_key, order_key


@pytest.fixture(params=["moto", "seaweedfs"])
def opened(request: pytest.FixtureRequest) -> Iterator[Callable[[], S3SqsWorld]]:
    s3 = services_s3.moto().url if request.param == "moto" else services_s3.seaweedfs().url
    worlds: list[S3SqsWorld] = []
    with services_s3.s3sqs_env(s3, services_s3.moto().url) as options:

        def open_() -> S3SqsWorld:
            world = open_world("s3sqs", **options)
            assert isinstance(world, S3SqsWorld)
            worlds.append(world)
            return world

        yield open_
        for world in worlds:
            world.close()


def in_threads(n: int, work: Callable[[int], Any]) -> list[Any]:
    """``work(i)`` in ``n`` threads released together; their results (or exceptions)."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def counting_lost_races(
    put: Callable[..., Doc], lost: list[str], together: threading.Barrier
) -> Callable[..., Doc]:
    """``put`` that counts the creates lost to another client. A client's first put waits
    for every other client's, so that all of them race for seq 1: threads released at once
    may still run one after the other on a loaded machine, and then nothing races."""
    waited = False

    def counted(key: str, data: dict[str, Any], **conditions: Any) -> Doc:
        nonlocal waited
        if not waited:
            waited = True
            together.wait(timeout=30)
        try:
            return put(key, data, **conditions)
        except Precondition:
            lost.append(key)
            raise

    return counted


def test_clients_racing_with_the_same_keys_store_each_once(
    opened: Callable[[], S3SqsWorld],
) -> None:
    """Six clients (six caches, as six processes) append the same 20 keys at once, in
    different orders: every create at a seq someone else took is a lost race that must
    read what won. Each key lands once, seqs 1..20, and every client got the stored event."""
    world = opened()
    world.create_session("s1")
    world.create_turn("s1", "t1", "prompt", {})
    clients = [opened() for _ in range(6)]
    keys = [f"k{n}" for n in range(20)]
    lost: list[str] = []
    together = threading.Barrier(len(clients))
    for client in clients:
        counted = counting_lost_races(client._store.put, lost, together)
        client._store.put = counted  # type: ignore[method-assign]

    def append_all(i: int) -> list[Event]:
        order = keys if i % 2 == 0 else random.Random(i).sample(keys, len(keys))
        return [clients[i].append_event("t1", key, "k", {"by": i}) for key in order]

    results = in_threads(len(clients), append_all)
    assert not [r for r in results if isinstance(r, Exception)], results
    stored = {e.key: e for e in world.read_events("t1")}
    assert [e.seq for e in world.read_events("t1")] == list(range(1, 21))
    assert sorted(stored) == sorted(keys)
    assert all(event == stored[event.key] for got in results for event in got)
    print(f"\n6 clients x 20 keys: {len(lost)} creates lost to another client")
    assert lost, "no create raced another: the test did not test the lost race"


def test_a_client_behind_the_log_catches_up_and_a_reader_stops_at_a_gap(
    opened: Callable[[], S3SqsWorld],
) -> None:
    behind, ahead = opened(), opened()
    behind.create_session("s1")
    behind.create_turn("s1", "t1", "prompt", {})
    behind.append_event("t1", "a", "k", {})  # its cache now knows 1
    ahead.append_event("t1", "b", "k", {"n": 2, "text": "\x00\udcff"})  # NUL, lone surrogate
    ahead.append_event("t1", "c", "k", {"n": 3})
    # The key another client appended comes back as that client's event, not a new one.
    assert behind.append_event("t1", "c", "k", {"n": "again"}).data == {"n": 3}
    assert behind.append_event("t1", "d", "k", {}).seq == 4
    # An object past a missing seq (no writer leaves one: seq n + 1 is tried only after
    # n exists) ends every read before the gap.
    store = ahead._store
    stray = {"turn_id": "t1", "seq": 6, "key": "f", "kind": "k", "data": {}, "at": 1.0}
    store.put(store.layout.event("t1", 6), {**stray, "epoch": None}, if_none_match=True)
    assert [e.seq for e in ahead.read_events("t1")] == [1, 2, 3, 4]
    assert behind.append_event("t1", "e", "k", {}).seq == 5  # its cursor was 4
    assert behind.append_event("t1", "g", "k", {}).seq == 7  # 6 taken: read, then 7
    events = opened().read_events("t1")
    assert [e.key for e in events] == ["a", "b", "c", "d", "e", "f", "g"]
    assert events[1].data == {"n": 2, "text": "\x00\udcff"}


@pytest.mark.parametrize("new_owner_appends_first", [False, True])
def test_a_fenced_append_racing_a_takeover(
    opened: Callable[[], S3SqsWorld], new_owner_appends_first: bool
) -> None:
    """The window the events module documents: the takeover lands between the zombie's
    epoch check and its create. If the zombie's create then wins its seq, that one event
    lands, stamped with the old epoch, before the new owner's first; if the new owner
    appended first, the zombie's create loses, its retry checks the epoch again and is
    refused. Either way its next append is refused."""
    zombie, other = opened(), opened()
    zombie.create_session("s1")
    zombie.create_turn("s1", "t1", "prompt", {})
    old = zombie.claim_turn("t1", "w1", 30)
    assert old is not None
    real_fence = zombie._journal.fence
    taken: list[Lease] = []

    def fence_then_taken_over(turn_id: str, epoch: int) -> Any:
        doc = real_fence(turn_id, epoch)
        if not taken:
            lease = other.claim_turn(turn_id, "w2", 30, force=True)
            assert lease is not None
            taken.append(lease)
            if new_owner_appends_first:
                other.append_event(turn_id, "attempt:2:started", "k", {}, lease.epoch)
        return doc

    zombie._journal.fence = fence_then_taken_over  # type: ignore[method-assign]
    if new_owner_appends_first:
        with pytest.raises(LeaseLost):
            zombie.append_event("t1", "step:0:1:delta:0", "text.delta", {}, old.epoch)
    else:
        late = zombie.append_event("t1", "step:0:1:delta:0", "text.delta", {}, old.epoch)
        assert (late.seq, late.epoch) == (1, old.epoch)
        other.append_event("t1", "attempt:2:started", "k", {}, taken[0].epoch)
    with pytest.raises(LeaseLost):
        zombie.append_event("t1", "step:0:1:delta:1", "text.delta", {}, old.epoch)
    new = taken[0].epoch
    logged = [(e.key, e.epoch) for e in other.read_events("t1")]
    if new_owner_appends_first:
        assert logged == [("attempt:2:started", new)]
    else:
        assert logged == [("step:0:1:delta:0", old.epoch), ("attempt:2:started", new)]


def test_two_tenants_racing_for_items_each_list_only_their_own(
    opened: Callable[[], S3SqsWorld],
) -> None:
    acme, globex = opened(), opened()
    for n in range(10):
        results = in_threads(
            2, lambda i, n=n: (acme, globex)[i].put_owner("turn", f"t{n}", "ab"[i], 100.0 + n)
        )
        assert sorted(type(r).__name__ for r in results) == ["NoneType", "StepConflict"]
    # The entry a lost race leaves behind (written before the owner object), for sure:
    store = acme._store
    store.put_bytes(store.layout.owned("b", "turn") + order_key(100.5, "t0"), b"")
    owners = {f"t{n}": acme.get_owner("turn", f"t{n}") for n in range(10)}
    for tenant in "ab":
        mine = sorted(
            ((100.0 + n, f"t{n}") for n in range(10) if owners[f"t{n}"] == tenant), reverse=True
        )
        pages: list[tuple[float, str]] = []
        while page := globex.list_owned(tenant, "turn", limit=2, before=(pages or [None])[-1]):
            pages += page
        assert pages == mine, (tenant, owners)
    with pytest.raises(StepConflict):
        globex.put_owner("turn", "t0", "a" if owners["t0"] == "b" else "b", 100.0)


def test_the_order_of_owned_entries_is_time_then_id_descending_and_exact() -> None:
    rnd = random.Random(7)
    times = [0.0, 1.5, -3.0, 5.0, 1e-300, 1764638926.123456789] + [
        rnd.uniform(-1e12, 1e12) for _ in range(20)
    ]
    pieces = ["a", "b", "ab", "/", "%", "-", " ", "é", "\U0001f600", "\udcff"]
    items = {
        (rnd.choice(times), "".join(rnd.choices(pieces, k=rnd.randint(0, 4)))) for _ in range(2000)
    }
    assert all(from_order_key(order_key(t, i)) == (t, i) for t, i in items)

    def code_points(item: tuple[float, str]) -> tuple[float, bytes]:
        return item[0], item[1].encode("utf-8", "surrogatepass")

    by_name = sorted(items, key=lambda item: order_key(*item))
    assert by_name == sorted(items, key=code_points, reverse=True)
