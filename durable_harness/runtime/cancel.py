"""Cancelling a turn: ``durable-harness cancel``, ``POST /v1/turns/{id}/cancel``.

A cancel is a durable request, not a kill: :func:`request_cancel` records the turn's
``CANCEL_SIGNAL`` (its payload the reason) in the World and returns. Whoever holds or next
takes the turn acts on it, so no process has to be reachable and a worker that dies in
between changes nothing:

* a turn that is queued, or parked at a wait (the signal wakes it), is ended
  ``cancelled`` by the worker that claims it, before anything of it runs;
* a running turn's worker notices within ``DURABLE_HARNESS_CANCEL_POLL_SECONDS``
  (:mod:`durable_harness.harness.cancel`): its journal begins no new step, its agent is
  stopped (a CLI agent's processes killed), and the turn ends ``cancelled``.

What finished stays: every step with an outcome is kept in the journal, and the CLI's
session record saved before each tool intent (and once more when the CLI is stopped), so
the session's next turn continues from it. A step that was running when the agent was
stopped finishes, or stays an intent (a ``never`` tool is never run again: the turn is
over).
"""

from __future__ import annotations

from durable_harness.core.canonical import without_surrogates
from durable_harness.core.errors import ConfigError
from durable_harness.core.types import CANCEL_SIGNAL, FINISHED, TurnStatus
from durable_harness.core.world import World

__all__ = ["DEFAULT_REASON", "MAX_REASON_CHARS", "refuse_reserved_signal", "request_cancel"]

#: The reason a cancel records when its caller gives none.
DEFAULT_REASON = "cancelled on request"
#: A longer reason is cut: it becomes the turn's ``error``, printed by ``ls`` and ``show``.
MAX_REASON_CHARS = 1000
#: Signal names the harness keeps for itself (``CANCEL_SIGNAL`` is one): the doors that
#: send a caller's signal by name (``signal``, ``signal-server``) refuse them, so holding
#: a turn's signal secret (a CI system's) is not the right to cancel it.
RESERVED_SIGNAL_PREFIX = CANCEL_SIGNAL.split(".", 1)[0] + "."


def refuse_reserved_signal(name: str) -> None:
    """ConfigError for a signal name the harness keeps for itself."""
    if name.startswith(RESERVED_SIGNAL_PREFIX):
        raise ConfigError(
            f"signal names starting with {RESERVED_SIGNAL_PREFIX!r} are the harness's own "
            f"({name!r}); to cancel a turn use `durable-harness cancel TURN`"
        )


def request_cancel(world: World, turn_id: str, reason: str = DEFAULT_REASON) -> bool:
    """Ask for turn ``turn_id`` to be cancelled; True if the request stands (the turn was
    not finished: it will end ``cancelled``), False if the turn had already ended (done,
    failed or cancelled), when nothing is recorded. A second request for an unfinished
    turn is True again (the first reason is the one kept). :class:`NotFound` for an
    unknown turn."""
    if world.get_turn(turn_id).status in FINISHED:
        return False
    reason = without_surrogates(reason.strip())[:MAX_REASON_CHARS] or DEFAULT_REASON
    world.send_signal(turn_id, CANCEL_SIGNAL, reason)
    # The turn may have ended between the look and the signal: then nothing was cancelled
    # (the signal stays, unread, on a finished turn).
    after = world.get_turn(turn_id).status
    return after not in FINISHED or after is TurnStatus.CANCELLED
