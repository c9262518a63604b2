"""The World seam: journal, queue with leases and waits, sessions and turns, blobs.

A World is everything durable about a turn. It is the union of small facets, one abstract
base class each, so a caller that needs one facet can say so (a workspace snapshot needs
only a :class:`BlobStore`, a lease renewal only a :class:`Queue`):

* :class:`BlobStore`: ``put_blob``, ``get_blob``;
* :class:`Catalog`: sessions, turns, each session's named records;
* :class:`Queue`: enqueue, claim, renew, release, complete, fail, ``wait_for_work``, and
  the durable waits (``suspend``, ``send_signal``, ``get_signal``);
* :class:`JournalStore`: ``load_steps``, ``insert_intent``, ``restart_intent``,
  ``finish_step``;
* :class:`EventLog`: ``append_event``, ``read_events``, ``wait_for_events``: each turn's
  gap-free event log, what ``serve`` streams;
* :class:`Tenancy`: API tokens (hashed), who owns a session or turn, rate counters;
* :class:`Doctor`: ``doctor``, the checks ``durable-harness doctor`` prints;
* :class:`World`: all of them, plus ``close()`` and context-manager support.

The facets are ABCs rather than ``typing.Protocol`` s on purpose: a backend that forgets a
method fails when it is constructed (``TypeError: Can't instantiate abstract class``), not
when a turn first reaches the missing call (a ``typing.Protocol`` is checked only by mypy,
and ``isinstance`` against one checks names, not signatures); and the facets carry shared
defaults (``wait_for_work``, ``has_unfinished_turns``, ``doctor``) by plain inheritance.

The core (``harness/``) talks only to these interfaces; each backend is one module
(``worlds/local/``, ``postgres/``, ``s3sqs/``) and ``tests/worlds/test_contract.py``
runs the same contract suite against all of them.

Contracts every backend keeps:

* **Journal** (invariants 1-3). ``insert_intent`` is durable when it returns (the caller
  runs the call only afterwards). ``(turn_id, seq)`` and ``(turn_id, key)`` are each
  unique: a second insert raises :class:`StepConflict`. Every journal write carries the
  writer's lease ``epoch`` and is rejected with :class:`LeaseLost` unless it equals the
  turn's current epoch, checked atomically with the write (fencing).
* **Queue** (invariant 8). One message per turn. ``claim`` hands out a lease and bumps the
  turn's epoch; a lease that is not renewed runs out and the turn is delivered again.
  Where ``detects_dead_holders``, a turn whose holder process is provably dead is
  deliverable before that (the takeover bumps the epoch like any claim), and a live holder,
  even a stopped one, keeps its lease.
  Each delivery counts as an attempt; a claim that would exceed ``max_attempts`` moves
  the turn to the dead letter state (status ``failed`` with the reason) instead.
  Every write made with a lease (renew, release, complete, fail, suspend) is fenced too.
* **Waits.** A suspended turn holds no worker; it is delivered again at its wake time or
  when a signal arrives. Signals of a name queue up in arrival order, a delivery seen
  before (same delivery id) is ignored, and each is taken by one wait step at most.
* **Events** (``EventLog``). A turn's events are numbered 1, 2, 3, ... with no gap and
  in the order they became visible: a reader that has seen event ``n`` and reads again
  gets ``n + 1`` next, never a smaller seq later. A key is appended at most once per turn
  (the second append returns the first event). A fenced append (``epoch`` given) is
  rejected with :class:`LeaseLost` unless the turn is ``running`` at that epoch.
* **Blobs** are content-addressed by sha256 hex; ``put_blob`` is idempotent.
* **Errors.** A backend maps its driver's errors (sqlite3, psycopg, botocore) to
  :class:`~durable_harness.core.errors.WorldError` (or :class:`ConfigError` for a setting
  the user must fix) at its boundary, with a message that says what to do.

All methods are synchronous and thread-safe (a lease-renewal thread shares the World
with the turn's thread). Timestamps are Unix seconds (float).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from durable_harness.core.canonical import without_surrogates
from durable_harness.core.closing import Closing
from durable_harness.core.errors import WorldError
from durable_harness.core.types import (
    UNFINISHED,
    ApiToken,
    Check,
    Event,
    Lease,
    Session,
    Step,
    StepStatus,
    Turn,
    TurnCounts,
    TurnStatus,
    is_dead_lettered,
)


class BlobStore(abc.ABC):
    """Content-addressed payloads (invariant 7)."""

    @abc.abstractmethod
    def put_blob(self, data: bytes) -> str:
        """Store ``data``; return its sha256 hex digest. Idempotent."""

    @abc.abstractmethod
    def get_blob(self, digest: str) -> bytes:
        """Return the bytes stored under ``digest``; :class:`NotFound` if absent."""


class Catalog(abc.ABC):
    """Sessions, their turns and status, and each session's named records."""

    @abc.abstractmethod
    def create_session(self, session_id: str, meta: dict[str, Any] | None = None) -> Session:
        """Create a session; :class:`StepConflict` is not used here: an existing id is returned."""

    @abc.abstractmethod
    def get_session(self, session_id: str) -> Session: ...

    @abc.abstractmethod
    def list_sessions(self, limit: int = 100) -> list[Session]:
        """Newest first."""

    @abc.abstractmethod
    def create_turn(
        self, session_id: str, turn_id: str, prompt: str, config: dict[str, Any]
    ) -> Turn:
        """Append a turn (status ``queued``) to the session and enqueue it, atomically
        where the backend allows. The turn's ``index`` is the session's next one."""

    @abc.abstractmethod
    def get_turn(self, turn_id: str) -> Turn: ...

    @abc.abstractmethod
    def list_turns(self, session_id: str | None = None, limit: int = 100) -> list[Turn]:
        """A session's turns in index order, or (no session) all turns newest first."""

    def has_unfinished_turns(self) -> bool:
        """Whether any turn is still to be worked on (queued, running or waiting): what
        ``worker --until-idle`` asks when nothing is claimable. This default reads every
        turn; the backends answer from an index, or stop at the first one found."""
        return any(t.status in UNFINISHED for t in self.list_turns(limit=2**31))

    def count_turns(self) -> TurnCounts:
        """How many turns are in each status, dead-lettered ones apart: what the metrics
        exporter (``runtime/telemetry``) reads once per export interval. This default reads
        every turn; a backend with an index answers with one counting query."""
        return counts_of(self.list_turns(limit=2**31))

    @abc.abstractmethod
    def put_session_record(self, session_id: str, name: str, digest: str) -> None:
        """Point the session's named record (e.g. a CLI transcript) at a blob."""

    @abc.abstractmethod
    def get_session_record(self, session_id: str, name: str) -> str | None:
        """The blob digest of the session's named record, or ``None``."""


