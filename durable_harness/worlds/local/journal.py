"""The local World's journal: a turn's steps, every write fenced by the lease epoch."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time

from durable_harness.core.errors import NotFound, StepConflict, WorldError
from durable_harness.core.types import Step, StepStatus
from durable_harness.core.world import JournalStore, Outcome
from durable_harness.worlds.local.db import Database, fence, load_turn
from durable_harness.worlds.local.schema import step_from_row


class LocalJournal(JournalStore):
    """The :class:`JournalStore` facet of :class:`~durable_harness.worlds.local.LocalWorld`."""

    _db: Database

    def load_steps(self, turn_id: str) -> list[Step]:
        with self._db.transaction(write=False) as conn:
            load_turn(conn, turn_id)
            rows = conn.execute(
                "SELECT * FROM steps WHERE turn_id = ? ORDER BY seq", (turn_id,)
            ).fetchall()
            return [step_from_row(row) for row in rows]

    def insert_intent(self, step: Step) -> None:
        if step.status != StepStatus.INTENT:
            raise WorldError(f"insert_intent takes a step in status intent, got {step.status}")
        # Its own transaction, committed (and fsynced: synchronous=FULL) before returning.
        with self._db.transaction(write=True) as conn:
            fence(conn, step.turn_id, step.epoch)
            taken = conn.execute(
                "SELECT seq, key FROM steps WHERE turn_id = ? AND (seq = ? OR key = ?)",
                (step.turn_id, step.seq, step.key),
            ).fetchone()
            if taken is not None:
                raise StepConflict(
                    f"turn {step.turn_id}: step seq {step.seq} / key {step.key!r} conflicts "
                    f"with the recorded step seq {taken['seq']} / key {taken['key']!r}"
                )
            row = dataclasses.asdict(step) | {
                "output": None,
                "output_blob": None,
                "finished_at": None,
                "started_at": step.started_at or time.time(),
                "meta": json.dumps(step.meta),
            }
            conn.execute(
                f"INSERT INTO steps ({', '.join(row)}) VALUES ({', '.join(':' + k for k in row)})",
                row,
            )

    def restart_intent(self, turn_id: str, seq: int, epoch: int) -> int:
        with self._db.transaction(write=True) as conn:
            step = _open_intent(conn, turn_id, seq, epoch)
            # started_at stays the first start: a wait's deadline is measured from it.
            conn.execute(
                "UPDATE steps SET attempts = attempts + 1, epoch = ? WHERE turn_id = ? AND seq = ?",
                (epoch, turn_id, seq),
            )
            return step.attempts + 1

    def record_outcome(self, turn_id: str, seq: int, epoch: int, outcome: Outcome) -> None:
        with self._db.transaction(write=True) as conn:
            step = _open_intent(conn, turn_id, seq, epoch)
            conn.execute(
                "UPDATE steps SET status = ?, output = ?, output_blob = ?, epoch = ?,"
                " finished_at = ?, meta = ? WHERE turn_id = ? AND seq = ?",
                (
                    outcome.status,
                    outcome.output,
                    outcome.output_blob,
                    epoch,
                    time.time(),
                    json.dumps({**step.meta, **outcome.meta}),
                    turn_id,
                    seq,
                ),
            )


def _open_intent(conn: sqlite3.Connection, turn_id: str, seq: int, epoch: int) -> Step:
    """Step ``seq``, fenced by ``epoch``; :class:`StepConflict` unless it is an intent."""
    fence(conn, turn_id, epoch)
    row = conn.execute(
        "SELECT * FROM steps WHERE turn_id = ? AND seq = ?", (turn_id, seq)
    ).fetchone()
    if row is None:
        raise NotFound(f"turn {turn_id} has no step {seq}")
    step = step_from_row(row)
    if step.status != StepStatus.INTENT:
        raise StepConflict(f"turn {turn_id}: step {seq} already has an outcome ({step.status})")
    return step
