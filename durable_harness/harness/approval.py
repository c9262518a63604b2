"""Approvals: a human decides before a gated tool runs.

A tool that declares ``approval`` (``"required"``, or a rule over its arguments: see
:mod:`.tools`) is preceded, for each call that needs it, by an **approval step** of its
own (kind ``approval``, named after the tool, ``replay="safe"``, its input the tool's name
and arguments). The step is a durable wait: until a decision is recorded it raises
:class:`TurnSuspended` (the worker parks the turn: no lease, no process) on the signal
:func:`approval_signal` of its ``seq``, and the World wakes the turn when the decision
arrives. Its outcome is the decision (:class:`Decision`: approved or not, by whom, when,
why); only then does the tool's own step begin, so the tool's ``never`` intent is never
committed while a human thinks, and a crash anywhere before the decision costs nothing.

* approved: the tool's step runs as any other (``replay`` as declared);
* rejected (or no decision within :data:`APPROVAL_TIMEOUT_S`): the tool's step is finished
  with :func:`rejection_value`, the result the model sees; the tool never runs.

The decision is a signal under the harness's own prefix (``dh.``), which the doors that
take a caller's signal by name refuse: the turn's signal secret (what a CI system or a
host tool holds) cannot approve. Only ``durable-harness approve`` (World access: the
operator) and the API's approve route (a token the operator allowed) send it
(``runtime/approvals.py``). The first decision recorded for a step is the one: its
delivery id is the step, so a second is ignored by the World.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import TurnSuspended
from durable_harness.core.world import Queue
from durable_harness.harness.journal import Journal, Outcome
from durable_harness.harness.tools import (
    APPROVAL_REQUIRED,
    Tool,
    ToolInputError,
    contained,
)

__all__ = [
    "APPROVAL_KIND",
    "APPROVAL_TIMEOUT_S",
    "Decision",
    "approval_call",
    "approval_input",
    "approval_key",
    "approval_signal",
    "decision_payload",
    "needs_approval",
    "rejection_value",
]

#: The journal ``kind`` of an approval step.
APPROVAL_KIND = "approval"
#: How long a gated call waits for a decision; past it the call is rejected.
APPROVAL_TIMEOUT_S = 30 * 24 * 3600.0
_SIGNAL_PREFIX = "dh.approval."


def approval_signal(seq: int) -> str:
    """The signal that carries the decision for approval step ``seq``."""
    return f"{_SIGNAL_PREFIX}{seq}"


def approval_key(tool_key: str) -> str:
    """The approval step's key, from the key of the tool step it gates."""
    return f"{APPROVAL_KIND}:{tool_key}"


def approval_input(tool_name: str, raw: Any) -> dict[str, Any]:
    """The approval step's input: what the human approves (shown by ``show``)."""
    return {"tool": tool_name, "input": raw}


def needs_approval(tool: Tool, raw: Any) -> bool:
    """Whether this call of ``tool`` waits for a decision. A rule that raises counts as
    True (a rule's bug must not wave a refund through); input that does not match the
    schema needs none (the tool refuses it without running)."""
    if tool.approval is None:
        return False
    if tool.approval == APPROVAL_REQUIRED:
        return True
    rule = tool.approval
    assert callable(rule)
    try:
        args = tool.parse_input(raw if isinstance(raw, dict) else {})
    except ToolInputError:
        return False
    try:
        return bool(contained(f"approval rule of tool {tool.name!r}", rule, args))
    except Exception:
        return True


@dataclass(frozen=True)
class Decision:
    """A human's answer to an approval step."""

    approved: bool
    by: str
    at: float
    reason: str = ""

    def as_value(self) -> dict[str, Any]:
        return {"approved": self.approved, "by": self.by, "at": self.at, "reason": self.reason}

    @classmethod
    def of(cls, value: Any) -> Decision:
        data = value if isinstance(value, dict) else {}
        return cls(
            approved=data.get("approved") is True,
            by=str(data.get("by", "")),
            at=float(data.get("at") or 0.0),
            reason=str(data.get("reason", "")),
        )

    @classmethod
    def from_payload(cls, text: str) -> Decision:
        """The decision a signal's payload holds (a malformed one reads as a rejection)."""
        try:
            return cls.of(json.loads(text))
        except ValueError:
            return cls.of(None)


def decision_payload(decision: Decision) -> str:
    """The decision as a signal's payload."""
    return canonical_json(decision.as_value())


def rejection_value(tool_name: str, decision: Decision) -> dict[str, Any]:
    """The tool result the model sees for a rejected call (the tool did not run)."""
    why = f": {decision.reason}" if decision.reason else ""
    return {
        "content": f"Not run: the call of {tool_name} was rejected by {decision.by}{why}",
        "is_error": True,
    }


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def approval_call(world: Queue, journal: Journal, tool_name: str, seq: int) -> Outcome:
    """The approval step ``seq``'s call: the decision recorded for it, a rejection once
    :data:`APPROVAL_TIMEOUT_S` passed (measured from the step's intent, so every replay
    agrees), else :class:`TurnSuspended` until the decision's signal arrives."""
    name = approval_signal(seq)
    signals = world.list_signals(journal.turn_id, name)
    if signals:
        decision = Decision.from_payload(signals[0].payload)
    else:
        deadline = journal.recorded[seq].started_at + APPROVAL_TIMEOUT_S
        if journal.now() < deadline:
            waiting = f"approval of step {seq} ({tool_name}) until {_iso(deadline)}"
            raise TurnSuspended(deadline, waiting, name, seen=0)
        decision = Decision(
            False, "durable-harness", journal.now(), f"no decision within {APPROVAL_TIMEOUT_S:g} s"
        )
    meta = {
        "approval": "approved" if decision.approved else "rejected",
        "decided_by": decision.by,
        "decided_at": decision.at,
        "reason": decision.reason,
    }
    return Outcome(decision.as_value(), meta)
