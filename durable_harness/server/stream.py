"""A turn's event stream: ``GET /v1/turns/{id}/events`` as Server-Sent Events.

Each event goes out as ``id: <seq>``, ``event: <kind>``, ``data: {"seq", "kind", "data",
"at"}``. A stream starts after ``Last-Event-ID`` (a reconnecting browser's header) or
``?after=N`` (else from the start), replays the log from the World, then follows it
live, and ends after ``turn.ended``. A comment line every ``api_heartbeat_s`` keeps
proxies from closing a quiet stream.

**One follower per process.** Replaying is each request's own (it reads the World in
pages, each page sent before the next is read). Following live is :class:`Follower`'s:
one thread that loops ``world.wait_for_events`` + ``read_events`` for just the turns
that have listeners, and hands each listener the events after its own cursor on its
event loop. So a thousand open streams cost a thousand small queues, not a thousand
threads or pollers.

**Once, in order, bounded.** A listener's cursor is the last seq handed to it, and the
World's log is gap-free, so each event is handed over once and in seq order (the
request's generator also drops anything at or below the seq it last sent, so a replay
page and a live hand-over that meet cannot repeat an event). A listener holds at most
``api_stream_buffer`` events not yet sent; past that the follower stops handing it
events and its cursor stays put: the rest wait in the World, where they are anyway,
until the client reads. A slow client costs memory up to the cap, never a lost event.

**A finished turn's log ends.** A turn can end with no ``turn.ended`` in its log (it was
dead-lettered at claim, or its worker died between ending it and appending). When a
stream has read everything and the turn is finished, it calls
``harness.events.settle_finished``, which completes the log from the journal (keys make
that safe when several processes do it), and goes on reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from durable_harness.core.events import TURN_ENDED
from durable_harness.core.types import FINISHED, Event
from durable_harness.core.world import World

log = logging.getLogger(__name__)

#: Events read from the World per call.
PAGE = 500
#: How often the follower asks whether a quiet turn has finished (its log may need settling).
SETTLE_CHECK_S = 1.0


@dataclass(eq=False)
class Listener:
    """One open stream: what the follower hands it, on its event loop."""

    turn_id: str
    cursor: int  # the last seq handed over (follower-side)
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    pending: int = 0  # handed over, not yet taken by the request (under Follower.lock)


class Follower:
    """The one thread per process that follows the live turns (see the module docstring)."""

    def __init__(self, world: World, *, buffer: int, poll_s: float) -> None:
        self.world = world
        self.buffer = buffer
        self.poll_s = poll_s
        self.lock = threading.Lock()
        self._listeners: dict[str, set[Listener]] = {}
        self._checked: dict[str, float] = {}
        self._someone = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Follower:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="event-follower", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._someone.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def listen(self, turn_id: str, after: int) -> Listener:
        listener = Listener(turn_id, after, asyncio.get_running_loop())
        with self.lock:
            self._listeners.setdefault(turn_id, set()).add(listener)
        self._someone.set()
        return listener

    def leave(self, listener: Listener) -> None:
        with self.lock:
            group = self._listeners.get(listener.turn_id)
            if group is not None:
                group.discard(listener)
                if not group:
                    del self._listeners[listener.turn_id]
                    self._checked.pop(listener.turn_id, None)

    def took(self, listener: Listener) -> None:
        """The request sent one event on: room for one more."""
        with self.lock:
            listener.pending -= 1

    def _run(self) -> None:
        while not self._stopping.is_set():
            with self.lock:
                turns = list(self._listeners)
                if not turns:
                    self._someone.clear()
            if not turns:
                self._someone.wait()
                continue
            busy = False
            for turn_id in turns:
                try:
                    busy |= self._follow(turn_id)
                except Exception:  # the World failing: streams wait, nothing is lost
                    log.exception("following turn %s failed; retrying", turn_id)
            if not busy:
                try:
                    self.world.wait_for_events(self.poll_s)
                except Exception:
                    log.exception("waiting for events failed; retrying")
                    time.sleep(self.poll_s)

    def _follow(self, turn_id: str) -> bool:
        """Hand the turn's new events to its listeners; whether a full page was read."""
        with self.lock:
            group = [x for x in self._listeners.get(turn_id, ()) if x.pending < self.buffer]
            if not group:
                return False
            after = min(x.cursor for x in group)
        events = self.world.read_events(turn_id, after=after, limit=PAGE)
        if not events:
            self._maybe_settle(turn_id)
            return False
        with self.lock:
            for listener in group:
                room = self.buffer - listener.pending
                fresh = [e for e in events if e.seq > listener.cursor][:room]
                if not fresh:
                    continue
                listener.cursor = fresh[-1].seq
                listener.pending += len(fresh)
                for event in fresh:
                    listener.loop.call_soon_threadsafe(listener.queue.put_nowait, event)
        return len(events) == PAGE

    def _maybe_settle(self, turn_id: str) -> None:
        now = time.monotonic()
        if now - self._checked.get(turn_id, 0.0) < SETTLE_CHECK_S:
            return
        self._checked[turn_id] = now
        settle_if_finished(self.world, turn_id)