class Queue(abc.ABC):
    """One message per turn, claimed with a lease; durable waits park a turn without a
    worker (invariant 8)."""

    max_attempts: int = 5
    #: Whether a running turn whose holder is provably dead is claimable before its lease
    #: ends (the local World: the holder's pid on this host; PostgreSQL: the holder's
    #: connection). False: a dead holder's lease runs out (S3+SQS).
    detects_dead_holders: bool = False

    @abc.abstractmethod
    def enqueue(self, turn_id: str, delay: float = 0.0) -> None:
        """Make the turn deliverable (after ``delay`` seconds). Deduplicated by turn:
        a turn has at most one message."""

    @abc.abstractmethod
    def claim(self, owner: str, lease_seconds: float) -> Lease | None:
        """Take the next deliverable turn: its message is visible (queued, or waiting and
        woken), or its lease ran out.
        Bumps the turn's epoch and attempt count and sets status ``running``. A turn
        whose attempts would exceed ``max_attempts`` is dead-lettered (status
        ``failed``, ``error`` saying why) and skipped. ``None`` when nothing is runnable."""

    @abc.abstractmethod
    def claim_turn(
        self, turn_id: str, owner: str, lease_seconds: float, force: bool = False
    ) -> Lease | None:
        """Take one given turn: only if it is deliverable, or at once with ``force``
        (which fences out the current holder by bumping the epoch). ``None`` if it is
        held by a live lease (and not forced) or already finished."""

    @abc.abstractmethod
    def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        """Extend the lease; :class:`LeaseLost` if the epoch moved on."""

    @abc.abstractmethod
    def release(self, lease: Lease, delay: float = 0.0, error: str | None = None) -> None:
        """Give the turn back to the queue (deliverable after ``delay``), recording
        ``error`` as the turn's last error. Fenced."""

    def complete_turn(self, lease: Lease, result: str) -> None:
        """Mark the turn ``done`` with its final reply and delete its message. Fenced.

        The reply is text for a person and a text column, where a lone surrogate cannot
        go: it is stored with U+FFFD in its place (the steps keep the exact bytes)."""
        self.end_turn(lease, TurnStatus.DONE, result=without_surrogates(result), error=None)

    def fail_turn(self, lease: Lease, error: str) -> None:
        """Mark the turn ``failed`` for good (no more deliveries). Fenced."""
        self.end_turn(lease, TurnStatus.FAILED, result=None, error=without_surrogates(error))

    def cancel_turn(self, lease: Lease, reason: str) -> None:
        """Mark the turn ``cancelled`` (no more deliveries; its steps stay). Fenced."""
        self.end_turn(lease, TurnStatus.CANCELLED, result=None, error=without_surrogates(reason))

    @abc.abstractmethod
    def end_turn(
        self, lease: Lease, status: TurnStatus, result: str | None, error: str | None
    ) -> None:
        """The backend's part of :meth:`complete_turn`, :meth:`fail_turn` and
        :meth:`cancel_turn`: the turn ends in ``status`` (``done``, ``failed`` or
        ``cancelled``), keeping its earlier result or error
        where ``result`` or ``error`` is None, and leaves the queue. Fenced."""

    def wait_for_work(self, timeout: float) -> None:
        """Block until a turn may have become claimable, or ``timeout`` seconds passed.

        What an idle worker calls between claims. A spurious or late return only costs a
        claim that finds nothing. The default sleeps; a backend that can hear about new
        work (PostgreSQL's LISTEN/NOTIFY) returns as soon as it does.
        """
        time.sleep(timeout)

    def on_holder_lost(self, lease: Lease, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(why)`` (from any thread, at most once) when this World learns
        that ``lease``, which it handed out to this process, may be taken over before it
        runs out (at once if that is known already); returns the function that
        unregisters it. The lease keeper then stops the turn's agent (the worker fences
        itself, ``harness/lease.py``). This default never calls it: a lease here is lost
        only by running out. PostgreSQL calls it when the connection this process's claims
        are tied to drops."""
        return lambda: None

    def now(self) -> float:
        """The World's clock, Unix seconds: what wake-ups and wait deadlines are measured
        by, so a worker whose own clock is off by minutes still wakes a timer on time.
        This default is the machine's clock; a World with a clock of its own (PostgreSQL's
        ``now()``) answers from that."""
        return time.time()

    # -- durable waits (contract: the wait tests of tests/worlds/test_contract.py) -----
    @abc.abstractmethod
    def suspend(
        self,
        lease: Lease,
        wake_at: float,
        waiting_for: str,
        signal: str | None = None,
        seen: int = 0,
    ) -> None:
        """Park the turn (fenced): status ``waiting``, lease and worker released, the turn
        deliverable again at ``wake_at`` or as soon as a signal arrives (``send_signal``
        or ``enqueue``). If the turn holds more than ``seen`` signals named ``signal`` (one
        raced the suspend: the wait looked at ``seen`` of them), the turn is deliverable at
        once. A suspend is deliberate, so the deliveries before it do not count toward
        ``max_attempts``."""

    @abc.abstractmethod
    def send_signal(
        self, turn_id: str, name: str, payload: str, delivery_id: str | None = None
    ) -> bool:
        """Append signal ``name`` to the turn's signals of that name (in arrival order) and
        wake the turn if it waits. A delivery already recorded (the same ``delivery_id``
        for this turn and name; without one, the same payload) is ignored and returns
        False. A signal sent before the turn waits for it is kept until a wait takes it.
        :class:`NotFound` for an unknown turn."""

    @abc.abstractmethod
    def list_signals(self, turn_id: str, name: str) -> list[Signal]:
        """The turn's signals named ``name``, in arrival order (``index`` 0, 1, ...)."""

    @abc.abstractmethod
    def claim_signal(self, turn_id: str, name: str, index: int, seq: int) -> bool:
        """Let the wait step ``seq`` take signal ``index``, once: True if it is now that
        step's (it was free, or that step had taken it already), False if another step
        took it. What makes a wait's signal the same on every replay and resume."""

    def get_signal(self, turn_id: str, name: str) -> str | None:
        """The payload of the first signal ``name`` for the turn, or None if none arrived."""
        found = self.list_signals(turn_id, name)
        return found[0].payload if found else None

    @abc.abstractmethod
    def watch(self, scope: str, ref: str, turn_id: str, name: str) -> None:
        """Route webhooks for repository ``scope`` (e.g. ``github:owner/repo``) about
        ``ref`` (``sha:<commit>`` or ``branch:<name>``) to the turn's signal ``name``. A
        turn watches one ref per scope and name: a new push's watch replaces the last one,
        so a late CI result for an earlier commit reaches no wait. :class:`NotFound` for an
        unknown turn."""

    @abc.abstractmethod
    def watchers(self, scope: str, ref: str) -> list[tuple[str, str]]:
        """The ``(turn_id, signal name)`` pairs watching ``ref`` of ``scope``, sorted."""


