"""Lease renewal: keeps a claimed turn's lease alive while the turn runs.

A daemon thread renews every third of the lease. If a renewal is refused (another worker
took the turn: the epoch moved on) it stops and marks the lease lost; the turn's own
writes are fenced by the World anyway, so a lost lease can never corrupt the journal.
A renewal that fails for a transient reason (database busy, network) is retried on the
next tick: the lease only runs out if renewals fail for a whole lease period.

The same thread looks for the turn's cancel request (``CANCEL_SIGNAL``) every
``cancel_poll`` seconds, when given a :class:`~.cancel.Cancellation` to set: one World
read per interval while the turn runs, none per step.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Self

from durable_harness.core.closing import Closing
from durable_harness.core.errors import LeaseLost, WorldError
from durable_harness.core.types import CANCEL_SIGNAL, Lease
from durable_harness.core.world import Queue
from durable_harness.harness.cancel import Cancellation

log = logging.getLogger(__name__)


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
        self._thread = threading.Thread(
            target=self._loop, name=f"lease-{lease.turn_id}", daemon=True
        )

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop renewing (``with`` calls it on the way out)."""
        self._stop.set()
        self._thread.join(timeout=self.lease_seconds)

    def check(self) -> None:
        """Raise :class:`LeaseLost` if a renewal was refused."""
        if self.lost.is_set():
            raise LeaseLost(f"lease on turn {self.lease.turn_id} was lost to another worker")

    def _loop(self) -> None:
        renew_every = max(self.lease_seconds / 3.0, 0.05)
        look_every = max(self.cancel_poll, 0.05) if self.cancel is not None else renew_every
        now = time.monotonic()
        renew_at, look_at = now + renew_every, now + look_every
        while not self._stop.wait(max(min(renew_at, look_at) - time.monotonic(), 0.0)):
            now = time.monotonic()
            if now >= look_at:
                look_at = now + look_every
                self._look_for_cancel()
            if now >= renew_at:
                renew_at = now + renew_every
                try:
                    self.lease = self.world.renew(self.lease, self.lease_seconds)
                except LeaseLost:
                    log.warning("lease on turn %s lost to another worker", self.lease.turn_id)
                    self.lost.set()
                    return
                except WorldError as exc:
                    log.warning("renewing lease on turn %s failed: %s", self.lease.turn_id, exc)

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
