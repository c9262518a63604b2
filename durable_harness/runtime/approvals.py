"""Answering an approval: ``durable-harness approve``, ``POST /v1/turns/{id}/steps/{seq}/approval``.

The decision is a durable signal (:mod:`durable_harness.harness.approval`): recording it
wakes the parked turn, and whichever worker takes the turn next reads it. The doors:

* ``durable-harness approve TURN SEQ [--reject] [--reason …]``: whoever has World access
  (the operator); recorded as ``by`` ``operator:<login>`` (or ``--by``);
* the API route: an operator token, or a tenant token of the turn's tenant that the
  operator named in ``DURABLE_HARNESS_API_APPROVER_TOKENS`` (``server/steps.py``);
  recorded as ``by`` ``token:<id> (<tenant>)``.

Nothing the model, the agent or the sandbox can reach sends it: the signal's name is under
``dh.``, which ``signal``, ``signal-server`` and the API's signal route refuse, so the
turn's signal secret does not approve.

Only a step that is waiting for a decision can get one: SEQ must be an approval step of
the turn with no outcome yet (a decision cannot be placed in advance for a call the model
has not made). The first decision is the one: its delivery id is the step, so a second
(from another approver, or a retry) is ignored by the World and reported as such.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass

from durable_harness.core.canonical import without_surrogates
from durable_harness.core.errors import ConfigError, NotFound
from durable_harness.core.types import FINISHED, Step, StepStatus
from durable_harness.core.world import World
from durable_harness.harness.approval import (
    APPROVAL_KIND,
    Decision,
    approval_signal,
    decision_payload,
)
from durable_harness.harness.events import signal_received

__all__ = ["MAX_REASON_CHARS", "DecisionRefused", "Recorded", "operator_name", "record_decision"]

#: A longer reason is cut: the model reads it, ``show`` prints it.
MAX_REASON_CHARS = 1000


class DecisionRefused(ConfigError):
    """The step is not waiting for a decision (not an approval step, or already decided,
    or the turn is over)."""


@dataclass(frozen=True)
class Recorded:
    """What :func:`record_decision` did."""

    new: bool  # False: a decision for this step was recorded before; this one is ignored
    decision: Decision  # the decision that stands


def operator_name() -> str:
    """``operator:<login>`` for a decision made with World access."""
    try:
        login = getpass.getuser()
    except (KeyError, OSError):  # no login name for this uid (a container)
        login = "unknown"
    return f"operator:{login}"


def approval_step(world: World, turn_id: str, seq: int) -> Step:
    """Step ``seq`` of the turn if it is an approval step; :class:`NotFound` otherwise
    (also for an unknown turn)."""
    world.get_turn(turn_id)
    for step in world.load_steps(turn_id):
        if step.seq == seq and step.kind == APPROVAL_KIND:
            return step
    raise NotFound(
        f"turn {turn_id} has no approval step {seq}: `durable-harness show {turn_id}` lists "
        "its steps; a parked turn's `waiting_for` names the step that waits"
    )


def record_decision(
    world: World, turn_id: str, seq: int, approved: bool, by: str, reason: str = ""
) -> Recorded:
    """Record the decision on approval step ``seq`` of ``turn_id`` (waking the turn).
    :class:`NotFound` when there is no such step; :class:`DecisionRefused` when it is not
    waiting (decided, or the turn finished)."""
    step = approval_step(world, turn_id, seq)
    name = approval_signal(seq)
    earlier = world.list_signals(turn_id, name)
    if earlier:
        return Recorded(False, Decision.from_payload(earlier[0].payload))
    if step.status is not StepStatus.INTENT:
        raise DecisionRefused(f"approval step {seq} of turn {turn_id} is decided already")
    if world.get_turn(turn_id).status in FINISHED:
        raise DecisionRefused(f"turn {turn_id} has finished; its approval step {seq} is moot")
    reason = without_surrogates(reason.strip())[:MAX_REASON_CHARS]
    decision = Decision(approved, by, world.now(), reason)
    payload = decision_payload(decision)
    # One delivery id per step: of two racing decisions the World keeps the first.
    delivery = f"decision:{seq}"
    fresh = world.send_signal(turn_id, name, payload, delivery)
    signal_received(world, turn_id, name, payload, delivery)
    if not fresh:
        return Recorded(False, Decision.from_payload(world.list_signals(turn_id, name)[0].payload))
    return Recorded(True, decision)
