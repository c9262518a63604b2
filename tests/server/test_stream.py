"""A turn's event stream through real `serve` processes: a finished turn's log replayed
from the World, SSE framing and resumption, and the client's iterator across a SIGKILL
and restart of `serve` on the same port."""

from __future__ import annotations

import json
import signal
import threading
import time

from serve_cases import error_of, token, world_of
from support import Harness, start_serve

from durable_harness.client import ApiError, Client, StreamEvent
from durable_harness.core import events as ev


def test_a_finished_turns_stream_replays_from_the_world(harness: Harness) -> None:
    """A turn run by a real worker (built-in agent, fake model) through the API: its
    stream, read after the turn ended, is its whole log once, in order, ending with
    turn.ended and the reply; SSE ids are the seqs; Last-Event-ID and ?after resume after
    the given seq; the turn's tokens are summed from its steps."""
    with world_of(harness) as world:
        acme = token(world, "acme")
    serve = start_serve(harness)
    try:
        with Client(serve.url, acme) as api:
            session = api.create_session("builtin")
            started = api.start_turn(session.session_id, "count to three")
            worker = harness.cli("worker", "--until-idle", timeout=120)
            assert worker.returncode == 0, worker.stderr
            turn = api.get_turn(started.turn_id)
            assert (turn.status, turn.reply) == ("done", "Counted to three."), turn
            assert turn.steps == 7 and turn.input_tokens > 0 and turn.output_tokens > 0

            got = list(api.events(started.turn_id))
            with world_of(harness) as world:
                log = world.read_events(started.turn_id)
            assert [e.seq for e in got] == list(range(1, len(log) + 1))
            assert [(e.seq, e.kind, e.data) for e in got] == [(e.seq, e.kind, e.data) for e in log]
            assert got[0].kind == ev.TURN_CREATED and got[-1].kind == ev.TURN_ENDED
            assert got[-1].data["result"] == "Counted to three."
            finished = [e.data["seq"] for e in got if e.kind == ev.STEP_FINISHED]
            assert finished == list(range(7)), "every journal step, once"

            with serve.http(acme) as http:
                raw = http.get(f"/v1/turns/{started.turn_id}/events", params={"after": 2})
                assert raw.headers["content-type"].startswith("text/event-stream")
                frames = [f for f in raw.text.replace("\r\n", "\n").split("\n\n") if f.strip()]
                first = dict(line.split(": ", 1) for line in frames[0].splitlines())
                assert first["id"] == "3" and first["event"] == got[2].kind
                assert json.loads(first["data"]) == {
                    "seq": 3, "kind": got[2].kind, "data": got[2].data, "at": got[2].at,
                }  # fmt: skip
                assert len(frames) == len(got) - 2
                resumed = http.get(
                    f"/v1/turns/{started.turn_id}/events", headers={"Last-Event-ID": "5"}
                )
                assert resumed.text.lstrip().startswith("id: 6")
                bad = http.get(
                    f"/v1/turns/{started.turn_id}/events", headers={"Last-Event-ID": "x"}
                )
                assert error_of(bad)[0] == 400
            assert list(api.events(started.turn_id, after=len(got))) == []
    finally:
        serve.stop()


def test_the_clients_iterator_survives_a_serve_sigkill_and_restart(harness: Harness) -> None:
    """A client follows a live turn's log; `serve` is SIGKILLed mid-stream and started
    again on the same port; the iterator reconnects by itself (Last-Event-ID) and ends
    after turn.ended with every event exactly once, in order, as the World holds them.
    The events are appended by the test as a writer without a lease, at a steady pace,
    so the kill lands mid-stream whatever the machine's speed."""
    with world_of(harness) as world:
        acme = token(world, "acme")
    serve = start_serve(harness)
    got: list[StreamEvent] = []
    failure: list[BaseException] = []
    with Client(serve.url, acme) as api:
        session = api.create_session("builtin")
        tid = api.start_turn(session.session_id, "count to three").turn_id

        def follow() -> None:
            try:
                got.extend(api.events(tid, retries=20, backoff=0.1, max_backoff=1.0))
            except BaseException as exc:  # reported by the main thread
                failure.append(exc)

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        with world_of(harness) as world:

            def write(n: int) -> None:
                key = ev.delta_key(0, 1, n)
                world.append_event(
                    tid, key, ev.TEXT_DELTA, {"seq": 0, "attempt": 1, "n": n, "text": f"{n} "}
                )

            for n in range(20):
                write(n)
                time.sleep(0.02)
            deadline = time.monotonic() + 10
            while len(got) < 10 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(got) >= 10, "the client saw the stream live before the kill"
            serve.stop(signal.SIGKILL)
            for n in range(20, 40):  # while no serve runs
                write(n)
            serve = start_serve(harness, port=serve.port)
            for n in range(40, 60):
                write(n)
                time.sleep(0.01)
            world.append_event(
                tid,
                ev.turn_ended_key(),
                ev.TURN_ENDED,
                {"status": "done", "result": "x", "error": None},
            )
            reader.join(timeout=60)
            log = world.read_events(tid)
    try:
        with Client(serve.url, "dh_0123456789abcdef_" + "x" * 40) as stranger:
            list(stranger.events(tid))
    except ApiError as exc:
        assert exc.status == 401, exc
    else:
        raise AssertionError("a bad token must not stream")
    finally:
        serve.stop()
    assert not failure, failure
    assert not reader.is_alive(), "the iterator ended after turn.ended"
    assert [e.seq for e in got] == [e.seq for e in log] == list(range(1, len(log) + 1))
    texts = [e.data["text"] for e in got if e.kind == ev.TEXT_DELTA]
    assert texts == [f"{n} " for n in range(60)]
    assert got[-1].kind == ev.TURN_ENDED
