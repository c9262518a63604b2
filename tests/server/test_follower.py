"""The one follower of a serve process, on a real local World: a listener that does not
read holds at most the buffer's worth of events, and gets the rest, once and in order,
from the World as it reads."""

from __future__ import annotations

import asyncio
from pathlib import Path

from durable_harness.core import events as ev
from durable_harness.server.stream import Follower
from durable_harness.worlds import open_world


def test_a_slow_listener_holds_at_most_the_buffer_and_misses_nothing(tmp_path: Path) -> None:
    with open_world("local", data_dir=str(tmp_path / "world")) as world:
        world.create_session("ses_1")
        world.create_turn("ses_1", "turn_1", "p", {"agent": "builtin"})
        for n in range(40):
            data = {"seq": 0, "attempt": 1, "n": n, "text": str(n)}
            world.append_event("turn_1", ev.delta_key(0, 1, n), ev.TEXT_DELTA, data)
        follower = Follower(world, buffer=5, poll_s=0.02).start()

        async def read() -> list[int]:
            listener = follower.listen("turn_1", after=3)
            await asyncio.sleep(0.5)  # the follower had ten polls to overfill it
            assert listener.queue.qsize() == 5
            seen: list[int] = []
            while len(seen) < 37:
                event = await asyncio.wait_for(listener.queue.get(), 5)
                follower.took(listener)
                seen.append(event.seq)
                assert listener.queue.qsize() <= 5
            follower.leave(listener)
            return seen

        try:
            assert asyncio.run(read()) == list(range(4, 41))
        finally:
            follower.stop()
