"""The writer of a turn's event log (:class:`~durable_harness.core.world.EventLog`).

The journal is the truth; the event log is what ``serve`` streams of it. Two writers:

* :class:`TurnEvents`, the lease holder's (every append fenced by its epoch).
  :meth:`TurnEvents.begin_attempt` runs at claim, *before* anything of the turn runs, and
  reconciles the log with the journal: whatever a dead worker did not get to append
  (``turn.created``, a step's ``started``/``finished``, the ``abandoned`` of the attempt
  it was running, the ``lost`` of its own attempt) is appended then, from the journal.
  So an interrupted attempt is marked abandoned before the next attempt's events.
* :func:`settle_finished`, without a lease, for a turn that is over: the same
  reconciliation and ``turn.ended`` last (what the worker calls after it ended the turn,
  and ``serve`` when it reaches a finished turn's log without ``turn.ended``).

"Every event exactly once" comes from the keys of :mod:`durable_harness.core.events`: an
event's key is derived from the journal (a step's seq and attempt, a lease epoch), so a
writer that does not know whether an append landed appends again, and several writers
reconciling one log at once append the same keys in the same order (each key lands once,
the first append's, and in that order).

Model text is coalesced (:meth:`TurnEvents.text`): pieces are buffered and appended as
one ``text.delta`` per ``flush_seconds``, from a timer, so text reaches the log while the
model pauses too. Every piece of a step attempt is appended *before* the step's outcome
is recorded (:meth:`TurnEvents.flush`, called by the journal): a finished attempt's
deltas are then complete in the log, and a failed append (the World is down, the lease
lost) fails the step like a failed outcome write would, leaving an intent that the next
attempt reconciles as abandoned and runs again. Dropping a delta instead would leave a
finished step whose streamed text is not its text, which no reconciliation can repair.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from durable_harness.core import events as ev
from durable_harness.core.canonical import canonical_json, without_surrogates
from durable_harness.core.errors import DurableHarnessError
from durable_harness.core.types import FINISHED, Event, Step, StepStatus, Turn, TurnStatus
from durable_harness.core.world import EventLog, World, delivery_key
from durable_harness.harness.journal import SETTLED, decode_output

log = logging.getLogger(__name__)

#: How much of a step's outcome ``step.finished`` carries (characters): a preview for a
#: client; the whole outcome is in the journal (``show``).
OUTPUT_PREVIEW = 2048
#: The default pause between two ``text.delta`` appends of one step attempt (seconds).
FLUSH_SECONDS = 0.05
#: The most text one ``text.delta`` carries (characters; at most 4 bytes each in UTF-8,
#: a quarter of :data:`~durable_harness.core.world.MAX_EVENT_BYTES`).
MAX_DELTA_CHARS = 16 * 1024
_PAGE = 1000


def read_all(world: World, turn_id: str, after: int = 0) -> list[Event]:
    """Every event of the turn with ``seq > after``, in seq order."""
    found: list[Event] = []
    while True:
        page = world.read_events(turn_id, after=found[-1].seq if found else after, limit=_PAGE)
        found.extend(page)
        if len(page) < _PAGE:
            return found


def preview(value: Any) -> str:
    """The start of an outcome as text: a string as it is, an Anthropic message's text
    blocks, anything else as canonical JSON (a proxy-recorded model call: see below)."""
    if isinstance(value, dict) and "stream" in value and ("events" in value or "body" in value):
        # The proxy's record of a CLI's model call: a streamed one's text is in its
        # deltas (its raw events are no preview), a JSON one's is its body's.
        return preview(value["body"]) if "body" in value else ""
    if isinstance(value, dict):
        content = value.get("content")
        if isinstance(content, list) and value.get("role") == "assistant":
            value = "".join(
                str(b.get("text", ""))
                for b in content
                if isinstance(b, dict) and b.get("type") == "text"
            )
    return _clip(value if isinstance(value, str) else canonical_json(value))


def _clip(text: str) -> str:
    # An event is text for a client (and a text column), where a lone surrogate cannot
    # go: the journal keeps the exact outcome.
    clipped: str = without_surrogates(text[:OUTPUT_PREVIEW])
    return clipped


def usage_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The fields of a step's meta a client may see: tokens and cost, nothing else (a
    snapshot digest or an error text is the journal's, not the stream's)."""
    return {
        k: v
        for k, v in meta.items()
        if (k.endswith("tokens") or "cost" in k) and isinstance(v, (int, float))
    }