def settle_if_finished(world: World, turn_id: str) -> bool:
    """Complete a finished turn's log (``turn.ended`` last); whether the turn is finished."""
    if world.get_turn(turn_id).status not in FINISHED:
        return False
    from durable_harness.harness.events import settle_finished

    settle_finished(world, turn_id)
    return True


def sse(event: Event) -> dict[str, Any]:
    """An event as sse-starlette sends it."""
    data = {"seq": event.seq, "kind": event.kind, "data": event.data, "at": event.at}
    return {"id": str(event.seq), "event": event.kind, "data": json.dumps(data)}


async def events(
    world: World,
    follower: Follower,
    turn_id: str,
    after: int,
    run: Any,
    *,
    lifetime: float = math.inf,
    allowed: Callable[[], Awaitable[bool]] | None = None,
    recheck_s: float = 15.0,
    release: Callable[[], None] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """The stream of one request: replay from the World, then the follower's hand-overs.

    ``run`` runs a blocking World call off the event loop (the app's thread pool). The
    live part ends after ``lifetime`` seconds (the client resumes from its last event),
    or when ``allowed()``, asked every ``recheck_s``, says the caller may no longer read
    (its token was revoked). ``release`` is called once the stream is over."""
    try:
        async for item in _events(
            world, follower, turn_id, after, run, lifetime, allowed, recheck_s
        ):
            yield item
    finally:
        if release is not None:
            release()


async def _events(
    world: World,
    follower: Follower,
    turn_id: str,
    after: int,
    run: Any,
    lifetime: float,
    allowed: Callable[[], Awaitable[bool]] | None,
    recheck_s: float,
) -> AsyncIterator[dict[str, Any]]:
    last = after
    settled = False
    while True:  # replay, a page at a time
        page: list[Event] = await run(world.read_events, turn_id, last, PAGE)
        for event in page:
            if event.seq <= last:
                continue
            last = event.seq
            yield sse(event)
            if event.kind == TURN_ENDED:
                return
        if len(page) == PAGE:
            continue
        if settled:
            return  # the log is complete and read to its end: the client had turn.ended
        if await run(settle_if_finished, world, turn_id):
            settled = True  # the log now ends with turn.ended: read on
            continue
        break
    listener = follower.listen(turn_id, last)
    ends = time.monotonic() + lifetime
    recheck = time.monotonic() + recheck_s
    try:
        while True:
            now = time.monotonic()
            if now >= ends:
                return  # a stream's lifetime is bounded: the client resumes from `last`
            if now >= recheck:
                if allowed is not None and not await allowed():
                    return  # the token was revoked since the stream began
                recheck = now + recheck_s
                continue
            try:
                event = await asyncio.wait_for(listener.queue.get(), min(ends, recheck) - now)
            except TimeoutError:
                continue
            follower.took(listener)
            if event.seq <= last:
                continue
            last = event.seq
            yield sse(event)
            if event.kind == TURN_ENDED:
                return
    finally:
        follower.leave(listener)
        with contextlib.suppress(Exception):
            while not listener.queue.empty():
                listener.queue.get_nowait()
