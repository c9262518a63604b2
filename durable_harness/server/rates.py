"""Per-tenant rate limits, kept in the World so that every ``serve`` process shares them.

* **Turns per minute**: one ``take_rate`` per started turn on the bucket
  ``turns:<tenant>``, a fixed window of 60 s of the World's clock; atomic across
  processes, so two ``serve`` processes on one World hold one limit between them.
* **Concurrent turns**: the tenant's unfinished turns (queued, running, waiting) are
  counted from its newest :data:`COUNTED_TURNS` owned turns (so a request's cost does not
  grow with the tenant's history), before the per-minute limit is taken (so a request
  refused for its concurrency does not use up the minute). A count, not a reservation:
  requests that arrive at the same moment on several processes can each see room and
  together pass the limit by their number; the per-minute window bounds that.
* **Signals and sessions per minute**: ``signals:<tenant>`` and ``sessions:<tenant>``,
  the same fixed window: each is a record in the World.

A refusal is 429 with ``Retry-After`` (seconds), and nothing is recorded.
"""

from __future__ import annotations

import math

from durable_harness.core.errors import NotFound
from durable_harness.core.settings import ServeSettings
from durable_harness.core.types import UNFINISHED
from durable_harness.core.world import World
from durable_harness.server.errors import ApiError

WINDOW_S = 60.0
#: How many of a tenant's newest turns the concurrency limit looks at.
COUNTED_TURNS = 1000
#: Retry-After for the concurrency limit: a turn's end cannot be predicted.
CONCURRENT_RETRY_S = 5


def unfinished_turns(world: World, tenant: str, stop_at: int) -> int:
    """How many of the tenant's newest :data:`COUNTED_TURNS` turns are unfinished,
    counting up to ``stop_at``."""
    count = 0
    looked = 0
    before: tuple[float, str] | None = None
    while looked < COUNTED_TURNS:
        page = world.list_owned(tenant, "turn", limit=200, before=before)
        looked += len(page)
        for _created, turn_id in page:
            try:
                if world.get_turn(turn_id).status in UNFINISHED:
                    count += 1
            except NotFound:
                continue  # owned, but its creation never finished: nothing to run
            if count >= stop_at:
                return count
        if len(page) < 200:
            return count
        before = page[-1]
    return count


def admit_turn(world: World, tenant: str, limits: ServeSettings) -> None:
    """Raise a 429 :class:`ApiError` if the tenant may not start a turn now; else count it."""
    most = limits.api_max_concurrent_turns
    if most and unfinished_turns(world, tenant, most) >= most:
        raise ApiError(
            429,
            f"tenant {tenant!r} has {most} unfinished turns, the most it may have at once "
            "(DURABLE_HARNESS_API_MAX_CONCURRENT_TURNS): wait for one to end or cancel one",
            "too_many_turns",
            {"Retry-After": str(CONCURRENT_RETRY_S)},
        )
    # Last: a request refused for its concurrency does not use up the minute's budget.
    take(world, f"turns:{tenant}", limits.api_turns_per_minute, "turns", "TURNS_PER_MINUTE")


def admit_signal(world: World, tenant: str, limits: ServeSettings) -> None:
    """Raise a 429 :class:`ApiError` past the tenant's signals per minute; else count one."""
    per_minute = limits.api_signals_per_minute
    take(world, f"signals:{tenant}", per_minute, "signals", "SIGNALS_PER_MINUTE")


def admit_session(world: World, tenant: str, limits: ServeSettings) -> None:
    """Raise a 429 :class:`ApiError` past the tenant's sessions per minute; else count one."""
    take(
        world,
        f"sessions:{tenant}",
        limits.api_sessions_per_minute,
        "sessions",
        "SESSIONS_PER_MINUTE",
    )


def take(world: World, bucket: str, per_minute: int, what: str, setting: str) -> None:
    """One use of ``bucket`` in this minute's window, or a 429 (0: no limit)."""
    if per_minute and not world.take_rate(bucket, per_minute, WINDOW_S):
        left = WINDOW_S - (world.now() % WINDOW_S)
        tenant = bucket.split(":", 1)[1]
        raise ApiError(
            429,
            f"tenant {tenant!r} made {per_minute} {what} this minute, its limit "
            f"(DURABLE_HARNESS_API_{setting}): retry after the Retry-After seconds",
            "rate_limited",
            {"Retry-After": str(max(1, math.ceil(left)))},
        )
