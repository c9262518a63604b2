"""The PostgreSQL World's journal: each write one fenced autocommit statement."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from durable_harness.core.errors import (
    NotFound,
    StepConflict,
    WorldError,
)
from durable_harness.core.types import Step, StepStatus
from durable_harness.core.world import JournalStore, Outcome
from durable_harness.worlds.postgres import connections as db
from durable_harness.worlds.postgres import sql
from durable_harness.worlds.postgres.connections import PostgresConnections

# What jsonb cannot hold (it refuses the escapes \u0000 and of a lone surrogate, where a
# text column holds the canonical JSON of outputs and inputs, escapes and all).
_NOT_JSONB = re.compile("[\x00\ud800-\udfff]")


def jsonb_meta(meta: dict[str, Any]) -> Jsonb:
    """A step's metadata as jsonb. Metadata is for ``show`` and our own digests, never
    replayed as a result; a NUL or lone surrogate in it (a model's odd message id) becomes
    U+FFFD rather than making the step unrecordable."""
    return Jsonb(meta, dumps=lambda value: json.dumps(_storable(value)))


def _storable(value: Any) -> Any:
    if isinstance(value, str):
        return _NOT_JSONB.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(v) for v in value]
    return value


class PostgresJournal(PostgresConnections, JournalStore):
    """The journal facet of :class:`~durable_harness.worlds.postgres.PostgresWorld`."""

    def load_steps(self, turn_id: str) -> list[Step]:
        rows = self._run("load_steps", lambda c, _: db.all_rows(c, sql.LOAD_STEPS, (turn_id,)))
        if not rows:
            raise NotFound(f"no turn {turn_id!r}")
        return [sql.step_of(row) for row in rows if row["seq"] is not None]

    def insert_intent(self, step: Step) -> None:
        if step.status != StepStatus.INTENT:
            raise WorldError(f"insert_intent takes a step in status intent, got {step.status}")
        params = {
            "turn_id": step.turn_id,
            "seq": step.seq,
            "key": step.key,
            "kind": step.kind,
            "name": step.name,
            "input_hash": step.input_hash,
            "input": step.input,
            "attempts": step.attempts,
            "epoch": step.epoch,
            "started_at": step.started_at or time.time(),
            "meta": jsonb_meta(step.meta),
        }

        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            if db.one_row(conn, sql.INSERT_INTENT, params) is not None:
                return
            fence = db.one_row(conn, sql.FENCE, (step.turn_id, step.epoch))
            if fence is None:
                raise self._fence_error(conn, step.turn_id, step.epoch)
            taken = db.one_row(conn, sql.CONFLICTING_STEP, (step.turn_id, step.seq, step.key))
            if taken is None:  # the conflicting row vanished: impossible, steps are kept
                raise WorldError(f"turn {step.turn_id}: step {step.seq} was not recorded")
            if retried and all(
                taken[k] == params[k] for k in ("seq", "key", "kind", "name", "input_hash", "epoch")
            ):
                # The connection died after the first try committed: the row is ours. While
                # we hold this epoch (just checked) nobody else writes it, and a row from an
                # earlier epoch would carry that epoch. Without a retry the same row is a
                # caller inserting one step twice: a bug to report, below.
                return
            raise StepConflict(
                f"turn {step.turn_id}: step seq {step.seq} / key {step.key!r} conflicts "
                f"with the recorded step seq {taken['seq']} / key {taken['key']!r}"
            )

        self._run("insert_intent", op)

    def restart_intent(self, turn_id: str, seq: int, epoch: int) -> int:
        # started_at stays the first start: a wait's deadline is measured from it.
        params = {"turn_id": turn_id, "seq": seq, "epoch": epoch}

        # Not made exact on retry: if the first try committed, attempts counts one more
        # run than happened (it only informs `show`; it never decides anything).
        def op(conn: psycopg.Connection[Any], retried: bool) -> int:
            row = db.one_row(conn, sql.RESTART_INTENT, params)
            if row is not None:
                return int(row["attempts"])
            raise self._step_write_error(conn, turn_id, seq, epoch)

        return self._run("restart_intent", op)

    def record_outcome(self, turn_id: str, seq: int, epoch: int, outcome: Outcome) -> None:
        params = {
            "turn_id": turn_id,
            "seq": seq,
            "epoch": epoch,
            "status": outcome.status.value,
            "output": outcome.output,
            "output_blob": outcome.output_blob,
            # merged into the intent's meta: what it recorded stays
            "meta": jsonb_meta(outcome.meta),
            "now": time.time(),
        }

        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            if db.one_row(conn, sql.FINISH_STEP, params) is not None:
                return
            if retried:
                row = db.one_row(conn, sql.GET_STEP, (turn_id, seq))
                if row is not None and all(
                    row[k] == params[k] for k in ("status", "output", "output_blob", "epoch")
                ):
                    return  # the first try committed; only its reply was lost
            raise self._step_write_error(conn, turn_id, seq, epoch)

        self._run("finish_step", op)

    def _step_write_error(
        self, conn: psycopg.Connection[Any], turn_id: str, seq: int, epoch: int
    ) -> Exception:
        """Why a fenced write of step ``seq`` matched no row, checked in the local World's
        order: the lease, then the step's existence, then its status."""
        if db.one_row(conn, sql.FENCE, (turn_id, epoch)) is None:
            return self._fence_error(conn, turn_id, epoch)
        row = db.one_row(conn, sql.GET_STEP, (turn_id, seq))
        if row is None:
            return NotFound(f"turn {turn_id} has no step {seq}")
        return StepConflict(f"turn {turn_id}: step {seq} already has an outcome ({row['status']})")
