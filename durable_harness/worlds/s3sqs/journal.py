"""The S3+SQS World's journal: one S3 object per step, fenced without a transaction.

Package-private; the package's docstring explains the whole consistency design.
The rules this module keeps:

* A step row ``turns/<tid>/steps/<seq>`` is created only with ``If-None-Match: *`` (seq
  unique) after its key marker ``turns/<tid>/keys/<sha256(key)>`` names that seq (key
  unique). It carries ``fence``: the highest lease epoch that has claimed it.
* A write by epoch ``e`` to an existing row reads the row (and its ETag) first, then the
  turn object (status ``running`` at epoch ``e``), checks ``fence <= e``, and replaces the
  row with ``If-Match`` on that ETag.
* Taking over a turn (``seal``) raises ``fence`` of every open row to the new epoch with
  ``If-Match`` before the new lease is handed out, so a zombie's pending ``If-Match``
  fails and its next read sees a fence above its epoch.
* ``insert_intent`` reads the turn object again after the row is durable: the caller runs
  the call only if its epoch was still current after the intent became visible to any
  later takeover.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from typing import Any

from durable_harness.core.errors import (
    CorruptJournal,
    LeaseLost,
    NotFound,
    StepConflict,
    WorldError,
)
from durable_harness.core.types import Step, StepStatus, TurnStatus
from durable_harness.core.world import Outcome
from durable_harness.worlds.s3sqs.store import Doc, Precondition, S3Store

_STEP_FIELDS = (
    "turn_id",
    "seq",
    "key",
    "kind",
    "name",
    "input_hash",
    "input",
    "status",
    "output",
    "output_blob",
    "attempts",
    "epoch",
    "started_at",
    "finished_at",
    "meta",
)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def step_to_json(step: Step, fence: int) -> dict[str, Any]:
    data: dict[str, Any] = {name: getattr(step, name) for name in _STEP_FIELDS}
    data["status"] = str(step.status)
    data["fence"] = fence
    return data


def step_from_json(data: dict[str, Any], where: str) -> Step:
    try:
        fields = {name: data[name] for name in _STEP_FIELDS}
        fields["status"] = StepStatus(data["status"])
        if not isinstance(fields["meta"], dict):
            raise TypeError("meta is not an object")
        for name in ("seq", "attempts", "epoch"):
            fields[name] = int(fields[name])
        return Step(**fields)
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptJournal(f"{where}: cannot decode the stored row ({exc})") from exc


def is_void(doc: Doc | None) -> bool:
    return doc is not None and bool(doc.data.get("void"))


def fence_of(doc: Doc) -> int:
    return int(doc.data.get("fence", doc.data.get("epoch", 0)))


#: Rows this process wrote last, kept so an outcome needs no GET of its intent.
ROW_CACHE = 256


class S3Journal:
    """Journal operations over an :class:`S3Store`; thread-safe."""

    def __init__(self, store: S3Store) -> None:
        self.store = store
        self.layout = store.layout
        # (turn, seq) -> the row as this process last wrote it. Using it in place of a GET
        # keeps the order the fencing needs (row read, then turn read): our write came
        # before the turn read; and a row changed since makes the If-Match fail, after
        # which the row is read again.
        self._written: dict[tuple[str, int], Doc] = {}
        self._lock = threading.Lock()

    def _remember(self, turn_id: str, seq: int, doc: Doc) -> None:
        with self._lock:
            self._written[(turn_id, seq)] = doc
            while len(self._written) > ROW_CACHE:
                del self._written[next(iter(self._written))]

    def _recall(self, turn_id: str, seq: int) -> Doc | None:
        with self._lock:
            return self._written.pop((turn_id, seq), None)

    # -- fencing ---------------------------------------------------------------------
    def fence(self, turn_id: str, epoch: int) -> Doc:
        """The turn object; :class:`LeaseLost` unless it is running at ``epoch``."""
        turn = self.store.get(self.layout.turn(turn_id))
        if turn is None:
            raise NotFound(f"no turn {turn_id!r}")
        status, current = turn.data.get("status"), turn.data.get("epoch")
        if current != epoch or status != TurnStatus.RUNNING:
            raise LeaseLost(
                f"turn {turn_id}: a write with lease epoch {epoch} was refused; the turn is "
                f"{status} at epoch {current} (another worker took it over)"
            )
        return turn

    def seal(self, turn_id: str, epoch: int) -> None:
        """Raise the fence of every open row to ``epoch`` (a takeover, before its lease)."""

        def seal_one(key: str) -> None:
            while True:
                row = self.store.get(key)
                if row is None or fence_of(row) >= epoch:
                    return
                if not is_void(row) and row.data.get("status") != StepStatus.INTENT:
                    return  # an outcome is final: nobody may write it again anyway
                try:
                    self.store.put(key, {**row.data, "fence": epoch}, if_match=row.etag)
                    return
                except Precondition:
                    continue

        self.store.map(seal_one, list(self.store.list_keys(self.layout.steps(turn_id))))

    # -- reads -----------------------------------------------------------------------
    def load(self, turn_id: str) -> list[Step]:
        keys = list(self.store.list_keys(self.layout.steps(turn_id)))
        if not keys and self.store.get(self.layout.turn(turn_id)) is None:
            raise NotFound(f"no turn {turn_id!r}")
        steps = []
        for key, doc in zip(keys, self.store.map(self.store.get, keys), strict=True):
            if doc is None or is_void(doc):
                continue
            steps.append(step_from_json(doc.data, f"turn {turn_id} step {key.rsplit('/', 1)[1]}"))
        return sorted(steps, key=lambda s: s.seq)

    # -- writes ----------------------------------------------------------------------
    def insert_intent(self, step: Step) -> None:
        if step.status != StepStatus.INTENT:
            raise WorldError(f"insert_intent takes a step in status intent, got {step.status}")
        self.fence(step.turn_id, step.epoch)
        self._claim_key(step)
        row = step_to_json(
            dataclasses.replace(step, started_at=step.started_at or time.time()), step.epoch
        )
        self._create_row(step, row)
        # The intent is durable now. Read the epoch again: if a takeover happened while we
        # wrote, refuse before the call runs (the row stays, as an interrupted intent).
        self.fence(step.turn_id, step.epoch)

    def _claim_key(self, step: Step) -> None:
        """Make the key marker name ``step.seq``; :class:`StepConflict` if a row has the key."""
        marker_key = self.layout.key_marker(step.turn_id, key_digest(step.key))
        marker = {"seq": step.seq, "epoch": step.epoch, "key": step.key}
        while True:
            try:
                self.store.put(marker_key, marker, if_none_match=True)
                return
            except Precondition:
                pass
            current = self.store.get(marker_key)
            if current is None:
                continue
            seq = int(current.data.get("seq", -1))
            if seq == step.seq:
                return  # the same seq: the row's If-None-Match decides who records it
            row_key = self.layout.step(step.turn_id, seq)
            row = self.store.get(row_key)
            if row is not None and not is_void(row) and row.data.get("key") == step.key:
                raise StepConflict(
                    f"turn {step.turn_id}: step seq {step.seq} / key {step.key!r} conflicts "
                    f"with the recorded step seq {seq} / key {step.key!r}"
                )
            if row is None:
                if int(current.data.get("epoch", 0)) >= step.epoch:
                    # Our own lease is between that marker and its row: never race it.
                    raise StepConflict(
                        f"turn {step.turn_id}: key {step.key!r} is being recorded at seq {seq}"
                    )
                # The marker's writer was fenced out between its marker and its row. Void
                # the seq it named first, so that row can never appear beside ours.
                try:
                    self.store.put(row_key, {"void": True, "fence": step.epoch}, if_none_match=True)
                except Precondition:
                    continue  # the row appeared meanwhile: look at it again
            # The marker is stale (its seq holds another key's row, or a void): take it.
            try:
                self.store.put(marker_key, marker, if_match=current.etag)
                return
            except Precondition:
                continue

    def _create_row(self, step: Step, row: dict[str, Any]) -> None:
        key = self.layout.step(step.turn_id, step.seq)
        while True:
            try:
                self._remember(step.turn_id, step.seq, self.store.put(key, row, if_none_match=True))
                return
            except Precondition:
                pass
            current = self.store.get(key)
            if current is None:
                continue
            if is_void(current):
                if fence_of(current) > step.epoch:
                    raise LeaseLost(
                        f"turn {step.turn_id}: seq {step.seq} was voided by lease epoch "
                        f"{fence_of(current)}; this write carried epoch {step.epoch}"
                    )
                try:
                    doc = self.store.put(key, row, if_match=current.etag)
                    self._remember(step.turn_id, step.seq, doc)
                    return
                except Precondition:
                    continue
            raise StepConflict(
                f"turn {step.turn_id}: step seq {step.seq} / key {step.key!r} conflicts with "
                f"the recorded step seq {step.seq} / key {current.data.get('key')!r}"
            )

    def _open_row(
        self, turn_id: str, seq: int, epoch: int, cached: bool = False
    ) -> tuple[Doc, Step]:
        """The row of an open intent that ``epoch`` may write, and its ETag.

        The row is read *before* the turn object: a takeover that bumped the epoch after
        our turn read seals the row after our row read, so our If-Match then fails.
        ``cached``: the row as this process last wrote it, if it has it, in place of a GET.
        """
        row = self._recall(turn_id, seq) if cached else None
        row = row or self.store.get(self.layout.step(turn_id, seq))
        self.fence(turn_id, epoch)
        if row is None or is_void(row):
            raise NotFound(f"turn {turn_id} has no step {seq}")
        if fence_of(row) > epoch:
            raise LeaseLost(
                f"turn {turn_id}: step {seq} was taken over by lease epoch {fence_of(row)}; "
                f"this write carried epoch {epoch}"
            )
        step = step_from_json(row.data, f"turn {turn_id} step {seq}")
        if step.status != StepStatus.INTENT:
            raise StepConflict(f"turn {turn_id}: step {seq} already has an outcome ({step.status})")
        return row, step

    def restart_intent(self, turn_id: str, seq: int, epoch: int) -> int:
        while True:
            row, step = self._open_row(turn_id, seq, epoch)
            data = {
                **row.data,
                "attempts": step.attempts + 1,
                "epoch": epoch,
                "fence": epoch,  # started_at stays the first start (waits' deadlines)
            }
            try:
                doc = self.store.put(self.layout.step(turn_id, seq), data, if_match=row.etag)
                self._remember(turn_id, seq, doc)
                return step.attempts + 1
            except Precondition:
                continue

    def finish(self, turn_id: str, seq: int, epoch: int, outcome: Outcome) -> None:
        cached = True
        while True:
            row, step = self._open_row(turn_id, seq, epoch, cached)
            cached = False
            data = {
                **row.data,
                "status": str(outcome.status),
                "output": outcome.output,
                "output_blob": outcome.output_blob,
                "epoch": epoch,
                "fence": epoch,
                "finished_at": time.time(),
                # Merged, not replaced: what the intent recorded stays visible to `show`.
                "meta": {**step.meta, **outcome.meta},
            }
            try:
                self.store.put(self.layout.step(turn_id, seq), data, if_match=row.etag)
                return
            except Precondition:
                continue
