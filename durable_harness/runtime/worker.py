"""The worker: claims turns from the World's queue and drives them to the end.

A turn is driven under a renewed lease. How a turn ends decides what the queue does:

* the adapter returns a reply -> ``complete_turn``;
* the lease was lost (another worker fenced us out) -> nothing: the turn is theirs;
* the turn was cancelled (``CANCEL_SIGNAL``: found at claim, before anything runs, or
  noticed by the lease keeper while it runs, when the journal refuses the next step and
  the adapter's stoppers end its agent) -> ``cancel_turn``;
* a permanent error (divergence, bad configuration, an agent that cannot finish, a turn
  that asks for more than this worker's operator allows: :mod:`.runtime.admission`,
  checked before anything of the turn is imported or run) -> ``fail_turn`` with the
  message;
* anything else (model endpoint down, a crash in our code) -> ``release`` with a backoff;
  the World dead-letters the turn after ``max_attempts`` deliveries.

**Stopping** (:meth:`Worker.stop`: ``durable-harness worker`` on SIGTERM, a deploy). The
worker claims nothing more and stops the turn it runs the way a worker that fenced itself
does: no new step begins (the one in flight finishes), a CLI agent's launch ends and a
Docker-hosted CLI job is left running for the next worker to re-attach. Then it releases
the turn's lease at once (deliverable now, to any worker) and returns. If the step in
flight outlasts ``stop_grace_seconds``, a timer releases the lease anyway and ends the
process (exit 143): the step stays an intent under its replay rule, as after a crash.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
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
    TurnCancelled,
    TurnFailed,
    TurnSuspended,
    WorldError,
)
from durable_harness.core.settings import Settings
from durable_harness.core.turn_config import TurnConfig
from durable_harness.core.types import CANCEL_SIGNAL, UNFINISHED, Lease
from durable_harness.core.world import World
from durable_harness.harness.budget import Budget
from durable_harness.harness.cancel import Cancellation
from durable_harness.harness.crash import CrashPlan
from durable_harness.harness.events import TurnEvents, settle_finished
from durable_harness.harness.journal import Journal, StepEvent
from durable_harness.harness.lease import LeaseKeeper
from durable_harness.runtime.admission import admit
from durable_harness.runtime.telemetry import Delivery, Telemetry, telemetry

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
    CANCELLED = "cancelled"


class Worker:
    def __init__(
        self,
        world: World,
        settings: Settings,
        *,
        owner: str | None = None,
        on_step: Callable[[StepEvent], None] | None = None,
        on_event: Callable[[str], None] | None = None,
        tracing: Telemetry | None = None,
    ) -> None:
        self.world = world
        self.settings = settings
        self.owner = owner or default_owner()
        self.on_step = on_step
        self.on_event = on_event or (lambda msg: log.info("%s", msg))
        self.crash = CrashPlan.from_env()
        #: Spans of each delivery and its steps (runtime/telemetry: off unless configured).
        self.tracing = tracing if tracing is not None else telemetry()
        self._stopping = threading.Event()
        self._lock = threading.RLock()
        self._gc_due = time.monotonic()  # an idle worker with gc_older_than set runs gc
        self._running: tuple[Lease, LeaseKeeper] | None = None  # the turn driven now

    def stop(self, reason: str = "the worker is stopping") -> None:
        """Claim nothing more; hand the running turn back (see the module doc). Safe to
        call from a signal handler or any thread; returns at once."""
        self._stopping.set()
        with self._lock:
            running = self._running
        if running is None:
            return
        lease, keeper = running
        # Only the agent is stopped: the lease is still renewed until the step in flight
        # has finished and the turn is handed back (a lapse would let another worker take
        # it while that step still runs).
        keeper.stop_agent(reason)
        timer = threading.Timer(
            self.settings.stop_grace_seconds, self._release_now, (lease, keeper)
        )
        timer.daemon = True
        timer.start()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _release_now(self, lease: Lease, keeper: LeaseKeeper) -> None:
        """The grace period ran out with the step still running: give the turn back and
        end the process (the step stays an intent; the next worker follows its rule)."""
        with self._lock:
            if self._running is None or self._running[0] != lease:
                return
        self.on_event(
            f"turn {lease.turn_id}: its step outlasted the {self.settings.stop_grace_seconds:.0f}s"
            " stop grace period; releasing it and exiting"
        )
        self._hand_back(keeper.lease)
        os._exit(143)

    def drive(self, lease: Lease) -> str:
        """Run one claimed turn to its end; return a :class:`TurnOutcome` value."""
        delivery = self.tracing.delivery(lease)
        outcome = "error"  # an exception left the delivery (the World went away, say)
        try:
            outcome = self._drive(lease, delivery)
            return outcome
        finally:
            delivery.end(outcome)

    def _drive(self, lease: Lease, delivery: Delivery) -> str:
        turn = self.world.get_turn(lease.turn_id)
        requested = self._cancel_requested(lease.turn_id)
        if requested is not None:  # cancelled while queued or waiting: nothing runs
            return self._cancelled(lease, requested)
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
        delivery.begin(turn, self.owner)
        events = TurnEvents(
            self.world,
            lease.turn_id,
            lease.epoch,
            lease.attempt,
            flush_seconds=self.settings.event_flush_seconds,
        )
        cancel = Cancellation()
        with LeaseKeeper(
            self.world,
            lease,
            self.settings.lease_seconds,
            cancel=cancel,
            cancel_poll=self.settings.cancel_poll_seconds,
        ) as keeper:
            with self._lock:
                self._running = (lease, keeper)
            if self.stopping:  # told to stop between the claim and here
                keeper.stop_agent("the worker is stopping")
            try:
                # The stored turn is data from whoever enqueued it: checked against this
                # worker's policy first; the adapter sees only the admitted configuration.
                admitted = admit(turn.config, self.settings)
                turn = replace(turn, config=admitted.config)
                adapter = get_adapter(TurnConfig.of(admitted.config).agent)
                journal = Journal(
                    self.world,
                    lease,
                    crash=self.crash,
                    on_step=self._on_step(keeper, delivery),
                    max_model_calls=admitted.max_model_calls,
                    cancel=cancel,
                    events=events,
                    budget=Budget.of(
                        self.world, turn.turn_id, turn.session_id, admitted.config, self.settings
                    ),
                )
                # Before anything runs: what a dead worker left out of the log goes in
                # first, so its abandoned attempt comes before this one's events.
                recorded = journal.recorded
                events.begin_attempt(self.owner, [recorded[seq] for seq in sorted(recorded)])
                delivery.lost(events.lost, recorded)
                reply = adapter.run_turn(TurnRun(self.world, turn, journal, self.settings))
                if not self.stopping:  # a stop let the last step finish: the turn ends here
                    keeper.check()  # lost, or fenced while the agent finished: not ours
                # A cancel that came while the agent finished, before the keeper looked.
                late = cancel.reason or self._cancel_requested(lease.turn_id)
                if late is not None:
                    return self._cancelled(lease, late, events)
                self.world.complete_turn(lease, reply)
                self._log_settled(lease.turn_id, events)
                self.on_event(f"turn {turn.turn_id}: done")
                return TurnOutcome.DONE
            except TurnCancelled as exc:
                if cancel.fenced:
                    return self._left(lease, exc.reason, events)
                return self._cancelled(lease, exc.reason, events)
            except TurnSuspended as exc:
                wait = exc
                self._settle(
                    lambda: events.waiting(wait.waiting_for, wait.wake_at),
                    lambda: self.world.suspend(
                        lease, wait.wake_at, wait.waiting_for, wait.signal, wait.seen
                    ),
                )
                self._wake_if_cancelled(lease.turn_id)
                self.on_event(f"turn {turn.turn_id}: parked, waiting for {wait.waiting_for}")
                return TurnOutcome.WAITING
            except LeaseLost as exc:
                return self._left(lease, str(exc), events)
            except PERMANENT as exc:
                if cancel.fenced:  # stopped because this worker fenced itself
                    return self._left(lease, str(exc), events)
                if cancel.reason is not None:  # the agent failed because it was stopped
                    return self._cancelled(lease, cancel.reason, events)
                reason = str(exc)
                self.on_event(f"turn {turn.turn_id}: failed: {reason}")
                if self._settle(lambda: self.world.fail_turn(lease, reason)):
                    self._log_settled(lease.turn_id, events)
                return TurnOutcome.FAILED
            except Exception as exc:
                if cancel.fenced:
                    return self._left(lease, repr(exc), events)
                if cancel.reason is not None:
                    return self._cancelled(lease, cancel.reason, events)
                delay = min(2.0**lease.attempt, 60.0)
                message = str(exc) if isinstance(exc, DurableHarnessError) else repr(exc)
                self.on_event(f"turn {turn.turn_id}: will retry in {delay:.0f}s: {message}")
                self._settle(
                    lambda: events.released(message, delay),
                    lambda: self.world.release(lease, delay=delay, error=message),
                )
                return TurnOutcome.RELEASED
            finally:
                with self._lock:
                    self._running = None
                events.close()

    def run(self, *, until_idle: bool = False, max_turns: int | None = None) -> int:
        """Claim and drive turns; return how many were driven."""
        driven = 0
        outage = 0  # consecutive failed claims: the World is down or unreachable
        while (max_turns is None or driven < max_turns) and not self.stopping:
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
                self._maybe_gc()
                self.world.wait_for_work(self.settings.poll_seconds)
                continue
            self.drive(lease)
            driven += 1
        return driven

    # -- helpers ---------------------------------------------------------------------
    def _maybe_gc(self) -> None:
        """Run ``gc`` when idle, every ``gc_every_seconds``, if the operator set
        ``gc_older_than`` (a setting of the worker's environment, never of a turn). Two
        workers' runs at once are safe (each removal and delete re-checks)."""
        older_than = self.settings.gc_older_than
        if older_than is None or time.monotonic() < self._gc_due:
            return
        self._gc_due = time.monotonic() + self.settings.gc_every_seconds
        from durable_harness.runtime.gc import collect

        try:
            report = collect(self.world, older_than, grace=self.settings.gc_grace_seconds)
        except (WorldError, ConfigError) as exc:
            self.on_event(
                f"gc failed ({exc}); trying again in {self.settings.gc_every_seconds:.0f}s"
            )
            return
        self.on_event(report.line())

    def _left(self, lease: Lease, why: str, events: TurnEvents) -> str:
        """The lease was lost, or this worker fenced itself: nothing more is written; or
        the worker is stopping: the turn is handed back at once."""
        if self.stopping:
            with self._lock:
                keeper = self._running[1] if self._running is not None else None
            current = keeper.lease if keeper is not None else lease
            try:
                events.released("the worker is stopping", 0.0)
            except (LeaseLost, WorldError) as exc:  # the next claim marks the attempt lost
                self.on_event(f"turn {lease.turn_id}: its hand-back is not in the log ({exc})")
            if self._hand_back(current):
                self.on_event(f"turn {lease.turn_id}: handed back, the worker is stopping")
                return TurnOutcome.RELEASED
        with self._lock:
            keeper = self._running[1] if self._running is not None else None
        if keeper is not None and self._hand_back(keeper.lease):
            # It fenced itself while the turn was still its own (renewals late, not
            # refused): deliverable again at once rather than after the rest of its lease.
            self.on_event(f"turn {lease.turn_id}: stopped here ({why}); handed back at once")
            return TurnOutcome.LOST
        self.on_event(f"turn {lease.turn_id}: lease lost, leaving it to its new owner ({why})")
        return TurnOutcome.LOST

    def _hand_back(self, lease: Lease) -> bool:
        """Release ``lease`` now (no delay): True if it was still ours."""
        try:
            self.world.release(lease, delay=0.0)
            return True
        except LeaseLost:
            return False
        except WorldError as exc:
            self.on_event(f"turn {lease.turn_id}: could not hand it back ({exc}); its lease lapses")
            return False

    def _on_step(self, keeper: LeaseKeeper, delivery: Delivery) -> Callable[[StepEvent], None]:
        def on_step(event: StepEvent) -> None:
            delivery.step(event)
            keeper.check()  # stop before the next call once we know we were fenced out
            if self.on_step is not None:
                self.on_step(event)

        return on_step

    def _cancel_requested(self, turn_id: str) -> str | None:
        """The reason of the turn's first cancel request, or None (one World read)."""
        found = self.world.list_signals(turn_id, CANCEL_SIGNAL)
        return found[0].payload if found else None

    def _cancelled(self, lease: Lease, reason: str, events: TurnEvents | None = None) -> str:
        self.on_event(f"turn {lease.turn_id}: cancelled: {reason}")
        if self._settle(lambda: self.world.cancel_turn(lease, reason)):
            self._log_settled(lease.turn_id, events)
        return TurnOutcome.CANCELLED

    def _wake_if_cancelled(self, turn_id: str) -> None:
        """A cancel sent while the turn ran, before it parked, woke nobody (the turn was
        not waiting yet): make the parked turn deliverable now, to end it ``cancelled``."""
        try:
            if self._cancel_requested(turn_id) is not None:
                self.world.enqueue(turn_id)
        except WorldError as exc:
            self.on_event(f"turn {turn_id}: a cancel is pending but cannot wake it ({exc})")

    def _settle(self, *writes: Callable[[], None]) -> bool:
        """Run ``writes`` in order (an event, then the turn's state): True if all landed.
        A failed event is logged and the state written anyway: the attempt is then left
        open in the log, and the next claim marks it lost."""
        ok = True
        for write in writes:
            try:
                write()
            except LeaseLost:
                self.on_event("lease lost before the turn's end could be recorded")
                return False
            except WorldError as exc:
                # The World is unreachable: the turn's lease runs out and it is redelivered.
                self.on_event(f"could not record how the turn ended ({exc}); its lease will lapse")
                ok = False
        return ok

    def _log_settled(self, turn_id: str, events: TurnEvents | None = None) -> None:
        """``turn.ended`` after the turn's end (done, failed or cancelled) is recorded,
        once the attempt's text timer is stopped. A failure here loses nothing: ``serve``
        settles a finished turn's log when it reaches it."""
        try:
            if events is not None:
                events.close()
            settle_finished(self.world, turn_id)
        except WorldError as exc:
            self.on_event(f"turn {turn_id}: its event log is settled later ({exc})")

    def _earlier_turn_pending(self, lease: Lease) -> bool:
        turn = self.world.get_turn(lease.turn_id)
        return any(
            t.index < turn.index and t.status in UNFINISHED
            for t in self.world.list_turns(turn.session_id)
        )

    def _work_pending(self) -> bool:
        """A turn that will become claimable: queued, waiting, or running under a lease."""
        return self.world.has_unfinished_turns()