def counts_of(turns: Sequence[Turn]) -> TurnCounts:
    """:class:`TurnCounts` of ``turns`` (the default :meth:`Catalog.count_turns`)."""
    by_status = {status: 0 for status in TurnStatus}
    dead = 0
    for turn in turns:
        by_status[turn.status] += 1
        if is_dead_lettered(turn):
            dead += 1
    return TurnCounts(**{str(s): n for s, n in by_status.items()}, dead_lettered=dead)


@dataclasses.dataclass(frozen=True)
class Signal:
    """One delivery of a named signal to a turn (:meth:`Queue.list_signals`)."""

    index: int  # its place among the turn's signals of that name, from 0
    payload: str
    delivery_id: str
    claimed_by: int | None = None  # the seq of the wait step that took it, or SUPERSEDED


#: ``claimed_by`` of a signal no wait may take any more: a CI result for a commit the
#: turn no longer waits on (``runtime/webhooks.py watch_ref``). No step has this seq.
SUPERSEDED = -1


def delivery_key(payload: str, delivery_id: str | None) -> str:
    """The id a delivery is deduplicated by: the sender's, else the payload's hash."""
    if delivery_id:
        return delivery_id
    return "payload:" + hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


OUTCOMES = (StepStatus.DONE, StepStatus.POSSIBLY_RAN)
"""The statuses :meth:`JournalStore.finish_step` records."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What :meth:`JournalStore.finish_step` records over a step's intent."""

    status: StepStatus
    output: str | None
    output_blob: str | None
    meta: dict[str, Any]