@dataclass
class _LogState:
    """What a reconciliation learned from one read of the log."""

    keys: set[str]
    started_epochs: list[int]
    text: dict[tuple[int, int], list[str]] = field(default_factory=dict)


def _state(events: Sequence[Event]) -> _LogState:
    keys = {e.key for e in events}
    started = sorted(
        int(e.data["epoch"]) for e in events if e.kind == ev.ATTEMPT_STARTED and "epoch" in e.data
    )
    text: dict[tuple[int, int], list[str]] = {}
    for e in events:
        if e.kind == ev.TEXT_DELTA:
            text.setdefault((int(e.data["seq"]), int(e.data["attempt"])), []).append(
                str(e.data.get("text", ""))
            )
    return _LogState(keys, started, text)


def _closed(keys: set[str], epoch: int) -> bool:
    return any(ev.attempt_key(epoch, what) in keys for what in ("waiting", "released", "lost"))


def _previous_end(state: _LogState, epoch: int, open_epochs: Sequence[int]) -> str | None:
    """How the latest delivery before lease ``epoch`` ended: ``lost`` (its worker died:
    open, or already marked lost), ``released`` (it gave the turn back, an error), ``woken``
    (it parked the turn on a wait), or None (this is the first)."""
    earlier = [e for e in state.started_epochs if e < epoch]
    if not earlier:
        return None
    last = max(earlier)
    if last in open_epochs or ev.attempt_key(last, "lost") in state.keys:
        return "lost"
    if ev.attempt_key(last, "released") in state.keys:
        return "released"
    return "woken" if ev.attempt_key(last, "waiting") in state.keys else "lost"


class _Appender:
    """Appends to one turn's log, fenced by ``epoch`` (None: no lease), skipping keys the
    log is known to hold."""

    def __init__(self, world: World, turn_id: str, epoch: int | None, keys: set[str]) -> None:
        self.world = world
        self.turn_id = turn_id
        self.epoch = epoch
        self.keys = keys
        self.appended = 0  # appends made (a key another writer had appended counts too)

    def append(self, key: str, kind: str, data: dict[str, Any]) -> None:
        if key in self.keys:
            return
        self.world.append_event(self.turn_id, key, kind, data, epoch=self.epoch)
        self.keys.add(key)
        self.appended += 1

    def created(self, session_id: str, index: int, agent: str) -> None:
        data = {"session_id": session_id, "index": index, "agent": agent}
        self.append(ev.turn_created_key(), ev.TURN_CREATED, data)

    def step_started(self, step: Step, attempt: int) -> None:
        data = {
            "seq": step.seq,
            "attempt": attempt,
            "kind": step.kind,
            "name": step.name,
            "key": step.key,
        }
        self.append(ev.step_attempt_key(step.seq, attempt, "started"), ev.STEP_STARTED, data)

    def step_abandoned(self, seq: int, attempt: int) -> None:
        data = {"seq": seq, "attempt": attempt}
        self.append(ev.step_attempt_key(seq, attempt, "abandoned"), ev.STEP_ABANDONED, data)

    def step_finished(self, step: Step, output: str) -> None:
        data = {
            "seq": step.seq,
            "attempt": step.attempts,
            "kind": step.kind,
            "name": step.name,
            "status": str(step.status),
            "output": output,
            "meta": usage_meta(step.meta),
        }
        if SETTLED in step.meta:
            # What its check answered (a viewer draws a settled step as such at once).
            data["settled"] = str(step.meta[SETTLED])
        self.append(ev.step_finished_key(step.seq), ev.STEP_FINISHED, data)

    def reconcile(
        self, world: World, state: _LogState, steps: Sequence[Step], open_epochs: Sequence[int]
    ) -> None:
        """Mark ``open_epochs`` lost, then bring every step's events up to its journal
        row: a finished step gets ``started`` (of its last attempt) and ``finished``; an
        intent (its worker died, or it suspended a wait) gets its last attempt's
        ``started`` and ``abandoned``; an earlier attempt left open is abandoned too."""
        for epoch in open_epochs:
            self.append(ev.attempt_key(epoch, "lost"), ev.ATTEMPT_LOST, {"epoch": epoch})
        for step in steps:
            if ev.step_finished_key(step.seq) in self.keys:
                continue
            finished = step.status is not StepStatus.INTENT
            for attempt in range(1, step.attempts + 1):
                last = attempt == step.attempts
                began = ev.step_attempt_key(step.seq, attempt, "started") in self.keys
                if last and finished:
                    self.step_started(step, attempt)
                elif began or last:
                    self.step_started(step, attempt)
                    self.step_abandoned(step.seq, attempt)
            if finished:
                pieces = state.text.get((step.seq, step.attempts))
                self.step_finished(step, _finished_output(world, step, pieces))


