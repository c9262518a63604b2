"""Two `serve` processes on one PostgreSQL World: a tenant's limits hold across them
(they are counted in the World, not in either process), and a stream read through one
follows what lands in the World live (NOTIFY) and replays a turn finished elsewhere."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres_server import PostgresServer
from serve_cases import TOOL_SETS, error_of, token, world_of
from support import FIXTURES, Harness, make_harness, start_serve

from durable_harness.client import Client, StreamEvent
from durable_harness.core import events as ev


@pytest.fixture
def on_postgres(tmp_path: Path, postgres: PostgresServer) -> Iterator[Harness]:
    with postgres.database() as url:
        for h in make_harness(tmp_path, FIXTURES / "serve.toml"):
            h.env["DURABLE_HARNESS_TOOL_SETS"] = TOOL_SETS
            h.use_postgres(url)
            yield h


def test_limits_hold_across_two_serves_and_streams_follow_the_world(on_postgres: Harness) -> None:
    """Limits 2 unfinished turns and 3 turns a minute, on both serves: the tenant's
    turns posted through either count toward both limits (429 with Retry-After, nothing
    recorded), another tenant has its own; a turn ended by someone else streams through
    the other serve with its log settled; a live turn's events reach a client within a
    second of landing in the World."""
    h = on_postgres
    limits = {
        "DURABLE_HARNESS_API_TURNS_PER_MINUTE": "3",
        "DURABLE_HARNESS_API_MAX_CONCURRENT_TURNS": "2",
    }
    one, two = start_serve(h, **limits), start_serve(h, **limits)
    with world_of(h) as world:
        a, b = token(world, "tenant-a"), token(world, "tenant-b")
        if world.now() % 60 > 50:  # the minute's window must not turn over mid-test
            time.sleep(61 - world.now() % 60)
        with one.http(a) as a1, two.http(a) as a2, two.http(b) as b2:
            sid = a1.post("/v1/sessions", json={"agent": "builtin"}).json()["session_id"]
            turns = f"/v1/sessions/{sid}/turns"
            first = a1.post(turns, json={"prompt": "count to three"})
            second = a2.post(turns, json={"prompt": "count to three"})
            assert (first.status_code, second.status_code) == (202, 202), second.text
            busy = a1.post(turns, json={"prompt": "count to three"})
            status, code, message = error_of(busy)
            assert (status, code) == (429, "too_many_turns"), message
            assert "DURABLE_HARNESS_API_MAX_CONCURRENT_TURNS" in message
            assert int(busy.headers["Retry-After"]) > 0

            b_sid = b2.post("/v1/sessions", json={"agent": "builtin"}).json()["session_id"]
            assert b2.post(f"/v1/sessions/{b_sid}/turns", json={"prompt": "x"}).status_code == 202

            for response in (first, second):  # ended here, by a writer of our own
                tid = response.json()["turn_id"]
                lease = world.claim_turn(tid, "test", 30, force=True)
                assert lease is not None
                world.complete_turn(lease, "done elsewhere")
            third = a2.post(turns, json={"prompt": "count to three"})
            assert third.status_code == 202, third.text
            late = a1.post(turns, json={"prompt": "count to three"})
            status, code, message = error_of(late)
            assert (status, code) == (429, "rate_limited"), message
            assert 0 < int(late.headers["Retry-After"]) <= 60
            assert len(world.list_turns(sid)) == 3, "a refused turn is not recorded"

        with Client(two.url, a) as api:
            ended = list(api.events(first.json()["turn_id"]))
        assert [e.kind for e in ended] == [ev.TURN_CREATED, ev.TURN_ENDED]
        assert ended[-1].data["result"] == "done elsewhere"

        live_tid = third.json()["turn_id"]
        got: list[tuple[StreamEvent, float]] = []

        def follow() -> None:
            with Client(one.url, a) as api:
                got.extend((e, time.monotonic()) for e in api.events(live_tid))

        def delta(n: int) -> float:
            data = {"seq": 0, "attempt": 1, "n": n, "text": "live "}
            world.append_event(live_tid, ev.delta_key(0, 1, n), ev.TEXT_DELTA, data)
            return time.monotonic()

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        delta(0)
        deadline = time.monotonic() + 20
        while not any(e.kind == ev.TEXT_DELTA for e, _ in got) and time.monotonic() < deadline:
            time.sleep(0.01)  # the first delta arrived: the stream is open, following
        landed = []
        for n in (1, 2, 3):
            time.sleep(0.3)
            landed.append(delta(n))
        data = {"status": "done", "result": "x", "error": None}
        world.append_event(live_tid, ev.turn_ended_key(), ev.TURN_ENDED, data)
        reader.join(timeout=20)
    one.stop()
    two.stop()
    assert not reader.is_alive()
    kinds = [e.kind for e, _ in got if e.kind != ev.TURN_CREATED]
    assert kinds == [*[ev.TEXT_DELTA] * 4, ev.TURN_ENDED]
    assert [e.seq for e, _ in got] == list(range(1, len(got) + 1))
    live = [seen for e, seen in got if e.kind == ev.TEXT_DELTA][1:]
    lags = [seen - put for seen, put in zip(live, landed, strict=True)]
    assert max(lags) < 1.0, lags
