"""The S3+SQS World: journal, turns and blobs in an S3 bucket; wake-ups on an SQS queue.

Configuration: ``DURABLE_HARNESS_WORLD=s3sqs``, ``DURABLE_HARNESS_S3_BUCKET``,
``DURABLE_HARNESS_SQS_QUEUE_URL`` and the standard AWS variables (``AWS_REGION``,
credentials or a profile, ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL_SQS`` for other servers). ``docs/s3sqs.md`` lists the IAM permissions.

Consistency design (S3 has compare-and-swap on one object and no transaction):

* **The turn object is the truth.** ``turns/<tid>/turn.json`` holds status, epoch, lease
  owner and expiry, attempts, ``visible_at``, result and error, and is only ever replaced
  with ``If-Match`` on the ETag that was read (a CAS, retried after a re-read on 412).
  Claims, renewals, releases, completions and dead-lettering are each one CAS, so the
  contract's queue rules (one holder, epoch and attempt bumps, ``max_attempts``) hold
  exactly as in the local World, whatever SQS does.
* **SQS is the wake-up, not the lock.** A turn has one current message (its ``token`` is
  named by the turn object as ``wake``; any other message for the turn is deleted when
  received). A receiver reads the turn object: deliverable -> CAS the lease in and hide the
  message for the lease (the visibility timeout is the lease; renewals extend both);
  leased or delayed -> hide it until then and record its receipt handle in the turn
  object, so whoever holds the lease can extend or delete it; finished -> delete it.
  ``claim_turn`` works on the turn object alone. Messages are sent *before* the turn
  object names them, so a crash leaves a stray message (deleted on receipt), never a turn
  without one. SQS counts whole seconds: waits under a second round to 0 (the message
  comes early and is hidden again), longer ones round up (never early).
* **Attempts** live in the turn object; SQS's ApproximateReceiveCount also counts
  receives that only hid a message again. The queue's redrive policy is the backstop for
  a message nobody can handle: ``claim`` drains the dead-letter queue and marks each such
  turn failed with the reason. Set its ``maxReceiveCount`` well above ``max_attempts``.
  A message received only to be hidden again half that many times is replaced by a fresh
  one, so the backstop never takes a healthy turn (a long wait, a long lease).
* **Waits**: ``suspend`` parks the turn object and hides the message until the wake-up;
  a signal is an object created with If-None-Match (the first payload wins); a wake-up
  sends a fresh message. ``suspend`` reads the signal after its CAS and ``send_signal``
  reads the turn after storing the signal, so one of them sees the other.
* **Fencing the journal** (``_s3_journal.py``): a step row is created with
  ``If-None-Match: *`` (seq unique; a key marker makes the key unique) after checking the
  turn object's epoch, and the epoch is read again once the row is durable: the call runs
  only if no takeover started before its intent became visible. Outcomes and restarts
  read the row, then the turn object, check the row's ``fence`` and replace the row with
  ``If-Match``. Taking over a turn *seals* it before the new lease is handed out: every
  open row's fence is raised to the new epoch with ``If-Match``, so a zombie's pending
  outcome fails and its next read sees the fence.
* **Remaining windows**, none of which lets two leases both run a call or record a
  different outcome for one step: (1) a zombie's outcome may land between the takeover's
  epoch CAS and the seal of that row; it is then recorded before the new owner gets its
  lease, and is the call's real outcome. (2) A zombie's intent may land after the seal;
  its re-read then refuses the call, and the new owner sees an interrupted intent (a
  ``never`` tool is reported "possibly ran" although it did not). (3) Leases are compared
  with each worker's clock: keep clocks in sync (a skewed clock shortens a lease; the
  fencing keeps the journal correct, the turn just changes hands early).

Claim order follows SQS's delivery order (strict on moto, best effort on a standard
queue). Each process checks once, at start, that the S3 server honours conditional
writes, and refuses to run on one that does not. Open the World after ``fork()``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar
from urllib.parse import parse_qs, unquote, urlparse

import boto3
from botocore.config import Config

from durable_harness.core.errors import ConfigError, LeaseLost, NotFound
from durable_harness.core.settings import (
    WorldSettings,
    refuse_unknown_options,
    take_max_attempts,
)
from durable_harness.core.types import (
    UNFINISHED,
    Check,
    Lease,
    Session,
    Step,
    Turn,
    TurnStatus,
)
from durable_harness.core.world import Outcome, World
from durable_harness.worlds._s3_catalog import S3Catalog, turn_from_doc
from durable_harness.worlds._s3_journal import S3Journal
from durable_harness.worlds._s3_store import FETCH_THREADS, Doc, Layout, Precondition, S3Store
from durable_harness.worlds._sqs_queue import Message, SqsQueue

#: A message whose turn object does not exist yet may belong to a create_turn in flight.
ORPHAN_GRACE = 60.0
ORPHAN_RECHECK = 5.0
#: Messages one claim looks at before it gives up for now (all leased or delayed).
MAX_RECEIVES_PER_CLAIM = 32
#: How often a World looks into the dead-letter queue (from claim).
DEAD_LETTER_POLL = 5.0
_QUEUE_REGION = re.compile(r"sqs[.-]([a-z0-9-]+)\.amazonaws\.com")
_FINISHED = (TurnStatus.DONE, TurnStatus.FAILED)
_PARKED = (TurnStatus.QUEUED, TurnStatus.WAITING)  # no lease: deliverable at visible_at


def _exhausted(data: dict[str, Any], max_attempts: int) -> bool:
    """Would one more delivery pass ``max_attempts`` (counted since the last suspend)?"""
    return bool(data["attempts"] - data.get("attempt_floor", 0) + 1 > max_attempts)


def _deliverable(data: dict[str, Any], now: float) -> bool:
    if data["status"] in _PARKED:
        return data.get("visible_at") is not None and data["visible_at"] <= now
    expires = data.get("lease_expires_at")
    return data["status"] == TurnStatus.RUNNING and expires is not None and expires <= now


class S3SqsSettings(WorldSettings):
    """The bucket and the queue: ``DURABLE_HARNESS_S3_BUCKET``,
    ``DURABLE_HARNESS_SQS_QUEUE_URL``."""

    s3_bucket: str | None = None
    sqs_queue_url: str | None = None

    def world_options(self) -> dict[str, Any]:
        given = {"bucket": self.s3_bucket, "queue_url": self.sqs_queue_url}
        return {k: v for k, v in given.items() if v is not None}


class S3SqsWorld(World):
    """A World in an S3 bucket and an SQS queue; see the module docstring for the design."""

    settings_model: ClassVar[type[WorldSettings]] = S3SqsSettings

    @classmethod
    def from_options(cls, **options: Any) -> S3SqsWorld:
        """``bucket`` and ``queue_url`` (or a URL ``s3sqs://BUCKET[/PREFIX]?queue=QUEUE_URL``
        as ``url``), ``max_attempts``, ``prefix`` (a key prefix, to share a bucket)."""
        url = options.pop("url", None)
        if url is not None:
            parsed = urlparse(url)
            query = parse_qs(parsed.query)
            options.setdefault("bucket", parsed.netloc or None)
            options.setdefault("prefix", unquote(parsed.path).strip("/"))
            if "queue" in query:
                options.setdefault("queue_url", query["queue"][0])
        bucket, queue_url = options.pop("bucket", None), options.pop("queue_url", None)
        if not bucket:
            raise ConfigError("the s3sqs World needs a bucket: set DURABLE_HARNESS_S3_BUCKET")
        if not queue_url:
            raise ConfigError("the s3sqs World needs a queue: set DURABLE_HARNESS_SQS_QUEUE_URL")
        max_attempts = take_max_attempts("s3sqs", options)
        prefix = str(options.pop("prefix", "") or "")
        refuse_unknown_options("s3sqs", options)
        return cls(str(bucket), str(queue_url), max_attempts=max_attempts, prefix=prefix)

    def __init__(
        self, bucket: str, queue_url: str, max_attempts: int = 5, prefix: str = ""
    ) -> None:
        self.max_attempts = max_attempts
        session = boto3.session.Session()
        region = os.environ.get("AWS_REGION") or session.region_name
        if not region:
            found = _QUEUE_REGION.search(queue_url)
            if found is None:
                raise ConfigError("no AWS region set: set AWS_REGION for the s3sqs World")
            region = found.group(1)
        config = Config(
            retries={"mode": "standard", "max_attempts": 4},
            max_pool_connections=FETCH_THREADS + 8,
            connect_timeout=5,
            read_timeout=30,
        )
        self._s3 = session.client("s3", region_name=region, config=config)
        self._sqs = session.client("sqs", region_name=region, config=config)
        self.bucket = bucket
        self._store = S3Store(self._s3, bucket, Layout(prefix))
        self._layout = self._store.layout
        self._journal = S3Journal(self._store)
        self._queue = SqsQueue(self._sqs, queue_url)
        self._catalog = S3Catalog(self._store, self._queue.send)
        self._next_dead_letter_poll = 0.0
        self._store.check_bucket()
        self._queue.check()
        self._store.check_conditional_writes(cached=True)

    # -- start-up checks -------------------------------------------------------------
    def doctor(self) -> list[Check]:
        checks = [
            _check("s3 bucket and credentials", self._store.check_bucket, f"s3://{self.bucket}"),
            _check("sqs queue", self._queue.check, self._queue.url),
            _check(
                "conditional writes",
                lambda: self._store.check_conditional_writes(cached=False),
                "If-None-Match and If-Match honoured",
            ),
        ]
        if self._queue.dead_letter_url is None:
            detail = "none: a message nobody can handle is retried until it expires"
        else:
            detail = (
                f"to {self._queue.dead_letter_url} after {self._queue.max_receive_count} "
                f"receives (max_attempts {self.max_attempts})"
            )
        checks.append(Check("redrive policy", True, detail))
        return checks + super().doctor()

    def close(self) -> None:
        self._store.close()
        self._s3.close()
        self._sqs.close()

    # -- blobs, sessions and turns: _s3_catalog.py -----------------------------------
    def put_blob(self, data: bytes) -> str:
        return self._catalog.put_blob(data)

    def get_blob(self, digest: str) -> bytes:
        return self._catalog.get_blob(digest)

    def create_session(self, session_id: str, meta: dict[str, Any] | None = None) -> Session:
        return self._catalog.create_session(session_id, meta)

    def get_session(self, session_id: str) -> Session:
        return self._catalog.get_session(session_id)

    def list_sessions(self, limit: int = 100) -> list[Session]:
        return self._catalog.list_sessions(limit)

    def create_turn(
        self, session_id: str, turn_id: str, prompt: str, config: dict[str, Any]
    ) -> Turn:
        return self._catalog.create_turn(session_id, turn_id, prompt, config)

    def get_turn(self, turn_id: str) -> Turn:
        return turn_from_doc(self._catalog.turn_doc(turn_id))

    def list_turns(self, session_id: str | None = None, limit: int = 100) -> list[Turn]:
        return self._catalog.list_turns(session_id, limit)

    def has_unfinished_turns(self) -> bool:
        # Newest first, stopping at the first: an unfinished turn is usually a recent one.
        return self._catalog.first_turn(lambda t: t.status in UNFINISHED) is not None

    def put_session_record(self, session_id: str, name: str, digest: str) -> None:
        self._catalog.put_session_record(session_id, name, digest)

    def get_session_record(self, session_id: str, name: str) -> str | None:
        return self._catalog.get_session_record(session_id, name)

    # -- queue and leases ------------------------------------------------------------
    def enqueue(self, turn_id: str, delay: float = 0.0) -> None:
        # running: the lease holder has it; done: nothing is left to deliver
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
        self, lease: Lease, wake_at: float, waiting_for: str, signal: str | None = None
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
        if signal is not None and self._catalog.get_signal(lease.turn_id, signal) is not None:
            self._wake(lease.turn_id, (TurnStatus.WAITING,), 0.0)
        else:
            self._queue.hide(doc.data.get("receipt"), wake_at - time.time())

    def send_signal(self, turn_id: str, name: str, payload: str) -> bool:
        self._catalog.turn_doc(turn_id)
        inserted = self._catalog.put_signal(turn_id, name, payload)
        self._wake(turn_id, (TurnStatus.WAITING,), 0.0)
        return inserted

    def get_signal(self, turn_id: str, name: str) -> str | None:
        return self._catalog.get_signal(turn_id, name)

    def complete_turn(self, lease: Lease, result: str) -> None:
        self._finish_turn(lease, TurnStatus.DONE, result=result, error=None)

    def fail_turn(self, lease: Lease, error: str) -> None:
        self._finish_turn(lease, TurnStatus.FAILED, result=None, error=error)

    def _finish_turn(
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

    # -- journal -------------------------------------------------------------------
    def load_steps(self, turn_id: str) -> list[Step]:
        return self._journal.load(turn_id)

    def insert_intent(self, step: Step) -> None:
        self._journal.insert_intent(step)

    def restart_intent(self, turn_id: str, seq: int, epoch: int) -> int:
        return self._journal.restart_intent(turn_id, seq, epoch)

    def record_outcome(self, turn_id: str, seq: int, epoch: int, outcome: Outcome) -> None:
        self._journal.finish(turn_id, seq, epoch, outcome)


def _check(name: str, run: Callable[[], object], detail: str) -> Check:
    try:
        run()
        return Check(name, True, detail)
    except Exception as exc:
        return Check(name, False, f"{type(exc).__name__}: {exc}")