def _finished_output(world: World, step: Step, pieces: list[str] | None) -> str:
    """``step.finished``'s output: a model step's streamed text when it has some (what
    the client saw), else the start of the recorded outcome."""
    if pieces:
        return _clip("".join(pieces))
    return preview(decode_output(world, step))


def turn_created(world: EventLog, turn: Turn) -> None:
    """``turn.created``, right after ``create_turn`` (unfenced). Should its writer die
    first, the turn's first worker (or :func:`settle_finished`) appends it."""
    data = {
        "session_id": turn.session_id,
        "index": turn.index,
        "agent": str(turn.config.get("agent", "builtin")),
    }
    world.append_event(turn.turn_id, ev.turn_created_key(), ev.TURN_CREATED, data)


def signal_received(
    world: World, turn_id: str, name: str, payload: str, delivery_id: str | None
) -> None:
    """``signal.received`` for a signal ``send_signal`` recorded (unfenced). Called for a
    repeated delivery too: its key is the World's delivery key, so a sender that retries
    after the first append failed gets the event in, still once. Not after ``turn.ended``
    (a finished turn's log ends there; the signal itself is kept by the World)."""
    if world.get_turn(turn_id).status in FINISHED:
        return
    key = ev.signal_key(name, delivery_key(payload, delivery_id))
    world.append_event(turn_id, key, ev.SIGNAL_RECEIVED, {"name": name})


def settle_finished(world: World, turn_id: str) -> None:
    """Make a finished turn's log complete, without a lease: the reconciliation of
    :meth:`TurnEvents.begin_attempt` (intents abandoned, missing ``finished`` appended,
    attempts left open marked lost) and then ``turn.ended`` last.

    The attempt that ended the turn is closed by ``turn.ended`` itself; when its worker
    died before appending it, the log cannot tell that attempt from one that was lost, so
    the last attempt is never marked lost here (a lost mark landing after the worker's
    own ``turn.ended`` would break "``turn.ended`` is last"). Idempotent, and safe to run
    from several processes at once, and beside the worker's own call after it ended the
    turn: every writer appends the same keys in the same order. A turn that is not
    finished is left alone.
    """
    turn = world.get_turn(turn_id)
    if turn.status not in FINISHED:
        return
    events = read_all(world, turn_id)
    state = _state(events)
    if ev.turn_ended_key() in state.keys:
        return
    appender = _Appender(world, turn_id, None, state.keys)
    appender.created(turn.session_id, turn.index, str(turn.config.get("agent", "builtin")))
    open_epochs = [e for e in state.started_epochs[:-1] if not _closed(state.keys, e)]
    appender.reconcile(world, state, world.load_steps(turn_id), open_epochs)
    result, error = _ended_text(turn.result), _ended_text(turn.error)
    data: dict[str, Any] = {"status": str(turn.status), "result": result, "error": error}
    if (result, error) != (turn.result, turn.error):
        data["truncated"] = True  # the whole reply is the turn's (GET /v1/turns/{id}, show)
    appender.append(ev.turn_ended_key(), ev.TURN_ENDED, data)


#: The most of a reply or error ``turn.ended`` carries (characters): a reply is the
#: model's or the CLI's text, of any length, and one event holds at most MAX_EVENT_BYTES.
ENDED_TEXT = 64 * 1024


def _ended_text(text: str | None) -> str | None:
    return None if text is None else text[:ENDED_TEXT]


@dataclass
class _Text:
    """One step attempt's text not yet in the log: ``pending`` is the piece being
    appended as delta ``n`` (kept exactly, so a retry after an append that may have landed
    sends the same text under the same key), ``buffer`` what came after it."""

    attempt: int
    n: int = 0
    pending: str | None = None
    buffer: list[str] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)


