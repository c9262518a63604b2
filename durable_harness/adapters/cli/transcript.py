"""The :class:`~.cli.spec.RecordCodec` of a CLI whose session record is one file it appends
to (Claude Code's transcript, Pi's session file): saved as records
``<prefix>/<turn>/<epoch>`` by :class:`~.cli.records.TranscriptStore` (delta blobs), found
again by :func:`~.cli.records.latest_turn_transcript`, quoted by
:func:`~.cli.records.resume_message`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from durable_harness.adapters.base import TurnRun
from durable_harness.adapters.cli.agent import wait_for_record
from durable_harness.adapters.cli.records import (
    TranscriptFacts,
    TranscriptStore,
    latest_turn_transcript,
    previous_turn_transcript,
    resume_message,
)
from durable_harness.adapters.cli.spec import BeforeIntent, LaunchContext
from durable_harness.core.fork import load_fork
from durable_harness.core.types import Step
from durable_harness.core.world import World

__all__ = ["TranscriptFile"]


def _no_session(ctx: LaunchContext) -> str | None:
    return None


@dataclass(frozen=True)
class TranscriptFile:
    """One appended file in the launch's HOME (see the module docstring)."""

    key: ClassVar[str] = "transcript"

    #: The file, relative to HOME (``ctx.session`` is set when it is asked).
    path: Callable[[LaunchContext], str]
    #: What the file already tells a resumed CLI.
    facts_of: Callable[[bytes], TranscriptFacts]
    #: The records' name prefix (the agent's: records of Claude Code are ``claude-code/…``).
    record_prefix: str
    #: The CLI's session id, when it is known before the launch (Claude Code's).
    session: Callable[[LaunchContext], str | None] = _no_session
    #: How long (and how often) a save before a tool intent waits for the file to hold
    #: the call: the CLI writes it a little after (or before) the hook runs.
    flush_wait: float = 3.0
    poll: float = 0.02

    def latest(self, run: TurnRun) -> str | None:
        turn, epoch = run.turn, run.journal.lease.epoch
        return latest_turn_transcript(
            run.world, turn.session_id, turn.turn_id, epoch, record_prefix=self.record_prefix
        )

    def previous(self, run: TurnRun) -> str | None:
        prefix = self.record_prefix

        def latest_save(world: World, session_id: str, turn_id: str, epoch: int) -> str | None:
            return latest_turn_transcript(world, session_id, turn_id, epoch, prefix)

        found = previous_turn_transcript(
            run.world, run.turn.session_id, run.turn.index, latest_save
        )
        if found is None:
            # A forked session's first turn continues the record its fork cut.
            fork = load_fork(run.world, run.world, run.turn.session_id)
            found = None if fork is None else fork.record
        return found

    def resume_message(self, run: TurnRun, steps: list[Step], saved: Any) -> str:
        data = self._store(run).load(str(saved))
        return resume_message(run.world, run.turn.prompt, steps, data, facts_of=self.facts_of)

    def prepare(self, ctx: LaunchContext) -> None:
        ctx.session = self.session(ctx)
        if ctx.plan.record:
            ctx.restored[self.path(ctx)] = self._store(ctx.run).load(str(ctx.plan.record))

    def saver(self, ctx: LaunchContext, lock: Any) -> BeforeIntent:
        path = f"{ctx.home}/{self.path(ctx)}"

        def before_intent(reported: str | None, tool_use_id: str) -> None:
            data = wait_for_record(
                lambda: ctx.host.read_file(path) or b"",
                lambda data: tool_use_id.encode() in data,
                self.flush_wait,
                self.poll,
            )
            with lock:
                self._keep(ctx, data)

        return before_intent

    def final(self, ctx: LaunchContext, outcome: dict[str, Any]) -> dict[str, Any]:
        data = ctx.host.read_file(f"{ctx.home}/{self.path(ctx)}") or b""
        return {"transcript": self._keep(ctx, data)}

    def _store(self, run: TurnRun) -> TranscriptStore:
        return TranscriptStore(run.world, record_prefix=self.record_prefix)

    def _keep(self, ctx: LaunchContext, data: bytes) -> str:
        """Save ``data`` as this turn's newest record; its digest."""
        store, turn = self._store(ctx.run), ctx.run.turn
        saved = store.save(data)
        store.point(turn.session_id, turn.turn_id, ctx.run.journal.lease.epoch, saved)
        return saved.digest
