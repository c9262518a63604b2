"""The worker: claims turns from the World's queue and drives them to the end.

A turn is driven under a renewed lease. How a turn ends decides what the queue does:

* the adapter returns a reply -> ``complete_turn``;
* the lease was lost (another worker fenced us out) -> nothing: the turn is theirs;
* a permanent error (divergence, bad configuration, an agent that cannot finish, a turn
  that asks for more than this worker's operator allows: :mod:`.runtime.admission`,
  checked before anything of the turn is imported or run) -> ``fail_turn`` with the
  message;
* anything else (model endpoint down, a crash in our code) -> ``release`` with a backoff;
  the World dead-letters the turn after ``max_attempts`` deliveries.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace

from durable_harness.adapters import get_adapter
from durable_harness.adapters.base import TurnRun
from durable_harness.core.errors import (
    ConfigError,
    DurableHarnessError,
    LeaseLost,
    ReplayDivergence,
    ToolDefinitionError,
    TurnFailed,
    TurnSuspended,
    WorldError,
)
from durable_harness.core.settings import Settings
from durable_harness.core.types import UNFINISHED, Lease
from durable_harness.core.world import World
from durable_harness.harness.crash import CrashPlan
from durable_harness.harness.journal import Journal, StepEvent
from durable_harness.harness.lease import LeaseKeeper
from durable_harness.runtime.admission import admit

log = logging.getLogger(__name__)

# A corrupt row is not permanent: the turn is released with the error (nothing deleted) so
# an operator can repair the row; it is dead-lettered if nobody does.
PERMANENT = (ReplayDivergence, ConfigError, ToolDefinitionError, TurnFailed)
#: Turns of one session run in order; a later one waits this long between looks.
SESSION_ORDER_DELAY = 1.0


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class TurnOutcome:
    DONE = "done"
    FAILED = "failed"
    RELEASED = "released"
    WAITING = "waiting"
    LOST = "lost"


class Worker:
    def __init__(
        self,
        world: World,
        settings: Settings,
        *,
        owner: str | None = None,
        on_step: Callable[[StepEvent], None] | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.world = world
        self.settings = settings
        self.owner = owner or default_owner()
        self.on_step = on_step
        self.on_event = on_event or (lambda msg: log.info("%s", msg))
        self.crash = CrashPlan.from_env()

    def drive(self, lease: Lease) -> str:
        """Run one claimed turn to its end; return a :class:`TurnOutcome` value."""
        turn = self.world.get_turn(lease.turn_id)
        if self._earlier_turn_pending(lease):
            # Parked, not released: waiting for its turn must not use up deliveries.
            wake = time.time() + SESSION_ORDER_DELAY
            try:
                self.world.suspend(lease, wake, "an earlier turn of its session")
            except NotImplementedError:
                self.world.release(lease, delay=SESSION_ORDER_DELAY)
            return TurnOutcome.WAITING
        self.on_event(
            f"turn {turn.turn_id}: delivery {lease.attempt}, epoch {lease.epoch}, "
            f"owner {self.owner}"
        )
        with LeaseKeeper(self.world, lease, self.settings.lease_seconds) as keeper:
            try:
                # The stored turn is data from whoever enqueued it: checked against this
                # worker's policy first; the adapter sees only the admitted configuration.
                admitted = admit(turn.config, self.settings)
                turn = replace(turn, config=admitted.config)
                adapter = get_adapter(str(turn.config.get("agent", "builtin")))
                journal = Journal(
                    self.world,
                    lease,
                    crash=self.crash,
                    on_step=self._on_step(keeper),
                    max_model_calls=admitted.max_model_calls,
                )
                reply = adapter.run_turn(TurnRun(self.world, turn, journal, self.settings))
                keeper.check()
                self.world.complete_turn(lease, reply)
                self.on_event(f"turn {turn.turn_id}: done")
                return TurnOutcome.DONE
            except TurnSuspended as exc:
                wait = exc
                self._settle(
                    lambda: self.world.suspend(
                        lease, wait.wake_at, wait.waiting_for, wait.signal, wait.seen
                    )
                )
                self.on_event(f"turn {turn.turn_id}: parked, waiting for {wait.waiting_for}")
                return TurnOutcome.WAITING
            except LeaseLost as exc:
                self.on_event(
                    f"turn {turn.turn_id}: lease lost, leaving it to its new owner ({exc})"
                )
                return TurnOutcome.LOST
            except PERMANENT as exc:
                reason = str(exc)
                self.on_event(f"turn {turn.turn_id}: failed: {reason}")
                self._settle(lambda: self.world.fail_turn(lease, reason))
                return TurnOutcome.FAILED
            except Exception as exc:
                delay = min(2.0**lease.attempt, 60.0)
                message = str(exc) if isinstance(exc, DurableHarnessError) else repr(exc)
                self.on_event(f"turn {turn.turn_id}: will retry in {delay:.0f}s: {message}")
                self._settle(lambda: self.world.release(lease, delay=delay, error=message))
                return TurnOutcome.RELEASED

    def run(self, *, until_idle: bool = False, max_turns: int | None = None) -> int:
        """Claim and drive turns; return how many were driven."""
        driven = 0
        outage = 0  # consecutive failed claims: the World is down or unreachable
        while max_turns is None or driven < max_turns:
            try:
                lease = self.world.claim(self.owner, self.settings.lease_seconds)
            except WorldError as exc:
                # A worker outlives a World outage (a database restart, a network blip):
                # it keeps trying, backing off, and says so; the turns wait in the World.
                outage += 1
                delay = min(self.settings.poll_seconds * 2.0**outage, 30.0)
                self.on_event(f"cannot claim turns ({exc}); trying again in {delay:.1f}s")
                time.sleep(delay)
                continue
            outage = 0
            if lease is None:
                if until_idle and not self._work_pending():
                    return driven
                self.world.wait_for_work(self.settings.poll_seconds)
                continue
            self.drive(lease)
            driven += 1
        return driven

    # -- helpers ---------------------------------------------------------------------
    def _on_step(self, keeper: LeaseKeeper) -> Callable[[StepEvent], None]:
        def on_step(event: StepEvent) -> None:
            keeper.check()  # stop before the next call once we know we were fenced out
            if self.on_step is not None:
                self.on_step(event)

        return on_step

    def _settle(self, write: Callable[[], None]) -> None:
        try:
            write()
        except LeaseLost:
            self.on_event("lease lost before the turn's end could be recorded")
        except WorldError as exc:
            # The World is unreachable: the turn's lease runs out and it is redelivered.
            self.on_event(f"could not record how the turn ended ({exc}); its lease will lapse")

    def _earlier_turn_pending(self, lease: Lease) -> bool:
        turn = self.world.get_turn(lease.turn_id)
        return any(
            t.index < turn.index and t.status in UNFINISHED
            for t in self.world.list_turns(turn.session_id)
        )

    def _work_pending(self) -> bool:
        """A turn that will become claimable: queued, waiting, or running under a lease."""
        return self.world.has_unfinished_turns()
