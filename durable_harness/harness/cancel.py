"""A running turn's cancel request, as the worker's process knows it.

The request itself is durable: a ``CANCEL_SIGNAL`` in the World
(``runtime/cancel.py request_cancel``). While a worker runs the turn, its
:class:`~.lease.LeaseKeeper` looks for that signal every ``cancel_poll_seconds`` (not per
step: a step costs no World read for it) and, when it finds one, calls
:meth:`Cancellation.request`. From then on:

* the journal refuses to begin a step (:meth:`Cancellation.check` in ``Journal._begin``
  raises :class:`~durable_harness.core.errors.TurnCancelled`): nothing new starts; a step
  already running finishes, or stays an intent under its replay rule;
* the stoppers the adapter registered (:meth:`Cancellation.add_stopper`) are called once:
  a CLI agent's stopper makes its launch end, which kills the CLI and what it started;
  the built-in agent needs none (it stops at its next step).

The worker then ends the turn ``cancelled``.

The same stop serves a worker that **fences itself** (:meth:`Cancellation.fence`): its
lease keeper could not renew in time, or the World says this process no longer holds its
turns (PostgreSQL: the connection its claims are tied to dropped). Then the journal refuses
the next step with :class:`~durable_harness.core.errors.LeaseLost` instead, the stoppers
run (a CLI agent's launch ends with ``LeaseLost``, which leaves a Docker-hosted CLI job
running for the turn's next owner), and the worker leaves the turn without writing to it:
another worker is about to take it over.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from durable_harness.core.errors import LeaseLost, TurnCancelled

log = logging.getLogger(__name__)

#: Called with the cancel's reason, once, from the thread that noticed it.
Stopper = Callable[[str], None]


class Cancellation:
    """Set at most once (the first reason wins); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._fenced = False
        self._stoppers: list[Stopper] = []

    @property
    def reason(self) -> str | None:
        """The cancel's reason, or None while the turn is not cancelled."""
        return self._reason

    @property
    def fenced(self) -> bool:
        """Whether the stop was this worker fencing itself (:meth:`fence`), not a cancel."""
        return self._fenced

    def error(self) -> TurnCancelled | LeaseLost:
        """What a stopped turn raises: :class:`LeaseLost` when fenced, else
        :class:`TurnCancelled` (call it once the turn is stopped)."""
        reason = self._reason or "stopped"
        return LeaseLost(reason) if self._fenced else TurnCancelled(reason)

    def check(self) -> None:
        """Raise :class:`TurnCancelled` once the turn is cancelled (:class:`LeaseLost`
        once this worker fenced itself)."""
        if self._reason is not None:
            raise self.error()

    def request(self, reason: str) -> None:
        """Mark the turn cancelled and call every stopper (a second request does nothing)."""
        self._stop(reason, fenced=False)

    def fence(self, reason: str) -> None:
        """Stop the turn's agent because this worker may no longer hold its lease: the
        journal then raises :class:`LeaseLost`. Nothing happens if already stopped."""
        self._stop(reason, fenced=True)

    def _stop(self, reason: str, fenced: bool) -> None:
        with self._lock:
            if self._reason is not None:
                return
            self._reason, self._fenced = reason, fenced
            stoppers, self._stoppers = self._stoppers, []
        for stop in stoppers:
            _call(stop, reason)

    def add_stopper(self, stop: Stopper) -> Callable[[], None]:
        """Call ``stop(reason)`` when the turn is cancelled (at once if it is already);
        returns the function that unregisters it (when what it stops has ended)."""
        with self._lock:
            reason = self._reason
            if reason is None:
                self._stoppers.append(stop)
        if reason is not None:
            _call(stop, reason)

        def remove() -> None:
            with self._lock:
                if stop in self._stoppers:
                    self._stoppers.remove(stop)

        return remove


def _call(stop: Stopper, reason: str) -> None:
    # A stopper that fails must not keep the others from running, nor kill the thread
    # that renews the lease: the journal's refusal still ends the turn.
    try:
        stop(reason)
    except Exception:
        log.exception("stopping a cancelled turn's agent failed")
