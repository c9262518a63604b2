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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from durable_harness.core.errors import TurnCancelled

log = logging.getLogger(__name__)

#: Called with the cancel's reason, once, from the thread that noticed it.
Stopper = Callable[[str], None]


class Cancellation:
    """Set at most once (the first reason wins); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._stoppers: list[Stopper] = []

    @property
    def reason(self) -> str | None:
        """The cancel's reason, or None while the turn is not cancelled."""
        return self._reason

    def check(self) -> None:
        """Raise :class:`TurnCancelled` once the turn is cancelled."""
        reason = self._reason
        if reason is not None:
            raise TurnCancelled(reason)

    def request(self, reason: str) -> None:
        """Mark the turn cancelled and call every stopper (a second request does nothing)."""
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
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
