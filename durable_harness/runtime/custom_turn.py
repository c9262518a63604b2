"""A custom harness's turn: your own agent loop, every call a journal step.

:func:`journaled_turn` opens (or reopens) a turn of agent ``custom`` and holds its lease;
the :class:`JournaledTurn` it yields runs each :meth:`~JournaledTurn.model_call` and
:meth:`~JournaledTurn.tool_call` through :meth:`Journal.run
<durable_harness.harness.journal.Journal.run>`, the one function holding the replay policy:
a finished step is read back, an interrupted model call or ``safe`` tool runs again, an
interrupted ``never`` tool comes back *possibly ran*. Running the same program again with
the same turn id after a crash therefore pays for no finished model call and repeats no
side effect. Imported through :mod:`durable_harness.runtime.api` (docs/python-api.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from durable_harness.adapters.custom.adapter import NAME as CUSTOM_AGENT
from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import (
    BudgetExceeded,
    ConfigError,
    DurableHarnessError,
    LeaseLost,
    NotFound,
    ReplayDivergence,
    ToolDefinitionError,
    TurnCancelled,
    TurnFailed,
    WorldError,
)
from durable_harness.core.keys import ordinal_model_key, ordinal_tool_key
from durable_harness.core.settings import Settings
from durable_harness.core.types import CANCEL_SIGNAL, Lease, Replay, StepStatus, Turn, TurnStatus
from durable_harness.core.usage import usage_meta
from durable_harness.core.world import World
from durable_harness.harness.approval import needs_approval
from durable_harness.harness.budget import Budget
from durable_harness.harness.cancel import Cancellation
from durable_harness.harness.crash import CrashPlan
from durable_harness.harness.events import TurnEvents, settle_finished, turn_created
from durable_harness.harness.journal import Journal, Outcome, StepEvent
from durable_harness.harness.lease import LeaseKeeper
from durable_harness.harness.tools import Checked, Tool, ToolContext, ToolInputError
from durable_harness.runtime.turns import claim_for_resume
from durable_harness.runtime.worker import default_owner

__all__ = ["JournaledTurn", "ToolResult", "journaled_turn"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolResult:
    """What :meth:`JournaledTurn.tool_call` returns, the same live and read back.

    ``value`` is the tool's return value as recorded (a JSON value). ``possibly_ran``: a
    ``never`` tool was interrupted before its outcome was recorded, so it did not run
    again; ``value`` is then the message telling the model to check the current state
    before calling it again. ``input_error``: the model's input did not match the tool's
    schema, the tool did not run and ``value`` says why. ``replayed``: read back from the
    journal, the tool did not run now. ``seq`` is the step's number (None for an input
    error, which is not a step: the same input fails the same way on every run).
    """

    value: Any
    possibly_ran: bool = False
    input_error: bool = False
    replayed: bool = False
    seq: int | None = None

    @property
    def text(self) -> str:
        """``value`` as the text of a tool result message."""
        return self.value if isinstance(self.value, str) else canonical_json(self.value)

    @property
    def is_error(self) -> bool:
        """Whether to mark the tool result as an error for the model."""
        return self.possibly_ran or self.input_error


class JournaledTurn:
    """One turn of a custom harness, opened by :func:`journaled_turn`.

    Steps are numbered in the order the program makes them: the n-th call of a run is
    step n. A step already recorded is answered from the journal only if it is the same
    call (same kind, name and canonical input); otherwise :class:`ReplayDivergence` is
    raised, loudly, since the program changed under a turn in flight. So build every
    request from the prompt and from values these methods returned (never from the
    clock, random ids or the environment), and make the calls from one thread.
    """

    def __init__(
        self,
        world: World,
        turn: Turn,
        journal: Journal,
        keeper: LeaseKeeper | None,
    ) -> None:
        self.world = world
        self.turn = turn
        self._journal = journal
        self._keeper = keeper  # None: replaying a finished turn, nothing is written
        self._finished: str | None = None

    @property
    def turn_id(self) -> str:
        return self.turn.turn_id

    @property
    def session_id(self) -> str:
        return self.turn.session_id

    @property
    def replaying(self) -> bool:
        """True when the turn had already finished: every step is read back, no call is
        made, and a step past the recorded ones raises :class:`ReplayDivergence`."""
        return self._keeper is None

    @property
    def replayed_steps(self) -> int:
        """Steps answered from the journal so far by this run."""
        return self._journal.replayed

    def model_call(
        self,
        request: Mapping[str, Any],
        call: Callable[[], Any],
        *,
        name: str | None = None,
    ) -> Any:
        """The next step is a model call: ``call()`` sends ``request`` to the model.

        Returns the reply as a JSON value: an object with ``model_dump`` (what the SDKs
        return) is stored as ``model_dump(mode="json", exclude_none=True)``, so the code
        after this line sees the same dicts whether the reply came live or from the
        journal. The step is checked by the hash of the canonical ``request`` (JSON,
        keys sorted), which must hold everything ``call`` sends. A model call replays as
        ``safe``: one interrupted before its reply was recorded is sent again. If
        ``call`` raises, nothing is recorded and the exception propagates; calling again
        in this run retries the same step.
        """
        body = dict(request)
        label = name or str(body.get("model") or "model")
        key = ordinal_model_key(self._journal.next_seq)

        def run(_seq: int) -> Outcome:
            reply = _as_json(call(), f"the model call {label!r}", ConfigError)
            model = body.get("model")
            return Outcome(reply, _usage(reply, model if isinstance(model, str) else None))

        self._check_open()
        return self._journal.run(
            kind="model",
            name=label,
            key=key,
            input=body,
            call=run,
            replay="safe",
            store_input=False,  # a request repeats the conversation: keep its hash only
        ).value

    def tool_call(
        self,
        name: str,
        args: Mapping[str, Any],
        fn: Callable[..., Any],
        *,
        replay: Replay,
        call_id: str | None = None,
    ) -> ToolResult:
        """The next step is tool ``name`` run as ``fn(args)`` or ``fn(args, ctx)`` (``ctx``
        a :class:`ToolContext` with the step's idempotency key).

        ``replay`` has no default (invariant 4): ``"safe"`` if running it twice is
        harmless (it runs again when interrupted), ``"never"`` if it has a side effect
        that must not repeat (when interrupted, it is not run again and the result says
        it *possibly ran*). ``call_id`` (the model's tool-call id) joins the step's key.
        If ``fn`` raises, nothing is recorded: the step stays interrupted, and the next
        run, or a retry in this one, follows its replay rule. Return an error as a value
        to have it recorded.
        """
        spec = Tool(name, name, {"type": "object"}, replay, fn)
        return self.run_tool(spec, args, call_id=call_id)

    def run_tool(
        self, tool: Tool, args: Mapping[str, Any], *, call_id: str | None = None
    ) -> ToolResult:
        """The next step is ``tool`` (declared with :func:`tool`) on the model's ``args``,
        validated against its schema first; see :meth:`tool_call`."""
        raw = dict(args)
        try:
            tool.parse_input(raw)
        except ToolInputError as exc:
            return ToolResult(str(exc), input_error=True)
        if needs_approval(tool, raw):
            # Your own loop is not parked by the harness: decide before calling the tool.
            raise ToolDefinitionError(
                f"tool {tool.name!r}: this call needs approval, which a custom harness does "
                "not take (the built-in agent does); decide in your loop before the call"
            )
        seq = self._journal.next_seq
        key = ordinal_tool_key(seq, call_id)

        def run(at: int) -> Outcome:
            ctx = ToolContext(self.turn_id, self.session_id, at)
            value = _as_json(tool.invoke(raw, ctx), f"tool {tool.name!r}", ToolDefinitionError)
            return Outcome(value)

        def check(at: int) -> Checked:
            checked = tool.settle(raw, ToolContext(self.turn_id, self.session_id, at))
            if checked.state == "done":  # recorded as the tool's own result would be
                result = _as_json(
                    checked.result, f"the check of {tool.name!r}", ToolDefinitionError
                )
                return replace(checked, result=result)
            return checked

        self._check_open()
        result = self._journal.run(
            kind="tool",
            name=tool.name,
            key=key,
            input=raw,
            call=run,
            replay=tool.replay,
            settle=check if tool.check is not None else None,
            rerun_if_absent=tool.idempotent,
        )
        return ToolResult(
            result.value,
            possibly_ran=result.status is StepStatus.POSSIBLY_RAN,
            replayed=result.replayed,
            seq=result.step.seq,
        )

    def finish(self, reply: str) -> None:
        """Record the turn's final reply and mark it done (fenced by the lease). Leaving
        the ``with`` block normally without it finishes the turn with an empty reply.
        When :attr:`replaying`, checks that ``reply`` is the recorded one instead."""
        self._check_open()
        if self._keeper is None:
            if reply != self.turn.result:
                raise ReplayDivergence(
                    f"turn {self.turn_id}: the replayed reply {reply!r} differs from the "
                    f"recorded one {self.turn.result!r}; the program changed since the turn "
                    "ran, or builds its reply from something the journal does not hold"
                )
        else:
            self._keeper.check()
            self.world.complete_turn(self._keeper.lease, reply)
            if self._journal.events is not None:
                self._journal.events.close()
            try:
                settle_finished(self.world, self.turn_id)  # its log ends with turn.ended
            except WorldError as exc:
                log.warning("turn %s: its event log is settled later (%s)", self.turn_id, exc)
        self._finished = reply

    def _check_open(self) -> None:
        if self._finished is not None:
            raise ConfigError(f"turn {self.turn_id} is finished: start a new turn for more calls")

    def _close(self) -> None:
        if self._finished is None and self._keeper is not None:
            self.finish("")


@contextmanager
def journaled_turn(
    world: World,
    turn_id: str,
    *,
    prompt: str = "",
    session_id: str | None = None,
    force: bool = False,
    lease_seconds: float | None = None,
    on_step: Callable[[StepEvent], None] | None = None,
) -> Iterator[JournaledTurn]:
    """Open (or reopen) turn ``turn_id`` of a custom harness and hold its lease.

    The first run creates the turn (in ``session_id``, or a session of its own named
    after the turn) with ``prompt`` shown by ``durable-harness ls``. A later run with the
    same ``turn_id`` after a crash continues it: it waits for the dead run's lease to run
    out (``force`` takes it at once, fencing out any run still holding it), reads every
    finished step back and follows each interrupted step's replay rule. A run on a turn
    that already finished replays it without a lease: 0 calls, nothing written.

    While the block runs the lease is renewed and every write carries its epoch: two
    processes never both own the turn, and one fenced out gets :class:`LeaseLost` at its
    next step. If the block raises, the turn is released (not failed) with the error,
    for the program to run again; its ``never`` steps in flight come back possibly-ran.
    ``DURABLE_HARNESS_CRASH_AT`` crash points apply to its steps as to any turn's.
    A cancelled turn (``durable-harness cancel``: pending when the run starts, or seen by
    the lease keeper within ``DURABLE_HARNESS_CANCEL_POLL_SECONDS``) begins no further step:
    the next call raises :class:`TurnCancelled` and the turn ends ``cancelled``.
    """
    settings = Settings.load(lease_seconds=lease_seconds)
    turn = _open_turn(world, turn_id, prompt, session_id)
    if turn.status is TurnStatus.DONE:
        replay = Lease(turn_id, turn.session_id, "replay", turn.epoch, turn.attempts, float("inf"))
        yield JournaledTurn(world, turn, Journal(world, replay, replay_only=True), None)
        return
    lease = _claim(world, settings, turn, force)
    cancel = Cancellation()
    pending = world.list_signals(turn_id, CANCEL_SIGNAL)
    if pending:  # cancelled while nobody ran it: no step begins
        cancel.request(pending[0].payload)
    with LeaseKeeper(
        world,
        lease,
        settings.lease_seconds,
        cancel=cancel,
        cancel_poll=settings.cancel_poll_seconds,
    ) as keeper:

        def each_step(event: StepEvent) -> None:
            keeper.check()  # stop before the next call once we know we were fenced out
            if on_step is not None:
                on_step(event)

        events = TurnEvents(world, turn_id, lease.epoch, lease.attempt)
        journal = Journal(
            world,
            lease,
            crash=CrashPlan.from_env(),
            on_step=each_step,
            cancel=cancel,
            events=events,
            budget=Budget.of(world, turn_id, turn.session_id, turn.config, settings),
        )
        recorded = journal.recorded
        events.begin_attempt(default_owner(), [recorded[seq] for seq in sorted(recorded)])
        handle = JournaledTurn(world, world.get_turn(turn_id), journal, keeper)
        try:
            yield handle
            handle._close()
        except LeaseLost:
            raise  # the turn is its new owner's: nothing of ours may touch it
        except TurnCancelled as exc:
            _cancelled(world, keeper.lease, exc.reason)
            raise
        except BudgetExceeded as exc:
            world.fail_turn(keeper.lease, str(exc))  # a run again would stop here again
            raise
        except BaseException as exc:
            _release(world, keeper.lease, exc, events)
            raise
        finally:
            events.close()


def _open_turn(world: World, turn_id: str, prompt: str, session_id: str | None) -> Turn:
    if not isinstance(turn_id, str) or not turn_id.strip():
        raise ConfigError(
            "journaled_turn needs a turn id: a stable name for this piece of work (a job "
            "or task id), the same on every run, so a run after a crash finds the turn"
        )
    try:
        turn = world.get_turn(turn_id)
    except NotFound:
        # Named after the turn, so two first runs racing create one session, one turn.
        session_id = session_id or "ses_" + hashlib.sha256(turn_id.encode()).hexdigest()[:20]
        world.create_session(session_id, {"agent": CUSTOM_AGENT})
        turn = world.create_turn(session_id, turn_id, prompt, {"agent": CUSTOM_AGENT})
        turn_created(world, turn)
    if turn.config.get("agent") != CUSTOM_AGENT:
        raise ConfigError(
            f"turn {turn_id} is a turn of agent {turn.config.get('agent')!r}, not of a custom "
            f"harness: resume it with resume_turn() or `durable-harness resume {turn_id}`"
        )
    if session_id is not None and turn.session_id != session_id:
        raise ConfigError(
            f"turn {turn_id} belongs to session {turn.session_id}, not {session_id}: "
            "pass that session, or choose a new turn id"
        )
    if turn.prompt != prompt:
        raise ReplayDivergence(
            f"turn {turn_id} was started with prompt {turn.prompt!r}, now {prompt!r}; "
            "finish it with the prompt that started it, or choose a new turn id"
        )
    if turn.status is TurnStatus.FAILED:
        raise TurnFailed(
            f"turn {turn_id} failed for good ({turn.error}); start a new turn (a new turn id)"
        )
    if turn.status is TurnStatus.CANCELLED:
        raise TurnCancelled(turn.error or "cancelled")
    return turn


def _claim(world: World, settings: Settings, turn: Turn, force: bool) -> Lease:
    # A parked custom turn waits for this program, not for a timer: take it at once.
    force = force or turn.status is TurnStatus.WAITING
    owner = default_owner()
    lease = claim_for_resume(world, settings, turn.turn_id, owner, force=force, say=log.warning)
    if lease is None:
        ended = world.get_turn(turn.turn_id)
        raise TurnFailed(
            f"turn {turn.turn_id} ended ({ended.status.value}) while this run waited for it"
            + (f": {ended.error}" if ended.error else "; run the program again to replay it")
        )
    return lease


def _cancelled(world: World, lease: Lease, reason: str) -> None:
    try:
        world.cancel_turn(lease, reason)
        settle_finished(world, lease.turn_id)  # turn.ended, as the worker appends it
    except WorldError as failed:
        # The lease lapses; the next run finds the cancel pending and ends the turn then.
        log.warning("could not end cancelled turn %s (%s)", lease.turn_id, failed)


def _release(world: World, lease: Lease, exc: BaseException, events: TurnEvents) -> None:
    message = f"{type(exc).__name__}: {exc}"
    try:
        events.released(message[:2000], 0.0)
        world.release(lease, error=message[:2000])
    except WorldError as failed:
        # The lease lapses by itself and the next run takes the turn then.
        log.warning("could not release turn %s after %s (%s)", lease.turn_id, message, failed)


def _as_json(value: Any, what: str, error: type[DurableHarnessError]) -> Any:
    """``value`` as the JSON it will be read back as, so live and replayed runs agree."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        value = dump(mode="json", exclude_none=True)
    try:
        return json.loads(canonical_json(value))
    except (TypeError, ValueError) as exc:
        raise error(
            f"{what} returned a {type(value).__name__} that is not JSON ({exc}): return a "
            "str, number, bool, None, list or dict (or a pydantic model)"
        ) from exc


def _usage(reply: Any, model: str | None) -> dict[str, Any]:
    """The model and token counts for ``show`` and cost, from an Anthropic, Responses or
    Chat Completions reply (0 for counts the reply does not hold)."""
    return usage_meta(reply, model)
