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
  a signal is an object created with If-None-Match at the next free index (the first
  of a name keeps the key older Worlds used; a claim is a CAS on it); a wake-up
  sends a fresh message. ``suspend`` reads the signal after its CAS and ``send_signal``
  reads the turn after storing the signal, so one of them sees the other.
* **Fencing the journal** (:mod:`.journal`): a step row is created with
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

* **The event log** (:mod:`.events`): one object per event, created with
  ``If-None-Match: *`` at the next seq by a writer that knows every earlier one, so the
  log has no gap and a key once. **Tenancy** (:mod:`.tenancy`): tokens, owners and rate
  counters, each one object written conditionally.

The queue, leases and waits are :mod:`.queue`; the blobs, sessions and turns
:mod:`.catalog`; the steps :mod:`.journal`; the events :mod:`.events`; tokens, owners
and rates :mod:`.tenancy`; all write through :mod:`.store` (the bucket's layout and
conditional writes) and wake turns through :mod:`.sqs`.

Claim order follows SQS's delivery order (strict on moto, best effort on a standard
queue). Each process checks once, at start, that the S3 server honours conditional
writes, and refuses to run on one that does not. Open the World after ``fork()``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any, ClassVar
from urllib.parse import parse_qs, unquote, urlparse

import boto3
from botocore.config import Config

from durable_harness.core.errors import ConfigError
from durable_harness.core.settings import (
    WorldSettings,
    refuse_unknown_options,
    take_max_attempts,
)
from durable_harness.core.types import (
    UNFINISHED,
    ApiToken,
    Check,
    Event,
    Session,
    Step,
    Turn,
)
from durable_harness.core.world import Outcome, World
from durable_harness.worlds.s3sqs.catalog import S3Catalog, turn_from_doc
from durable_harness.worlds.s3sqs.events import S3EventLog
from durable_harness.worlds.s3sqs.journal import S3Journal
from durable_harness.worlds.s3sqs.queue import S3SqsQueue
from durable_harness.worlds.s3sqs.sqs import SqsQueue
from durable_harness.worlds.s3sqs.store import FETCH_THREADS, Layout, S3Store
from durable_harness.worlds.s3sqs.tenancy import S3Tenancy

__all__ = ["S3SqsSettings", "S3SqsWorld"]

_QUEUE_REGION = re.compile(r"sqs[.-]([a-z0-9-]+)\.amazonaws\.com")


class S3SqsSettings(WorldSettings):
    """The bucket and the queue: ``DURABLE_HARNESS_S3_BUCKET``,
    ``DURABLE_HARNESS_SQS_QUEUE_URL``."""

    s3_bucket: str | None = None
    sqs_queue_url: str | None = None

    def world_options(self) -> dict[str, Any]:
        given = {"bucket": self.s3_bucket, "queue_url": self.sqs_queue_url}
        return {k: v for k, v in given.items() if v is not None}


class S3SqsWorld(S3SqsQueue, World):
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
        self._events = S3EventLog(self._store, self._journal)
        self._tenancy = S3Tenancy(self._store, self.now)
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

    # -- blobs, sessions and turns: catalog.py ----------------------------------------
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

    # -- journal -------------------------------------------------------------------
    def load_steps(self, turn_id: str) -> list[Step]:
        return self._journal.load(turn_id)

    def insert_intent(self, step: Step) -> None:
        self._journal.insert_intent(step)

    def restart_intent(self, turn_id: str, seq: int, epoch: int) -> int:
        return self._journal.restart_intent(turn_id, seq, epoch)

    def record_outcome(self, turn_id: str, seq: int, epoch: int, outcome: Outcome) -> None:
        self._journal.finish(turn_id, seq, epoch, outcome)

    # -- the event log: events.py ----------------------------------------------------
    def append_event(
        self,
        turn_id: str,
        key: str,
        kind: str,
        data: dict[str, Any],
        epoch: int | None = None,
    ) -> Event:
        return self._events.append(turn_id, key, kind, data, epoch)

    def read_events(self, turn_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        return self._events.read(turn_id, after, limit)

    def wait_for_events(self, timeout: float) -> None:
        """Sleeps ``timeout`` (the default): S3 tells nobody that an object appeared, and
        a reader's next ``read_events`` is one LIST, so ``serve`` polls at its own pace."""
        time.sleep(timeout)

    # -- tenancy: tenancy.py -------------------------------------------------------
    def put_token(self, token: ApiToken) -> None:
        self._tenancy.put_token(token)

    def get_token(self, token_id: str) -> ApiToken:
        return self._tenancy.get_token(token_id)

    def list_tokens(self) -> list[ApiToken]:
        return self._tenancy.list_tokens()

    def revoke_token(self, token_id: str, at: float) -> ApiToken:
        return self._tenancy.revoke_token(token_id, at)

    def put_owner(self, kind: str, item_id: str, tenant: str, created_at: float) -> None:
        self._tenancy.put_owner(kind, item_id, tenant, created_at)

    def get_owner(self, kind: str, item_id: str) -> str | None:
        return self._tenancy.get_owner(kind, item_id)

    def list_owned(
        self,
        tenant: str,
        kind: str,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[tuple[float, str]]:
        return self._tenancy.list_owned(tenant, kind, limit, before)

    def take_rate(self, bucket: str, limit: int, window_s: float) -> bool:
        return self._tenancy.take_rate(bucket, limit, window_s)


def _check(name: str, run: Callable[[], object], detail: str) -> Check:
    try:
        run()
        return Check(name, True, detail)
    except Exception as exc:
        return Check(name, False, f"{type(exc).__name__}: {exc}")