class JournalStore(abc.ABC):
    """A turn's steps: intents and outcomes, fenced by the lease epoch (invariants 1-3)."""

    @abc.abstractmethod
    def load_steps(self, turn_id: str) -> list[Step]:
        """The turn's journal in ``seq`` order. :class:`CorruptJournal` on a bad row."""

    @abc.abstractmethod
    def insert_intent(self, step: Step) -> None:
        """Durably record a step's intent (``step.status`` is ``intent``), fenced by
        ``step.epoch``. :class:`StepConflict` if the seq or key is taken."""

    @abc.abstractmethod
    def restart_intent(self, turn_id: str, seq: int, epoch: int) -> int:
        """Record that an interrupted intent is being run again (fenced); return the new
        attempt count. Only for steps still in status ``intent``. ``started_at`` keeps
        the first start (a wait's deadline is measured from it)."""

    def finish_step(
        self,
        turn_id: str,
        seq: int,
        epoch: int,
        status: StepStatus,
        output: str | None,
        output_blob: str | None,
        meta: dict[str, Any],
    ) -> None:
        """Record the outcome of a step in status ``intent`` (fenced). ``status`` is
        ``done`` or ``possibly_ran`` (anything else is a :class:`WorldError` here, before
        the backend is asked). A step that already has an outcome raises
        :class:`StepConflict`."""
        if status not in OUTCOMES:
            raise WorldError(f"finish_step records done or possibly_ran, got {status}")
        self.record_outcome(turn_id, seq, epoch, Outcome(status, output, output_blob, meta))

    @abc.abstractmethod
    def record_outcome(self, turn_id: str, seq: int, epoch: int, outcome: Outcome) -> None:
        """The backend's part of :meth:`finish_step`: write ``outcome`` (its status already
        checked) over step ``seq``'s intent, fenced by ``epoch``; ``outcome.meta`` is merged
        into the intent's meta, so what the intent recorded stays visible to ``show``."""


