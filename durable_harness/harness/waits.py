"""Durable waits: tools that park a turn until a timer fires or a signal arrives.

A wait is a journal step like any other. Its deadline is measured from the step's
``started_at``, which the journal recorded with the intent, so every replay of the step
computes the same deadline (invariant 6). While the timer has not fired and the signal
has not come, the step raises :class:`TurnSuspended`: the worker parks the turn in the
World (no lease, no process), and the World delivers it again at the deadline or when the
signal arrives. The step's outcome is the signal's payload or a timeout the model sees.

Signals of one name queue up: each ``wait_for_signal(name)`` takes the first signal of
that name that no earlier wait took.
The taking is recorded in the World (``claim_signal``, keyed by the wait's step ``seq``),
so a resumed or replayed wait gets the signal it got before, and a second wait on "ci"
gets the second CI result even when both results arrived before either wait began.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from durable_harness.core.errors import TurnSuspended
from durable_harness.core.world import Queue, Signal
from durable_harness.harness.journal import Journal
from durable_harness.harness.tools import Tool, ToolContext

MAX_WAIT_SECONDS = 30 * 24 * 3600.0


class WaitForSignalArgs(BaseModel):
    name: str = Field(description="the signal to wait for, e.g. 'ci' or 'approval'")
    timeout_seconds: float = Field(
        default=3600.0,
        gt=0,
        le=MAX_WAIT_SECONDS,
        description="give up after this many seconds; the result then says it timed out",
    )


class SleepArgs(BaseModel):
    seconds: float = Field(gt=0, le=MAX_WAIT_SECONDS, description="how long to wait")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: The wait tools every agent has: a user's host tool may not take these names.
WAIT_TOOL_NAMES = ("wait_for_signal", "sleep_until")


def _take(
    world: Queue, ctx: ToolContext, args: WaitForSignalArgs, signals: list[Signal]
) -> str | None:
    """The payload of the signal this wait step took (before, or now), or None."""
    for signal in signals:
        if signal.claimed_by == ctx.seq:
            return signal.payload
    for signal in signals:
        if signal.claimed_by is None:
            if world.claim_signal(ctx.turn_id, args.name, signal.index, ctx.seq):
                return signal.payload
            # Another step took it between our read and our claim: look again.
            return _take(world, ctx, args, world.list_signals(ctx.turn_id, args.name))
    return None


def wait_tools(world: Queue, journal: Journal) -> list[Tool]:
    def started_at(ctx: ToolContext) -> float:
        return journal.recorded[ctx.seq].started_at

    def wait_for_signal(args: WaitForSignalArgs, ctx: ToolContext) -> str:
        deadline = started_at(ctx) + args.timeout_seconds
        signals = world.list_signals(ctx.turn_id, args.name)
        payload = _take(world, ctx, args, signals)
        if payload is not None:
            return f"signal {args.name!r} arrived: {payload}"
        if journal.now() >= deadline:
            return (
                f"timed out: no signal {args.name!r} arrived within "
                f"{args.timeout_seconds:g} seconds"
            )
        waiting_for = f"signal {args.name!r} until {_iso(deadline)}"
        raise TurnSuspended(deadline, waiting_for, args.name, seen=len(signals))

    def sleep_until(args: SleepArgs, ctx: ToolContext) -> str:
        wake = started_at(ctx) + args.seconds
        if journal.now() >= wake:
            return f"waited {args.seconds:g} seconds (until {_iso(wake)})"
        raise TurnSuspended(wake, f"timer until {_iso(wake)}")

    return [
        Tool(
            "wait_for_signal",
            "Wait, without holding any process, until a named signal arrives (a CI result, "
            "a human approval) or the timeout passes. Returns the signal's data.",
            WaitForSignalArgs,
            "safe",
            wait_for_signal,
        ),
        Tool(
            "sleep_until",
            "Wait a number of seconds without holding any process (the turn is parked).",
            SleepArgs,
            "safe",
            sleep_until,
        ),
    ]
