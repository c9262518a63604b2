"""The S3+SQS World's queue, leases and waits: CAS on the turn object, wake-ups on SQS.

The package docstring explains the design (the turn object is the truth, SQS the
wake-up); this is its ``claim`` loop, the takeover that seals the journal, the fenced
lease writes and the dead-letter backstop.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

from durable_harness.core.errors import LeaseLost, NotFound
from durable_harness.core.types import (
    FINISHED,
    Lease,
    TurnStatus,
)
from durable_harness.core.world import Queue, Signal, delivery_key
from durable_harness.worlds.s3sqs.catalog import S3Catalog
from durable_harness.worlds.s3sqs.journal import S3Journal
from durable_harness.worlds.s3sqs.sqs import Message, SqsQueue
from durable_harness.worlds.s3sqs.store import Doc, Layout, Precondition, S3Store

#: A message whose turn object does not exist yet may belong to a create_turn in flight.
ORPHAN_GRACE = 60.0
ORPHAN_RECHECK = 5.0
#: Messages one claim looks at before it gives up for now (all leased or delayed).
MAX_RECEIVES_PER_CLAIM = 32
#: How often a World looks into the dead-letter queue (from claim).
DEAD_LETTER_POLL = 5.0
#: Never delivered again: done, failed (unless a manual ``enqueue`` retries it), cancelled.
_FINISHED = tuple(FINISHED)
_PARKED = (TurnStatus.QUEUED, TurnStatus.WAITING)  # no lease: deliverable at visible_at


def _exhausted(data: dict[str, Any], max_attempts: int) -> bool:
    """Would one more delivery pass ``max_attempts`` (counted since the last suspend)?"""
    return bool(data["attempts"] - data.get("attempt_floor", 0) + 1 > max_attempts)


def _deliverable(data: dict[str, Any], now: float) -> bool:
    if data["status"] in _PARKED:
        return data.get("visible_at") is not None and data["visible_at"] <= now
    expires = data.get("lease_expires_at")
    return data["status"] == TurnStatus.RUNNING and expires is not None and expires <= now


class S3SqsQueue(Queue):
    """The :class:`Queue` facet of :class:`~durable_harness.worlds.s3sqs.S3SqsWorld`."""

    max_attempts: int
    _store: S3Store
    _layout: Layout
    _journal: S3Journal
    _queue: SqsQueue
    _catalog: S3Catalog
    _next_dead_letter_poll: float

    # -- queue and leases ------------------------------------------------------------
    def enqueue(self, turn_id: str, delay: float = 0.0) -> None:
        # running: the lease holder has it; done or cancelled: nothing is left to deliver
        self._wake(turn_id, (*_PARKED, TurnStatus.FAILED), delay)

    def _wake(self, turn_id: str, statuses: tuple[TurnStatus, ...], delay: float) -> None:
        """Make a turn in one of ``statuses`` deliverable after ``delay``, with a new message
        (its old one may be hidden for hours, under a receipt handle nobody has)."""
        doc = self._catalog.turn_doc(turn_id)
        if doc.data["status"] not in statuses:
            return
        token = uuid.uuid4().hex
        # The new message first, then the turn object names it: the old one (if any) is
        # deleted by its next receiver, so a turn keeps exactly one live message.
        self._queue.send(turn_id, doc.data["session_id"], token, delay)

        def wake(data: dict[str, Any]) -> dict[str, Any] | None:
            visible = {"visible_at": time.time() + delay, "wake": token, "receipt": None}
            if data["status"] in _PARKED and data["status"] in statuses:
                return {**data, **visible}
            if data["status"] == TurnStatus.FAILED and data["status"] in statuses:
                # A manual retry of a failed turn: it gets a fresh delivery budget.
                status = str(TurnStatus.QUEUED)
                return {**data, **visible, "status": status, "attempts": 0, "finished_at": None}
            return None

        self._store.update(self._layout.turn(turn_id), wake)

    def claim(self, owner: str, lease_seconds: float) -> Lease | None:
        self._drain_dead_letters()
        seen: set[str] = set()
        for _ in range(MAX_RECEIVES_PER_CLAIM):
            messages = self._queue.receive(hide_seconds=lease_seconds)
            if not messages:
                return None
            message = messages[0]
            lease = self._handle(message, owner, lease_seconds)
            if lease is not None or message.message_id in seen:
                # Around again: every visible message is leased or delayed for now.
                return lease
            seen.add(message.message_id)
        return None

    def _handle(self, message: Message, owner: str, lease_seconds: float) -> Lease | None:
        """Act on one received message as its turn object says; take the turn if it can."""
        while True:
            doc = self._store.get(self._layout.turn(message.turn_id))
            now = time.time()
            if doc is None:
                if now - message.sent_at > ORPHAN_GRACE:
                    self._queue.delete(message.receipt)  # its create_turn died before the turn
                else:
                    self._queue.hide(message.receipt, ORPHAN_RECHECK)
                return None
            data = doc.data
            if data.get("wake") != message.token or data["status"] in _FINISHED:
                self._queue.delete(message.receipt)
                return None
            if not _deliverable(data, now):
                until = data.get("visible_at") or data.get("lease_expires_at") or now
                if self._worn(message):
                    # Each hide-again is a receive: before the redrive policy takes a healthy
                    # turn's message (a long wait, a long lease), replace it by a fresh one.
                    token = uuid.uuid4().hex
                    self._queue.send(message.turn_id, message.session_id, token, until - now)
                    try:
                        fresh = {**data, "wake": token, "receipt": None}
                        self._store.put(
                            self._layout.turn(message.turn_id), fresh, if_match=doc.etag
                        )
                    except Precondition:
                        continue
                    self._queue.delete(message.receipt)
                    return None
                # Hide first, then hand the receipt to the lease holder: a release that
                # reads the receipt after this CAS moves the message after our hide.
                self._queue.hide(message.receipt, until - now)
                if data.get("receipt") == message.receipt:
                    return None
                try:
                    self._store.put(
                        self._layout.turn(message.turn_id),
                        {**data, "receipt": message.receipt},
                        if_match=doc.etag,
                    )
                    return None
                except Precondition:
                    continue
            if _exhausted(data, self.max_attempts):
                if self._dead_letter(doc, now):
                    self._queue.delete(message.receipt)
                    return None
                continue
            lease = self._take(doc, owner, lease_seconds, now, message.receipt)
            if lease is None:
                continue
            self._queue.hide(message.receipt, lease_seconds)
            return lease

    def claim_turn(
        self, turn_id: str, owner: str, lease_seconds: float, force: bool = False
    ) -> Lease | None:
        while True:
            doc = self._catalog.turn_doc(turn_id)
            now = time.time()
            if doc.data["status"] in _FINISHED:
                return None
            if not (_deliverable(doc.data, now) or force):
                return None
            if _exhausted(doc.data, self.max_attempts):
                if self._dead_letter(doc, now):
                    self._queue.delete(doc.data.get("receipt"))
                    return None
                continue
            receipt = doc.data.get("receipt") or ""
            lease = self._take(doc, owner, lease_seconds, now, receipt)
            if lease is not None:
                self._queue.hide(receipt, lease_seconds)  # the message follows our lease
                return lease

    def _worn(self, message: Message) -> bool:
        limit = self._queue.max_receive_count
        return limit is not None and message.receives >= max(2, limit // 2)

    def _take(
        self, doc: Doc, owner: str, lease_seconds: float, now: float, receipt: str
    ) -> Lease | None:
        """CAS the lease into the turn object, then seal its journal; ``None`` if it lost."""
        data = doc.data
        expires_at = now + lease_seconds
        taken = {
            **data,
            "status": str(TurnStatus.RUNNING),
            "attempts": data["attempts"] + 1,
            "epoch": data["epoch"] + 1,
            "lease_owner": owner,
            "lease_expires_at": expires_at,
            "visible_at": expires_at,
            "waiting_for": None,
            "receipt": receipt or data.get("receipt"),
        }
        try:
            self._store.put(self._layout.turn(data["turn_id"]), taken, if_match=doc.etag)
        except Precondition:
            return None
        if data["epoch"] > 0:
            # Before anyone can act on the new lease, freeze the journal for older epochs.
            self._journal.seal(data["turn_id"], taken["epoch"])
        return Lease(
            turn_id=data["turn_id"],
            session_id=data["session_id"],
            owner=owner,
            epoch=taken["epoch"],
            attempt=taken["attempts"],
            expires_at=expires_at,
            receipt=receipt,
        )

    def _dead_letter(self, doc: Doc, now: float, reason: str | None = None) -> bool:
        """Mark the turn failed (epoch bumped: its zombie is fenced out); False if it lost."""
        data = doc.data
        if reason is None:
            reason = f"dead-lettered after {data['attempts']} deliveries"
        failed = {
            **data,
            "status": str(TurnStatus.FAILED),
            "error": f"{reason}; last error: {data.get('error') or 'lease expired (worker died?)'}",
            "epoch": data["epoch"] + 1,
            "visible_at": None,
            "lease_owner": None,
            "lease_expires_at": None,
            "finished_at": now,
        }
        try:
            self._store.put(self._layout.turn(data["turn_id"]), failed, if_match=doc.etag)
            return True
        except Precondition:
            return False

    def _drain_dead_letters(self) -> None:
        """Fail the turns whose messages the redrive policy moved to the dead-letter queue."""
        if self._queue.dead_letter_url is None or time.monotonic() < self._next_dead_letter_poll:
            return
        self._next_dead_letter_poll = time.monotonic() + DEAD_LETTER_POLL
        for message in self._queue.receive(hide_seconds=30.0, dead_letters=True):
            while True:
                doc = self._store.get(self._layout.turn(message.turn_id))
                if doc is None or doc.data.get("wake") != message.token:
                    break
                if doc.data["status"] in _FINISHED:
                    break
                reason = (
                    f"dead-lettered by SQS after {message.receives} receives (redrive "
                    f"maxReceiveCount {self._queue.max_receive_count})"
                )
                if self._dead_letter(doc, time.time(), reason):
                    break
            self._queue.delete_dead_letter(message.receipt)

    def _fenced(self, lease: Lease, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Doc:
        """CAS the turn object with ``change``, only while ``lease`` is its current one."""

        def guarded(data: dict[str, Any]) -> dict[str, Any]:
            if data["epoch"] != lease.epoch or data["status"] != TurnStatus.RUNNING:
                raise LeaseLost(
                    f"turn {lease.turn_id}: a write with lease epoch {lease.epoch} was "
                    f"refused; the turn is {data['status']} at epoch {data['epoch']} "
                    "(another worker took it over)"
                )
            return change(data)

        doc = self._store.update(self._layout.turn(lease.turn_id), guarded)
        if doc is None:
            raise NotFound(f"no turn {lease.turn_id!r}")
        return doc

    def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        expires_at = time.time() + lease_seconds
        doc = self._fenced(
            lease, lambda d: {**d, "lease_expires_at": expires_at, "visible_at": expires_at}
        )
        self._queue.hide(doc.data.get("receipt"), lease_seconds)
        return dataclasses.replace(lease, expires_at=expires_at)

    def release(self, lease: Lease, delay: float = 0.0, error: str | None = None) -> None:
        def queued(data: dict[str, Any]) -> dict[str, Any]:
            return {
                **data,
                "status": str(TurnStatus.QUEUED),
                "visible_at": time.time() + delay,
                "lease_owner": None,
                "lease_expires_at": None,
                "error": error if error is not None else data.get("error"),
            }

        doc = self._fenced(lease, queued)
        self._queue.hide(doc.data.get("receipt"), delay)

    # -- durable waits -------------------------------------------------------------
    def suspend(
        self,
        lease: Lease,
        wake_at: float,
        waiting_for: str,
        signal: str | None = None,
        seen: int = 0,
    ) -> None:
        def parked(data: dict[str, Any]) -> dict[str, Any]:
            return {
                **data,
                "status": str(TurnStatus.WAITING),
                "visible_at": wake_at,
                "lease_owner": None,
                "lease_expires_at": None,
                "waiting_for": waiting_for,
                # Deliberate: the deliveries so far do not count toward max_attempts.
                "attempt_floor": data["attempts"],
            }

        doc = self._fenced(lease, parked)
        # Read after the suspend is visible: a signal that arrived before it found the turn
        # running and woke nothing, so it wakes the turn now.
        if signal is not None and len(self._catalog.signal_docs(lease.turn_id, signal)) > seen:
            self._wake(lease.turn_id, (TurnStatus.WAITING,), 0.0)
        else:
            self._queue.hide(doc.data.get("receipt"), wake_at - time.time())

    def send_signal(
        self, turn_id: str, name: str, payload: str, delivery_id: str | None = None
    ) -> bool:
        self._catalog.turn_doc(turn_id)
        inserted = self._catalog.put_signal(
            turn_id, name, payload, delivery_key(payload, delivery_id)
        )
        self._wake(turn_id, (TurnStatus.WAITING,), 0.0)
        return inserted

    def list_signals(self, turn_id: str, name: str) -> list[Signal]:
        return self._catalog.list_signals(turn_id, name)

    def claim_signal(self, turn_id: str, name: str, index: int, seq: int) -> bool:
        return self._catalog.claim_signal(turn_id, name, index, seq)

    def watch(self, scope: str, ref: str, turn_id: str, name: str) -> None:
        self._catalog.watch(scope, ref, turn_id, name)

    def watchers(self, scope: str, ref: str) -> list[tuple[str, str]]:
        return self._catalog.watchers(scope, ref)

    def end_turn(
        self, lease: Lease, status: TurnStatus, result: str | None, error: str | None
    ) -> None:
        def finished(data: dict[str, Any]) -> dict[str, Any]:
            return {
                **data,
                "status": str(status),
                "result": result if result is not None else data.get("result"),
                "error": error if error is not None else data.get("error"),
                "finished_at": time.time(),
                "visible_at": None,
                "lease_owner": None,
                "lease_expires_at": None,
            }

        doc = self._fenced(lease, finished)
        self._queue.delete(doc.data.get("receipt"))