class EventLog(abc.ABC):
    """Each turn's event log: what ``serve`` streams to apps (see the module docstring).

    Writers: the worker holding the lease (fenced: steps beginning and ending, model text
    as it streams, waits, the reply), and writers without a lease (``epoch=None``: the
    turn's creation, a signal, ``serve`` reconciling a finished turn's log). Every writer
    may append a key again (after a crash it cannot tell whether the append landed): the
    log keeps the first.
    """

    @abc.abstractmethod
    def append_event(
        self,
        turn_id: str,
        key: str,
        kind: str,
        data: dict[str, Any],
        epoch: int | None = None,
    ) -> Event:
        """Append an event with the turn's next seq, unless ``key`` is in the log already
        (then return that event, unchanged). With ``epoch``: :class:`LeaseLost` unless the
        turn is ``running`` at that epoch, checked with the append. :class:`NotFound` for
        an unknown turn. ``data`` is a JSON object (at most :data:`MAX_EVENT_BYTES` as
        canonical JSON: a :class:`WorldError` past it)."""

    @abc.abstractmethod
    def read_events(self, turn_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        """The turn's events with ``seq > after``, in seq order, at most ``limit`` of them:
        a run with no gap (``after + 1``, ``after + 2``, ...). Empty for an unknown turn."""

    def wait_for_events(self, timeout: float) -> None:
        """Block until any turn may have new events, or ``timeout`` seconds passed: what a
        reader following live turns calls between reads. A spurious return costs a read.
        The default sleeps; PostgreSQL returns as soon as a NOTIFY says an event landed."""
        time.sleep(timeout)


#: The largest event ``data`` (canonical JSON, bytes) a World stores: model text is
#: appended in pieces far below it; a larger value is a caller's bug.
MAX_EVENT_BYTES = 256 * 1024


class Tenancy(abc.ABC):
    """What ``serve`` keeps about its callers: API tokens (only their sha256 is stored),
    which tenant owns a session or a turn, and rate counters shared by every ``serve``."""

    @abc.abstractmethod
    def put_token(self, token: ApiToken) -> None:
        """Store a new token; :class:`StepConflict` if its ``token_id`` exists."""

    @abc.abstractmethod
    def get_token(self, token_id: str) -> ApiToken:
        """:class:`NotFound` for an unknown id."""

    @abc.abstractmethod
    def list_tokens(self) -> list[ApiToken]:
        """Every token, revoked ones too, oldest first."""

    @abc.abstractmethod
    def revoke_token(self, token_id: str, at: float) -> ApiToken:
        """Set ``revoked_at`` (a second revoke keeps the first time); return the token.
        :class:`NotFound` for an unknown id."""

    @abc.abstractmethod
    def put_owner(self, kind: str, item_id: str, tenant: str, created_at: float) -> None:
        """Record that ``tenant`` owns item ``item_id`` of ``kind`` (``session`` or
        ``turn``). Idempotent for the same tenant; :class:`StepConflict` if another tenant
        owns it."""

    @abc.abstractmethod
    def get_owner(self, kind: str, item_id: str) -> str | None:
        """The tenant owning the item, or None (an item made outside ``serve``)."""

    @abc.abstractmethod
    def list_owned(
        self,
        tenant: str,
        kind: str,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[tuple[float, str]]:
        """The tenant's items of ``kind`` as ``(created_at, item_id)``, newest first
        (ties by id, descending); with ``before``, only those that sort after it: the
        cursor of the next page is the last item of this one."""

    @abc.abstractmethod
    def take_rate(self, bucket: str, limit: int, window_s: float) -> bool:
        """Count one use of ``bucket`` in the current fixed window of ``window_s`` seconds
        of the World's clock, if fewer than ``limit`` were counted in it: True. Else count
        nothing and return False. Atomic across processes."""


class Doctor(abc.ABC):
    """Health checks for ``durable-harness doctor``."""

    @abc.abstractmethod
    def doctor(self) -> list[Check]:
        """Connectivity, permissions, schema: each a :class:`Check`. Never raises for a
        failed check: it reports it with what to do."""


class World(BlobStore, Catalog, Queue, JournalStore, EventLog, Tenancy, Doctor, Closing):
    """Storage and queue for turns: every facet. See the module docstring for the contract."""

    def doctor(self) -> list[Check]:
        """The default round-trips a blob and lists turns; backends add their own checks
        (server version, schema version, conditional writes)."""
        checks: list[Check] = []
        try:
            digest = self.put_blob(b"durable-harness doctor")
            ok = self.get_blob(digest) == b"durable-harness doctor"
            checks.append(Check("blobs", ok, "write and read back a blob"))
        except Exception as exc:
            checks.append(Check("blobs", False, f"{type(exc).__name__}: {exc}"))
        try:
            self.list_turns(limit=1)
            checks.append(Check("turns", True, "list turns"))
        except Exception as exc:
            checks.append(Check("turns", False, f"{type(exc).__name__}: {exc}"))
        return checks

    def close(self) -> None:  # optional: a backend without resources keeps this one
        """Release connections and files."""
