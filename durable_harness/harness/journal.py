"""The journal runner: the one function every model and tool call goes through.

:meth:`Journal.run` implements DESIGN.md's table for step ``seq`` of a turn:

==============================  ====================================================
journal row for this step        what happens
==============================  ====================================================
outcome recorded                 return the stored result; call nothing
intent, no outcome               interrupted: a model call or ``safe`` tool runs again;
                                 a ``never`` tool does not run, the step is finished
                                 with the *possibly ran* result, unless its check
                                 settles it (below)
nothing                          commit the intent, run the call, record the outcome
==============================  ====================================================

A ``never`` tool with a check (``settle``: :mod:`.tools`) found interrupted is asked first:
*done* finishes the step with the check's result (``meta.settled = "done"``: the model
never hears *possibly ran*); *absent* runs the call again under the same idempotency key
when the caller says an earlier attempt cannot land twice (``rerun_if_absent``:
``settled = "ran again"``), else it is *possibly ran*; so is *unknown*, and a check that
raises (``settled`` says which). A check is safe: a crash during it leaves the intent,
and the next delivery asks again.

It keeps the invariants: the intent is durable before the call (1); seq and key are
unique (2, enforced by the World); every write carries the lease epoch (3); replay
compares kind, name, key and input hash and raises :class:`ReplayDivergence` on a
mismatch (6); large inputs and outputs go to the blob store (7). A cancelled turn
(:mod:`.cancel`) begins no step: :meth:`Journal._begin` raises ``TurnCancelled``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from dataclasses import replace as _replace
from typing import TYPE_CHECKING, Any

from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import (
    CorruptJournal,
    ReplayDivergence,
    StepConflict,
    TurnFailed,
)
from durable_harness.core.keys import blob_ref, idempotency_key, input_digest
from durable_harness.core.types import Lease, Replay, Step, StepStatus
from durable_harness.core.world import BlobStore, World
from durable_harness.harness.cancel import Cancellation
from durable_harness.harness.crash import CrashPlan

if TYPE_CHECKING:
    from durable_harness.harness.budget import Budget
    from durable_harness.harness.events import TurnEvents
    from durable_harness.harness.tools import Checked

#: A settled step's ``meta[SETTLED]``: what its check answered (``SETTLED_DONE``,
#: ``SETTLED_RAN_AGAIN``; else ``absent``, ``unknown``, ``check failed``: possibly ran).
SETTLED = "settled"
SETTLED_DONE = "done"
SETTLED_RAN_AGAIN = "ran again"

#: Outputs (and stored inputs) larger than this go to the blob store; the row keeps the hash.
BLOB_THRESHOLD = 64 * 1024

POSSIBLY_RAN_MESSAGE = (
    "This call was interrupted before its outcome was recorded: it may or may not have "
    "taken effect (idempotency key {key}). Do not assume either way. Check the current "
    "state first (for example with a read-only tool) and call it again only if the "
    "effect is absent."
)


@dataclass(frozen=True)
class Outcome:
    """What a call returns to the journal: a JSON value and metadata for ``show``."""

    value: Any
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    value: Any
    status: StepStatus
    replayed: bool  # True: read back from the journal, the call did not run now
    step: Step


@dataclass(frozen=True)
class OpenStep:
    """A step whose intent is committed and whose call is now running."""

    step: Step
    started: float  # time.monotonic() when the call began
    meta: dict[str, Any] = field(default_factory=dict)  # recorded with the outcome


@dataclass(frozen=True)
class _Unsettled:
    """A ``never`` step found interrupted, whose check is to be asked (outside the lock)."""

    step: Step


@dataclass(frozen=True)
class StepEvent:
    """Progress report for a step, given to the ``on_step`` callback."""

    seq: int
    kind: str
    name: str
    phase: str  # "start" | "done" | "replayed" | "possibly_ran"
    attempts: int
    duration: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)


class Journal:
    """One turn's journal, as seen by the worker holding its lease."""

    def __init__(
        self,
        world: World,
        lease: Lease,
        *,
        crash: CrashPlan | None = None,
        on_step: Callable[[StepEvent], None] | None = None,
        blob_threshold: int = BLOB_THRESHOLD,
        replay_only: bool = False,
        max_model_calls: int | None = None,
        cancel: Cancellation | None = None,
        events: TurnEvents | None = None,
        budget: Budget | None = None,
    ) -> None:
        self.world = world
        #: Set by the worker's lease keeper when the turn is cancelled; adapters register
        #: what stops their agent on it (``TurnRun.cancel``).
        self.cancel = cancel or Cancellation()
        #: The turn's event log writer (the worker's, after its ``begin_attempt``): a
        #: step's ``started`` once its intent is durable, its text, its ``finished`` once
        #: the outcome is. A replayed step appends only its ``step.replayed`` (its other
        #: events are in the log).
        self.events = events
        #: The turn's budget of model steps for keyed calls (CLI agents, whose loop is not
        #: ours to bound): a new model call past it ends the turn (TurnFailed).
        self.max_model_calls = max_model_calls
        #: The turn's spend limits (harness/budget.py), checked before every model call
        #: that is about to be made, new or run again after a crash.
        self.budget = budget
        self.replay_only = replay_only
        self.lease = lease
        self.crash = crash
        self.on_step = on_step
        self.blob_threshold = blob_threshold
        # Steps are stamped with the World's clock (a wait's deadline is measured from its
        # intent's started_at, and the World wakes the turn by its own clock): this
        # machine's clock corrected by the offset measured once, when the lease is taken.
        self._clock_offset = world.now() - time.time()
        # replay_only: read back finished steps, never call or write (``durable-harness
        # replay``, which proves a finished turn needs zero model calls: invariant 6).
        self.recorded: dict[int, Step] = {s.seq: s for s in world.load_steps(lease.turn_id)}
        self._by_key: dict[str, Step] = {s.key: s for s in self.recorded.values()}
        self._next_seq = 0
        self.replayed = 0  # steps answered from the journal by this Journal, keyed or not
        # Steps may begin from several threads (a CLI proxy serving parallel requests);
        # seq allocation and the intent insert happen under this lock, calls outside it.
        self._lock = threading.RLock()
        # Keyed steps whose check is being asked, or which it sent to run again: a second
        # caller of the same key (a CLI's call posted twice) must not ask it again.
        self._settling: set[int] = set()

    @property
    def turn_id(self) -> str:
        return self.lease.turn_id

    def now(self) -> float:
        """The World's time (:meth:`Queue.now`), read from this machine's clock."""
        return time.time() + self._clock_offset

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def latest_meta(self, name: str) -> Any:
        """The newest value of ``meta[name]`` among finished recorded steps (or None)."""
        for seq in sorted(self.recorded, reverse=True):
            step = self.recorded[seq]
            if step.status is StepStatus.DONE and name in step.meta:
                return step.meta[name]
        return None

    def run(
        self,
        *,
        kind: str,
        name: str,
        key: str,
        input: Any,
        call: Callable[[int], Outcome],
        replay: Replay,
        store_input: bool = True,
        settle: Callable[[int], Checked] | None = None,
        rerun_if_absent: bool = False,
    ) -> StepResult:
        """Run (or read back) the next step, by position. ``call(seq)`` performs it.

        A model call is always ``replay="safe"``: running an unfinished one again costs
        money but changes nothing. ``store_input=False`` keeps only the input's hash (for
        model requests, which repeat the whole conversation: invariant 7). ``settle(seq)``:
        a ``never`` tool's check, asked when its step is found interrupted (see the module
        docstring), and ``rerun_if_absent``: its downstream honours the idempotency key.
        """
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            begun = self._begin(
                seq, kind, name, key, input, replay, store_input, settling=settle is not None
            )
        if isinstance(begun, _Unsettled):
            assert settle is not None
            begun = self._settle(begun.step, settle, rerun_if_absent)
        if isinstance(begun, StepResult):
            return begun
        try:
            outcome = call(begun.step.seq)
        except BaseException:
            # The step stays an interrupted intent. A caller that retries it in this run
            # (a program's own loop, catching a model error) gets the same seq back, so the
            # retry is that step again under its replay rule, as it will be after a crash,
            # rather than a new step that a resumed run would find out of order.
            with self._lock:
                if self._next_seq == seq + 1:
                    self._next_seq = seq
            raise
        return self.end(begun, outcome)

    def begin_keyed(
        self,
        *,
        kind: str,
        name: str,
        key: str,
        input: Any,
        replay: Replay,
        store_input: bool = False,
        settle: Callable[[int], Checked] | None = None,
        rerun_if_absent: bool = False,
    ) -> StepResult | OpenStep:
        """Phase one of a step found by its ``key``, not its position.

        For callers that do not decide the order of calls: a CLI agent's model requests
        (keyed by the canonical request hash) and tool calls (keyed by tool_use id), which
        come back in a new order, or not at all, after a crash. A recorded step with this
        key is answered from the journal (a :class:`StepResult`); otherwise the intent is
        committed at the next free ``seq`` and an :class:`OpenStep` returned: run the call,
        then pass its outcome to :meth:`end`. ``settle`` and ``rerun_if_absent`` as for
        :meth:`run` (an interrupted ``never`` step whose check says *absent* under a key
        the downstream honours comes back open, to run again). Thread-safe.
        """
        with self._lock:
            recorded = self._by_key.get(key)
            if recorded is None and kind == "model":
                self._check_budget()
            seq = recorded.seq if recorded is not None else max(self.recorded, default=-1) + 1
            begun = self._begin(
                seq, kind, name, key, input, replay, store_input, settling=settle is not None
            )
            if isinstance(begun, _Unsettled):
                if seq in self._settling:
                    raise StepConflict(
                        f"step {seq} of turn {self.turn_id} is being settled or run again "
                        "by this worker already"
                    )
                self._settling.add(seq)
        if not isinstance(begun, _Unsettled):
            return begun
        assert settle is not None
        try:
            settled = self._settle(begun.step, settle, rerun_if_absent)
        except BaseException:
            with self._lock:
                self._settling.discard(seq)
            raise
        if isinstance(settled, StepResult):
            with self._lock:
                self._settling.discard(seq)
        return settled  # open: run again, and busy until its outcome is recorded

    def _check_budget(self) -> None:
        limit = self.max_model_calls
        if limit is None or self.replay_only:
            return
        made = sum(1 for s in self.recorded.values() if s.kind == "model")
        if made >= limit:
            raise TurnFailed(
                f"the agent made {made} model calls in this turn without finishing; the "
                f"turn's limit is {limit} (raise it with --max-model-calls)"
            )

    def end(self, open_step: OpenStep, outcome: Outcome) -> StepResult:
        """Phase two: record the outcome of an open step (fenced)."""
        step = open_step.step
        if self._settling:  # almost always empty: no lock taken on the common path
            with self._lock:
                self._settling.discard(step.seq)
        duration = time.monotonic() - open_step.started
        self._crash(step.seq, "after_run")
        if self.events is not None:
            # The step's text is in the log before its outcome: see harness/events.py.
            self.events.flush(step.seq)
        meta = {
            **open_step.meta,
            **outcome.meta,
            "duration": round(duration, 6),
            "turn_attempt": self.lease.attempt,
        }
        output, blob = self._stored_output(outcome.value)
        self.world.finish_step(
            self.turn_id, step.seq, self.lease.epoch, StepStatus.DONE, output, blob, meta
        )
        done = _replace(
            step,
            status=StepStatus.DONE,
            output=output,
            output_blob=blob,
            finished_at=self.now(),
            meta=meta,
        )
        self._remember(done)
        self._crash(step.seq, "after_outcome")
        if self.events is not None:
            self.events.step_finished(done, outcome.value)
        self._emit(done, "done", duration)
        return StepResult(outcome.value, StepStatus.DONE, False, done)

    def lookup(self, key: str) -> Step | None:
        """The recorded step with this key, if any."""
        with self._lock:
            return self._by_key.get(key)

    def _begin(
        self,
        seq: int,
        kind: str,
        name: str,
        key: str,
        input: Any,
        replay: Replay,
        store_input: bool,
        settling: bool = False,
    ) -> StepResult | OpenStep | _Unsettled:
        self.cancel.check()  # a cancelled turn starts nothing, not even a replay
        digest = input_digest(input)
        recorded = self.recorded.get(seq)
        if recorded is not None:
            self._check_same(recorded, kind, name, key, digest)
            if recorded.status is not StepStatus.INTENT:
                phase = "replayed" if recorded.status is StepStatus.DONE else "possibly_ran"
                self.replayed += 1
                if self.events is not None and recorded.meta.get("turn_attempt") != (
                    self.lease.attempt
                ):
                    # What the viewer draws as replayed, and what savings count: an earlier
                    # delivery's outcome (a CLI's retry of a call this delivery recorded is
                    # answered from the journal too, but saves nothing a crash would cost).
                    self.events.step_replayed(recorded)
                self._emit(recorded, phase)
                return StepResult(self._output(recorded), recorded.status, True, recorded)
            self._refuse_live(seq, kind, name)
            if replay == "never":
                return _Unsettled(recorded) if settling else self._finish_possibly_ran(recorded)
            self._check_spend(kind, name)
            attempts = self.world.restart_intent(self.turn_id, seq, self.lease.epoch)
            step = _replace(recorded, attempts=attempts)
        else:
            self._refuse_live(seq, kind, name)
            self._check_spend(kind, name)
            self._crash(seq, "before_intent")
            step = Step(
                turn_id=self.turn_id,
                seq=seq,
                key=key,
                kind=kind,
                name=name,
                input_hash=digest,
                input=self._stored_input(input) if store_input else None,
                status=StepStatus.INTENT,
                epoch=self.lease.epoch,
                started_at=self.now(),
            )
            self.world.insert_intent(step)
        self._remember(step)
        self._crash(seq, "after_intent")
        if self.events is not None:
            self.events.step_started(step)
        self._emit(step, "start")
        return OpenStep(step, time.monotonic())

    # -- helpers -------------------------------------------------------------------
    def _remember(self, step: Step) -> None:
        self.recorded[step.seq] = step
        self._by_key[step.key] = step

    def _refuse_live(self, seq: int, kind: str, name: str) -> None:
        if self.replay_only:
            raise ReplayDivergence(
                f"turn {self.turn_id} step {seq} ({kind} {name}) has no recorded outcome: "
                "a replay from the journal alone cannot go past it"
            )

    def _check_spend(self, kind: str, name: str) -> None:
        # Under the lock, before the intent: a call another thread begins next sees this
        # one's intent (a lost call until its outcome is in), so parallel requests of a
        # CLI overshoot no limit by more than the call in flight when it was reached.
        if kind == "model" and self.budget is not None:
            self.budget.check(self.recorded.values(), name)

    def _settle(
        self, step: Step, settle: Callable[[int], Checked], rerun_if_absent: bool
    ) -> StepResult | OpenStep:
        """Ask the check of the interrupted ``never`` step ``step`` (see the module
        docstring): its result, the call to run again, or *possibly ran*."""
        try:
            checked = settle(step.seq)
        except Exception as exc:  # the user's check: its failure is "we do not know"
            error = f"{type(exc).__name__}: {exc}"[:500]
            return self._finish_possibly_ran(step, {SETTLED: "check failed", "error": error})
        if checked.state == "done":
            return self.end(
                OpenStep(step, time.monotonic(), {SETTLED: SETTLED_DONE}), Outcome(checked.result)
            )
        if checked.state != "absent" or not rerun_if_absent:
            return self._finish_possibly_ran(step, {SETTLED: checked.state})
        with self._lock:
            # The check may have taken a while: a cancel or a worker's stop that came
            # meanwhile stops the call from starting again, as it stops any new step.
            self.cancel.check()
            attempts = self.world.restart_intent(self.turn_id, step.seq, self.lease.epoch)
            step = _replace(step, attempts=attempts)
            self._remember(step)
        self._crash(step.seq, "after_intent")
        if self.events is not None:
            self.events.step_started(step)
        self._emit(step, "start")
        return OpenStep(step, time.monotonic(), {SETTLED: SETTLED_RAN_AGAIN})

    def _finish_possibly_ran(self, step: Step, extra: dict[str, Any] | None = None) -> StepResult:
        message = POSSIBLY_RAN_MESSAGE.format(key=idempotency_key(self.turn_id, step.seq))
        meta = {**(extra or {}), "turn_attempt": self.lease.attempt}
        output = canonical_json(message)
        self.world.finish_step(
            self.turn_id, step.seq, self.lease.epoch, StepStatus.POSSIBLY_RAN, output, None, meta
        )
        done = _replace(step, status=StepStatus.POSSIBLY_RAN, output=output, meta=meta)
        self._remember(done)
        if self.events is not None:
            self.events.step_finished(done, message)
        self._emit(done, "possibly_ran")
        return StepResult(message, StepStatus.POSSIBLY_RAN, False, done)

    def _check_same(self, rec: Step, kind: str, name: str, key: str, digest: str) -> None:
        diffs = [
            f"{field_name} recorded {old!r}, now {new!r}"
            for field_name, old, new in (
                ("kind", rec.kind, kind),
                ("name", rec.name, name),
                ("key", rec.key, key),
                ("input hash", rec.input_hash[:12], digest[:12]),
            )
            if old != new
        ]
        if diffs:
            raise ReplayDivergence(
                f"turn {self.turn_id} step {rec.seq} does not match its journal row "
                f"({'; '.join(diffs)}). The code, tools or prompt changed under a turn in "
                "flight; finish it with the version that started it, or start a new turn."
            )

    def _stored_input(self, value: Any) -> str:
        text = canonical_json(value)
        if len(text) <= self.blob_threshold:
            return text
        return blob_ref(self.world.put_blob(text.encode()))

    def _stored_output(self, value: Any) -> tuple[str | None, str | None]:
        text = canonical_json(value)
        if len(text) <= self.blob_threshold:
            return text, None
        return None, self.world.put_blob(text.encode())

    def _output(self, step: Step) -> Any:
        return decode_output(self.world, step)

    def _crash(self, seq: int, point: Any) -> None:
        if self.crash is not None:
            self.crash.check(seq, point)

    def _emit(self, step: Step, phase: str, duration: float = 0.0) -> None:
        if self.on_step is not None:
            self.on_step(
                StepEvent(step.seq, step.kind, step.name, phase, step.attempts, duration, step.meta)
            )


def decode_output(world: BlobStore, step: Step) -> Any:
    """The recorded outcome of ``step`` as a JSON value (None if it has none)."""
    try:
        if step.output_blob is not None:
            return json.loads(world.get_blob(step.output_blob))
        return json.loads(step.output) if step.output is not None else None
    except ValueError as exc:
        raise CorruptJournal(
            f"turn {step.turn_id} step {step.seq}: output is not valid JSON ({exc}); "
            "inspect it with `durable-harness show`, then fail the turn or start a new one"
        ) from exc