class TurnEvents:
    """The lease holder's writer of a turn's event log; see the module docstring.

    Every append carries ``epoch``: the World refuses it with :class:`LeaseLost` once the
    turn is no longer running at that epoch, which stops the turn like a journal write.
    Thread-safe (the proxy serves parallel model calls, the text timer runs beside them).
    """

    def __init__(
        self,
        world: World,
        turn_id: str,
        epoch: int,
        attempt: int,
        *,
        flush_seconds: float = FLUSH_SECONDS,
    ) -> None:
        self.world = world
        self.turn_id = turn_id
        self.epoch = epoch
        self.attempt = attempt
        self.flush_seconds = flush_seconds
        self._out = _Appender(world, turn_id, epoch, set())
        self._lock = threading.RLock()
        self._text: dict[int, _Text] = {}
        self._timer: threading.Timer | None = None
        self._failed: BaseException | None = None  # the timer's append error (logged)
        #: ``attempt.started`` of each earlier attempt :meth:`begin_attempt` marked lost.
        self.lost: list[Event] = []
        #: How the delivery before this one ended (:func:`_previous_end`), set at claim:
        #: what ``step.replayed`` says, so savings count read-backs after a death or a
        #: failed delivery, not the ones after a wait (a parked turn always reads back).
        self.after: str | None = None

    # -- at claim ------------------------------------------------------------------
    def begin_attempt(self, owner: str, steps: Sequence[Step] | None = None) -> None:
        """Reconcile the log with the journal (``steps``: the turn's journal, read now if
        not given), then append this attempt's ``attempt.started``. Call before anything
        of the turn runs."""
        turn = self.world.get_turn(self.turn_id)
        logged = read_all(self.world, self.turn_id)
        state = _state(logged)
        with self._lock:
            self._out.keys = state.keys | self._out.keys
            self._out.created(turn.session_id, turn.index, str(turn.config.get("agent", "builtin")))
            open_epochs = [
                e for e in state.started_epochs if e != self.epoch and not _closed(state.keys, e)
            ]
            # What telemetry exports of the attempts whose worker died (runtime/telemetry).
            self.lost = [
                e
                for e in logged
                if e.kind == ev.ATTEMPT_STARTED and e.data.get("epoch") in open_epochs
            ]
            self.after = _previous_end(state, self.epoch, open_epochs)
            journal = self.world.load_steps(self.turn_id) if steps is None else steps
            self._out.reconcile(self.world, state, journal, open_epochs)
            data = {"epoch": self.epoch, "attempt": self.attempt, "worker": owner}
            self._append(ev.attempt_key(self.epoch, "started"), ev.ATTEMPT_STARTED, data)

    # -- steps ---------------------------------------------------------------------
    def step_started(self, step: Step) -> None:
        """The step's intent is durable and its call about to run (attempt
        ``step.attempts``)."""
        with self._lock:
            # An earlier attempt of this step that failed in this process (a model error
            # the agent retries) is abandoned first: its text is not part of the reply.
            for attempt in range(1, step.attempts):
                if ev.step_attempt_key(step.seq, attempt, "started") in self._out.keys:
                    self._out.step_abandoned(step.seq, attempt)
            self._text[step.seq] = _Text(step.attempts)
            self._out.step_started(step, step.attempts)

    def text(self, seq: int, text: str) -> None:
        """A piece of model text of open step ``seq``, appended within ``flush_seconds``."""
        if not text:
            return
        with self._lock:
            state = self._text.get(seq)
            if state is None:
                return  # not a step of ours (a replayed one): nothing streams for it
            state.buffer.append(without_surrogates(text))
            if self._timer is None and self._failed is None:
                self._timer = threading.Timer(self.flush_seconds, self._tick)
                self._timer.daemon = True
                self._timer.start()

    def flush(self, seq: int) -> None:
        """Append every text piece of step ``seq`` now: raises what an append raised (the
        timer's failed append too), before the step's outcome is recorded."""
        with self._lock:
            # A piece the timer failed to append is still pending under its key: sent
            # again here, so a World that came back loses nothing; a failure now is the
            # step's (its outcome is not recorded).
            self._failed = None
            state = self._text.get(seq)
            if state is not None:
                while state.pending is not None or state.buffer:
                    self._send(seq, state)

    def step_replayed(self, step: Step) -> None:
        """Finished step ``step`` was read back from the journal by this attempt instead
        of running (fenced, like every append here; once per step and lease epoch)."""
        data = {
            "seq": step.seq,
            "epoch": self.epoch,
            "kind": step.kind,
            "name": step.name,
            "status": str(step.status),
            "after": self.after,
        }
        self._append(ev.step_replayed_key(step.seq, self.epoch), ev.STEP_REPLAYED, data)

    def step_finished(self, step: Step, value: Any) -> None:
        """The step's outcome (``done`` or ``possibly_ran``) is recorded."""
        with self._lock:
            state = self._text.pop(step.seq, None)
            pieces = state.sent if state is not None and state.attempt == step.attempts else None
            output = _clip("".join(pieces)) if pieces else preview(value)
            if state is None:
                # A never tool's possibly-ran outcome: it did not start in this attempt.
                self._out.step_started(step, step.attempts)
            self._out.step_finished(step, output)

    # -- how the attempt ends --------------------------------------------------------
    def waiting(self, waiting_for: str, wake_at: float) -> None:
        """The turn is about to be parked. Appended (fenced) just before ``suspend``: after
        it the turn no longer runs at this epoch, and an unfenced append then could land
        after the next attempt's reconciliation marked this attempt lost."""
        self.close()
        data = {"waiting_for": waiting_for, "wake_at": wake_at}
        self._append(ev.attempt_key(self.epoch, "waiting"), ev.TURN_WAITING, data)

    def released(self, error: str | None, delay: float) -> None:
        """The turn is about to be released (fenced, before ``release``: see
        :meth:`waiting`)."""
        self.close()
        data = {"error": error, "delay": delay}
        self._append(ev.attempt_key(self.epoch, "released"), ev.TURN_RELEASED, data)

    def ended(self, status: TurnStatus | str, result: str | None, error: str | None) -> None:
        """The turn was ended (``complete_turn``, ``fail_turn``, ``cancel_turn``): settle
        its log and append ``turn.ended``, unfenced (the turn is no longer running). The
        values are the turn's as stored, so this and ``serve``'s :func:`settle_finished`
        write the same event, whichever lands first."""
        del status, result, error  # the stored turn says the same, with its spelling
        self.close()
        settle_finished(self.world, self.turn_id)

    def close(self) -> None:
        """Stop the text timer (the attempt is over; unsent text is the next attempt's to
        run again)."""
        with self._lock:
            timer, self._timer = self._timer, None
            self._text.clear()
        if timer is not None:
            timer.cancel()

    # -- helpers -------------------------------------------------------------------
    @property
    def appended(self) -> int:
        """Events this writer appended (for tests and the benchmark)."""
        return self._out.appended

    def _append(self, key: str, kind: str, data: dict[str, Any]) -> None:
        with self._lock:
            self._out.append(key, kind, data)

    def _send(self, seq: int, state: _Text) -> None:
        if state.pending is None:
            # One delta stays far below the World's event cap whatever a stream sends in
            # one interval: the rest waits in the buffer for the next append.
            joined = "".join(state.buffer)
            state.pending, rest = joined[:MAX_DELTA_CHARS], joined[MAX_DELTA_CHARS:]
            state.buffer[:] = [rest] if rest else []
        data = {"seq": seq, "attempt": state.attempt, "n": state.n, "text": state.pending}
        self._append(ev.delta_key(seq, state.attempt, state.n), ev.TEXT_DELTA, data)
        state.sent.append(state.pending)
        state.pending = None
        state.n += 1

    def _tick(self) -> None:
        with self._lock:
            self._timer = None
            try:
                for seq, state in list(self._text.items()):
                    if state.pending is not None or state.buffer:
                        self._send(seq, state)
            except DurableHarnessError as exc:
                # Kept for the step's flush, which raises it before the outcome is
                # recorded; the piece stays pending under its key for that retry.
                log.warning("turn %s: appending model text failed: %s", self.turn_id, exc)
                self._failed = exc
                return
            if any(s.buffer for s in self._text.values()):
                self._timer = threading.Timer(self.flush_seconds, self._tick)
                self._timer.daemon = True
                self._timer.start()
