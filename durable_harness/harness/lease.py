"""Lease renewal: keeps a claimed turn's lease alive while the turn runs.

A daemon thread renews every third of the lease. If a renewal is refused (another worker
took the turn: the epoch moved on) it stops and marks the lease lost; the turn's own
writes are fenced by the World anyway, so a lost lease can never corrupt the journal.
A renewal that fails for a transient reason (database busy, network) is retried within a
second: the lease only runs out if renewals fail for a whole lease period.

**The worker fences itself first.** Another worker may claim the turn once its lease has
run out, whatever the reason renewals failed (the database unreachable from here only). So
before that can happen this worker stops the turn's agent: a watchdog thread (apart from
the renewing one, which may be blocked in a renewal that retries its connection) fences
the turn (:meth:`~.cancel.Cancellation.fence`: the journal refuses the next step with
``LeaseLost``, a CLI agent's launch is stopped) ``fence_margin`` seconds (a twentieth of
the lease, at most 1 s) before the lease could end, counted on this machine's monotonic
clock from the moment the last renewal that succeeded was *sent* (the World's expiry is
counted from when it arrived, later). The same fence runs at once when the World reports
that this process no longer holds its turns
(:meth:`~durable_harness.core.world.Queue.on_holder_lost`: PostgreSQL, when the
connection its claims are tied to drops, which lets another worker take them over within
a grace period, ``worlds/postgres/holder.py``).

The same thread looks for the turn's cancel request (``CANCEL_SIGNAL``) every
``cancel_poll`` seconds, when given a :class:`~.cancel.Cancellation` to set: one World
read per interval while the turn runs, none per step.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Self

from durable_harness.core.closing import Closing
from durable_harness.core.errors import LeaseLost, WorldError
from durable_harness.core.types import CANCEL_SIGNAL, Lease
from durable_harness.core.world import Queue
from durable_harness.harness.cancel import Cancellation

log = logging.getLogger(__name__)


#: A renewal that failed is tried again this soon (a lease of 30 s renews every 10 s).
RETRY_SECONDS = 1.0


class LeaseKeeper(Closing):
    def __init__(
        self,
        world: Queue,
        lease: Lease,
        lease_seconds: float,
        *,
        cancel: Cancellation | None = None,
        cancel_poll: float = 1.0,
    ) -> None:
        self.world = world
        self.lease = lease
        self.lease_seconds = lease_seconds
        self.cancel = cancel
        self.cancel_poll = cancel_poll
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: What stopping the agent may take (flags set, a CLI launch told to end).
        self.fence_margin = min(max(lease_seconds / 20.0, 0.05), 1.0)
        # The claim was sent before this keeper exists: until the first renewal the lease
        # is taken to end when it says (on the World's clock, which stamped it), and never
        # later than a whole lease from now.
        left = min(lease_seconds, lease.expires_at - world.now())
        self._fence_at = time.monotonic() + left - self.fence_margin
        self._unwatch: Callable[[], None] = lambda: None
        self._thread = threading.Thread(
            target=self._loop, name=f"lease-{lease.turn_id}", daemon=True
        )
        self._watchdog = threading.Thread(
            target=self._watch, name=f"lease-fence-{lease.turn_id}", daemon=True
        )

    def __enter__(self) -> Self:
        self._unwatch = self.world.on_holder_lost(
            self.lease,
            lambda why: self.fence(f"this worker no longer holds turn {self.lease.turn_id}: {why}"),
        )
        self._thread.start()
        self._watchdog.start()
        return self

    def close(self) -> None:
        """Stop renewing (``with`` calls it on the way out)."""
        self._unwatch()
        self._stop.set()
        self._thread.join(timeout=self.lease_seconds)
        self._watchdog.join(timeout=self.lease_seconds)

    def check(self) -> None:
        """Raise :class:`LeaseLost` if a renewal was refused or this worker fenced itself."""
        if self.lost.is_set():
            raise LeaseLost(
                f"lease on turn {self.lease.turn_id} was lost (or could not be kept): "
                "it is left to another worker"
            )

    def fence(self, reason: str) -> None:
        """Stop the turn here: no more renewals, the agent stopped (see the module doc)."""
        with self._lock:
            if self.lost.is_set():
                return
            self.lost.set()
        log.warning("fencing turn %s: %s", self.lease.turn_id, reason)
        if self.cancel is not None:
            self.cancel.fence(reason)

    def stop_agent(self, reason: str) -> None:
        """Stop the turn's agent as :meth:`fence` does, but keep renewing the lease: the
        worker hands the turn back itself once the step in flight has finished (a stop for
        a deploy). Without a cancellation to stop the agent through, it is :meth:`fence`."""
        if self.cancel is None:
            self.fence(reason)
        else:
            self.cancel.fence(reason)

    def _watch(self) -> None:
        while not self.lost.is_set():
            with self._lock:
                left = self._fence_at - time.monotonic()
            if left <= 0:
                if self._last_chance():
                    continue
                kept = self.lease_seconds - self.fence_margin
                self.fence(
                    f"its lease could not be renewed for {kept:.1f}s and may run out: "
                    "another worker may take the turn"
                )
                return
            if self._stop.wait(left):
                return

    def _last_chance(self) -> bool:
        """At the fence's deadline, one renewal of the watchdog's own: the renewing thread
        may only be starved (a loaded machine, a slow fsync), not cut off. Granted within
        a short wait (nobody took the turn: the epoch is unchanged), the deadline moves
        and the turn goes on; refused, failed or still pending, the turn is fenced."""
        granted: list[Lease] = []
        sent = time.monotonic()

        def renew() -> None:
            with contextlib.suppress(LeaseLost, WorldError):
                granted.append(self.world.renew(self.lease, self.lease_seconds))

        attempt = threading.Thread(target=renew, name=f"lease-last-{self.lease.turn_id}")
        attempt.daemon = True
        attempt.start()
        attempt.join(max(self.fence_margin, min(1.0, self.lease_seconds / 4.0)))
        if not granted:
            return False
        with self._lock:
            if self.lost.is_set():
                return False
            self.lease = granted[0]
            self._fence_at = sent + self.lease_seconds - self.fence_margin
        return True

    def _loop(self) -> None:
        renew_every = max(self.lease_seconds / 3.0, 0.05)
        look_every = max(self.cancel_poll, 0.05) if self.cancel is not None else renew_every
        now = time.monotonic()
        renew_at, look_at = now + renew_every, now + look_every
        while not self._stop.wait(max(min(renew_at, look_at) - time.monotonic(), 0.0)):
            if self.lost.is_set():
                return
            now = time.monotonic()
            if now >= look_at:
                look_at = now + look_every
                self._look_for_cancel()
            if now >= renew_at:
                renew_at = now + renew_every
                sent = time.monotonic()
                try:
                    lease = self.world.renew(self.lease, self.lease_seconds)
                except LeaseLost:
                    log.warning("lease on turn %s lost to another worker", self.lease.turn_id)
                    self.fence("its lease was lost to another worker")
                    return
                except WorldError as exc:
                    log.warning("renewing lease on turn %s failed: %s", self.lease.turn_id, exc)
                    renew_at = time.monotonic() + min(renew_every, RETRY_SECONDS)
                    continue
                with self._lock:
                    if self.lost.is_set():
                        return  # fenced while the renewal was under way: it stays fenced
                    self.lease = lease
                    self._fence_at = sent + self.lease_seconds - self.fence_margin

    def _look_for_cancel(self) -> None:
        cancel = self.cancel
        if cancel is None or cancel.reason is not None:
            return
        try:
            found = self.world.list_signals(self.lease.turn_id, CANCEL_SIGNAL)
        except WorldError as exc:  # looked for again at the next interval
            log.warning("looking for a cancel of turn %s failed: %s", self.lease.turn_id, exc)
            return
        if found:
            cancel.request(found[0].payload)
