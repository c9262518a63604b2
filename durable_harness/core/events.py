"""The vocabulary of a turn's event log (:class:`~durable_harness.core.world.EventLog`).

The kinds below, their keys (unique within a turn: a writer that appends a key again
gets the first event back) and their ``data``. The stored spelling is a format: a log
written today is streamed by tomorrow's ``serve``, so kinds and keys are built here only.

=====================  ======================================  ==============================
kind                   key                                     data
=====================  ======================================  ==============================
``turn.created``       ``turn:created``                        session_id, index, agent
``attempt.started``    ``attempt:<epoch>:started``             epoch, attempt, worker
``attempt.lost``       ``attempt:<epoch>:lost``                epoch (the dead attempt's)
``step.started``       ``step:<seq>:<attempt>:started``        seq, attempt, kind, name, key
``text.delta``         ``step:<seq>:<attempt>:delta:<n>``      seq, attempt, n, text
``step.abandoned``     ``step:<seq>:<attempt>:abandoned``      seq, attempt
``step.finished``      ``step:<seq>:finished``                 seq, attempt, kind, name,
                                                               status, output (short), meta
``step.replayed``      ``step:<seq>:replayed:<epoch>``         seq, epoch, kind, name, status,
                                                               after (lost, released, woken)
``signal.received``    ``signal:<name>:<delivery>``            name
``turn.waiting``       ``attempt:<epoch>:waiting``             waiting_for, wake_at
``turn.released``      ``attempt:<epoch>:released``            error, delay
``turn.ended``         ``turn:ended``                          status, result, error
                                                               (64 Ki characters each at
                                                               most; truncated: true if cut)
=====================  ======================================  ==============================

``<attempt>`` is the step's attempt (``Step.attempts``: 1, then one more per re-run of
an interrupted intent); ``<n>`` counts a step attempt's text pieces from 0. The text of a
model step belongs to one attempt: ``step.abandoned`` says that attempt will never
finish (its worker died), and its text is not part of the reply; the next attempt's
``step.started`` and ``text.delta`` follow. ``step.replayed`` says that the delivery
holding lease ``<epoch>`` read finished step ``<seq>`` back from the journal instead of
running it (``status`` ``done`` or ``possibly_ran``): once per step and delivery, which is
what a turn's savings count (runtime/costs.py). ``turn.ended`` is always the last event.
"""

from __future__ import annotations

TURN_CREATED = "turn.created"
ATTEMPT_STARTED = "attempt.started"
ATTEMPT_LOST = "attempt.lost"
STEP_STARTED = "step.started"
TEXT_DELTA = "text.delta"
STEP_ABANDONED = "step.abandoned"
STEP_FINISHED = "step.finished"
STEP_REPLAYED = "step.replayed"
SIGNAL_RECEIVED = "signal.received"
TURN_WAITING = "turn.waiting"
TURN_RELEASED = "turn.released"
TURN_ENDED = "turn.ended"

KINDS = (
    TURN_CREATED,
    ATTEMPT_STARTED,
    ATTEMPT_LOST,
    STEP_STARTED,
    TEXT_DELTA,
    STEP_ABANDONED,
    STEP_FINISHED,
    STEP_REPLAYED,
    SIGNAL_RECEIVED,
    TURN_WAITING,
    TURN_RELEASED,
    TURN_ENDED,
)


def turn_created_key() -> str:
    return "turn:created"


def attempt_key(epoch: int, what: str) -> str:
    """``what``: ``started``, ``lost``, ``waiting`` or ``released``."""
    return f"attempt:{epoch}:{what}"


def step_attempt_key(seq: int, attempt: int, what: str) -> str:
    """``what``: ``started`` or ``abandoned``."""
    return f"step:{seq}:{attempt}:{what}"


def delta_key(seq: int, attempt: int, n: int) -> str:
    return f"step:{seq}:{attempt}:delta:{n}"


def step_finished_key(seq: int) -> str:
    return f"step:{seq}:finished"


def step_replayed_key(seq: int, epoch: int) -> str:
    return f"step:{seq}:replayed:{epoch}"


def signal_key(name: str, delivery: str) -> str:
    return f"signal:{name}:{delivery}"


def turn_ended_key() -> str:
    return "turn:ended"
