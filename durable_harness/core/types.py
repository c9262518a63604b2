"""The plain types every layer shares: step and turn statuses, :class:`Step`,
:class:`Session`, :class:`Turn`, :class:`Lease`, a ``doctor`` :class:`Check`, and the
replay labels (:data:`Replay`: ``safe`` or ``never``, no default)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal, get_args


class StepStatus(enum.StrEnum):
    """Where a step stands in the journal (DESIGN.md's table)."""

    INTENT = "intent"  # intent recorded, no outcome: the call was interrupted or is running
    DONE = "done"  # outcome recorded: the call's result (a tool error is a result too)
    POSSIBLY_RAN = "possibly_ran"  # a `never` tool was interrupted: finished without re-running


class TurnStatus(enum.StrEnum):
    QUEUED = "queued"  # waiting for a worker (first delivery or redelivery)
    RUNNING = "running"  # a worker holds the lease
    WAITING = "waiting"  # parked by a wait step: no lease, no worker; wakes on timer or signal
    DONE = "done"
    FAILED = "failed"  # dead-lettered or failed for good; `error` says why
    CANCELLED = "cancelled"  # stopped on request (CANCEL_SIGNAL); finished steps are kept


#: A turn in one of these states will still be worked on.
UNFINISHED = frozenset({TurnStatus.QUEUED, TurnStatus.RUNNING, TurnStatus.WAITING})

#: A turn in one of these states is over: no worker will take it again.
FINISHED = frozenset({TurnStatus.DONE, TurnStatus.FAILED, TurnStatus.CANCELLED})

#: How the error of a dead-lettered turn begins (status ``failed``, every backend): what
#: tells a turn the queue gave up on from one that failed for good.
DEAD_LETTER_PREFIX = "dead-lettered"

#: The signal that asks for a turn to be cancelled (``POST /v1/turns/{id}/cancel``,
#: ``durable-harness cancel``). It wakes a waiting turn like any signal; the worker that
#: holds or next claims the turn stops its agent and ends it ``cancelled``.
CANCEL_SIGNAL = "dh.cancel"


@dataclass(frozen=True)
class Step:
    """One journal row.

    ``input_hash`` is the sha256 of the step's canonical input and is what replay compares
    (with ``kind``, ``name`` and ``key``) to detect divergence. ``input`` keeps a small,
    readable copy for ``show`` (``None`` when it is large or derivable, as for model calls,
    whose request is the conversation so far). ``output`` is the outcome as JSON text, or
    ``None`` with ``output_blob`` set when it was large. ``meta`` holds what ``show`` prints
    (tokens, workspace snapshot hash, the attempt that recorded it).
    """

    turn_id: str
    seq: int
    key: str
    kind: str
    name: str
    input_hash: str
    input: str | None = None
    status: StepStatus = StepStatus.INTENT
    output: str | None = None
    output_blob: str | None = None
    attempts: int = 1
    epoch: int = 0
    started_at: float = 0.0
    finished_at: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Session:
    session_id: str
    created_at: float
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Turn:
    """A user prompt within a session, and the work to answer it.

    ``index`` orders the turns of a session (0, 1, ...). ``config`` holds what a worker
    needs to run it again anywhere (agent, model, workspace, tools spec).
    """

    turn_id: str
    session_id: str
    index: int
    prompt: str
    status: TurnStatus
    config: dict[str, Any]
    created_at: float
    attempts: int = 0
    epoch: int = 0
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    result: str | None = None
    error: str | None = None
    finished_at: float | None = None
    waiting_for: str | None = None  # while ``waiting``: what it waits for, for ``ls``


@dataclass(frozen=True)
class TurnCounts:
    """How many turns are in each status (:meth:`~durable_harness.core.world.Catalog.count_turns`);
    ``dead_lettered`` counts the ``failed`` ones whose error says the queue dead-lettered
    them (:data:`DEAD_LETTER_PREFIX`)."""

    queued: int = 0
    running: int = 0
    waiting: int = 0
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    dead_lettered: int = 0


@dataclass(frozen=True)
class Lease:
    """A worker's claim on a turn. ``epoch`` is the fencing token every write carries."""

    turn_id: str
    session_id: str
    owner: str
    epoch: int
    attempt: int
    expires_at: float
    receipt: str = ""  # backend-specific handle (an SQS receipt handle, for example)


@dataclass(frozen=True)
class Check:
    """One line of ``durable-harness doctor``."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Event:
    """One entry of a turn's event log (:class:`~durable_harness.core.world.EventLog`).

    ``seq`` is 1, 2, 3, ... within the turn, with no gap: what a client resumes from
    (the SSE ``id``). ``key`` is unique within the turn: appending a key twice returns the
    first event, so a writer that does not know whether its append landed (it crashed,
    or reconciles the log from the journal) appends again. ``epoch`` is the lease epoch
    the writer held, or None for a writer without a lease (``serve``, a signal).
    """

    turn_id: str
    seq: int
    key: str
    kind: str
    data: dict[str, Any]
    at: float
    epoch: int | None = None


@dataclass(frozen=True)
class ApiToken:
    """An API token of ``serve`` (:class:`~durable_harness.core.world.Tenancy`).

    The secret is shown once, when it is made; the World keeps its sha256 (``digest``)
    under the public ``token_id``. ``operator`` tokens administer every tenant.
    """

    token_id: str
    tenant: str
    digest: str
    created_at: float
    operator: bool = False
    label: str = ""
    revoked_at: float | None = None


Replay = Literal["safe", "never"]


REPLAY_RULES: tuple[str, ...] = get_args(Replay)


def is_dead_lettered(turn: Turn) -> bool:
    """A turn the queue gave up on (``failed``, its error starting :data:`DEAD_LETTER_PREFIX`)."""
    return turn.status is TurnStatus.FAILED and (turn.error or "").startswith(DEAD_LETTER_PREFIX)
