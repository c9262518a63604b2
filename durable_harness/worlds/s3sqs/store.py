"""S3 as a store of JSON documents with compare-and-swap: the S3+SQS World's storage layer.

Package-private (every module of the s3sqs World uses it). It knows four things:

* **the key layout** (:class:`Layout`), one place for every object name;
* **conditional writes**: ``put(..., if_none_match=True)`` creates only if absent,
  ``put(..., if_match=etag)`` replaces only the version that was read; a lost race raises
  :class:`Precondition`. Every document carries a random ``write_id``, so a write whose
  response was lost (and that botocore retried into a 412) is recognised as our own
  on the re-read instead of being reported as someone else's;
* **the start-up checks**: the bucket is there and the credentials work; the server
  honours conditional writes (once per process and bucket);
* **error mapping**: botocore's exceptions become :class:`WorldError` (or
  :class:`ConfigError` for what the user must fix) here and nowhere else.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import quote, unquote

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
)

from durable_harness.core.errors import ConfigError, CorruptJournal, WorldError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_T = TypeVar("_T")
_R = TypeVar("_R")

#: Parallel GETs when a turn's journal or a listing is loaded (one list + parallel gets).
FETCH_THREADS = 16
#: 10**17 microseconds is year 5138: inverted timestamps sort newest first in a listing.
_INVERT_US = 10**17

# Codes with which S3 (and S3-compatible servers) report rejected credentials.
CREDENTIAL_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "403"}
)
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_PRECONDITION_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})


# What to do about an S3 error that can start while a World is open.
_CLIENT_ADVICE = {
    "NoSuchBucket": "; create the bucket or fix DURABLE_HARNESS_S3_BUCKET",
    "AccessDenied": "; the worker needs the S3 permissions listed in docs/s3sqs.md",
    **dict.fromkeys(
        CREDENTIAL_CODES, "; check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
    ),
}

_verified: set[tuple[str, str]] = set()  # (endpoint, bucket) whose conditional writes work
_verified_lock = threading.Lock()


class Precondition(Exception):
    """A conditional write lost: the object exists (If-None-Match) or changed (If-Match).

    Internal: callers re-read and decide; it never leaves the World.
    """


@dataclass(frozen=True)
class Doc:
    """A JSON object as read, with the ETag that a conditional replace must name."""

    data: dict[str, Any]
    etag: str


def new_write_id() -> str:
    return uuid.uuid4().hex


def ident(value: str) -> str:
    """An id as one key segment: percent-encoded, so ``/`` in an id cannot nest keys."""
    return quote(value, safe="")


def inverted_us(timestamp: float) -> str:
    """A fixed-width key part that sorts newest first; :func:`from_inverted_us` reads it."""
    return f"{_INVERT_US - int(timestamp * 1e6):017d}"


def from_inverted_us(part: str) -> int:
    return _INVERT_US - int(part)


def micros(timestamp: float) -> int:
    return int(timestamp * 1e6)


class Layout:
    """Every object name of a World under ``prefix``::

    blobs/<sha256>                        content-addressed payloads
    sessions/<sid>/session.json           the session (created once, If-None-Match)
    sessions/<sid>/records/<name>         a named session record -> blob digest
    sessions/<sid>/turns/<index:010d>     index slot -> turn id (If-None-Match: unique)
    index/sessions/<inverted time>-<sid>  newest-first listing of sessions
    index/turns/<inverted time>-<tid>     newest-first listing of all turns
    turns/<tid>/turn.json                 the turn object: status, lease, epoch (CAS)
    turns/<tid>/steps/<seq:010d>          one journal row (or a void placeholder)
    turns/<tid>/keys/<sha256(key)>        the step key's marker -> seq (uniqueness)
    turns/<tid>/events/<seq:012d>         one event of the turn's log (created in seq order)
    tokens/<token id>                     an API token (its digest, tenant, revoked_at)
    owners/<kind>/<item id>               who owns a session or turn (If-None-Match: once)
    owned/<tenant>/<kind>/<order>         a tenant's items, newest first (tenancy.py)
    rates/<bucket>/<window_s>/<window>    a rate counter: uses in one window (CAS)
    _durable-harness/probe                scratch object of the conditional-write check
    """

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""

    def blob(self, digest: str) -> str:
        return f"{self.prefix}blobs/{digest}"

    def session(self, session_id: str) -> str:
        return f"{self.prefix}sessions/{ident(session_id)}/session.json"

    def record(self, session_id: str, name: str) -> str:
        return f"{self.prefix}sessions/{ident(session_id)}/records/{ident(name)}"

    def slots(self, session_id: str) -> str:
        return f"{self.prefix}sessions/{ident(session_id)}/turns/"

    def slot(self, session_id: str, index: int) -> str:
        return f"{self.slots(session_id)}{index:010d}"

    def sessions_index(self) -> str:
        return f"{self.prefix}index/sessions/"

    def session_entry(self, created_at: float, session_id: str) -> str:
        return f"{self.sessions_index()}{inverted_us(created_at)}-{ident(session_id)}"

    def turns_index(self) -> str:
        return f"{self.prefix}index/turns/"

    def turn_entry(self, created_at: float, turn_id: str) -> str:
        return f"{self.turns_index()}{inverted_us(created_at)}-{ident(turn_id)}"

    def turn(self, turn_id: str) -> str:
        return f"{self.prefix}turns/{ident(turn_id)}/turn.json"

    def steps(self, turn_id: str) -> str:
        return f"{self.prefix}turns/{ident(turn_id)}/steps/"

    def step(self, turn_id: str, seq: int) -> str:
        return f"{self.steps(turn_id)}{seq:010d}"

    def key_marker(self, turn_id: str, key_digest: str) -> str:
        return f"{self.prefix}turns/{ident(turn_id)}/keys/{key_digest}"

    def signal(self, turn_id: str, name: str, index: int = 0) -> str:
        """The first signal of a name keeps the key older Worlds gave the only one; the
        later ones go below it (``ident`` encodes a ``/`` in a name, so keys cannot clash)."""
        first = f"{self.prefix}turns/{ident(turn_id)}/signals/{ident(name)}"
        return first if index == 0 else f"{first}/{index:010d}"

    def watch(self, scope: str, turn_id: str = "", name: str = "") -> str:
        """A webhook watch; without a turn, the prefix of every watch of ``scope``."""
        base = f"{self.prefix}watches/{ident(scope)}/"
        return f"{base}{ident(turn_id)}/{ident(name)}" if turn_id else base

    def events(self, turn_id: str) -> str:
        return f"{self.prefix}turns/{ident(turn_id)}/events/"

    def event(self, turn_id: str, seq: int) -> str:
        return f"{self.events(turn_id)}{seq:012d}"

    def tokens(self) -> str:
        return f"{self.prefix}tokens/"

    def token(self, token_id: str) -> str:
        return f"{self.tokens()}{ident(token_id)}"

    def owner(self, kind: str, item_id: str) -> str:
        return f"{self.prefix}owners/{ident(kind)}/{ident(item_id)}"

    def owned(self, tenant: str, kind: str) -> str:
        return f"{self.prefix}owned/{ident(tenant)}/{ident(kind)}/"

    def rate(self, bucket: str, window_s: float, window: int) -> str:
        return f"{self.prefix}rates/{ident(bucket)}/{float(window_s)!r}/{window}"

    def probe(self) -> str:
        return f"{self.prefix}_durable-harness/probe"


def parse_entry(entry: str) -> tuple[int, str]:
    """``<inverted time>-<id>`` (the last key segment of an index entry) -> (micros, id)."""
    stamp, _, quoted = entry.rpartition("/")[2].partition("-")
    return from_inverted_us(stamp), unquote(quoted)


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def raise_mapped(what: str, exc: Exception, endpoint: str) -> NoReturn:
    """Map a botocore error to the project's tree (the one place that does it for S3)."""
    if isinstance(exc, NoCredentialsError):
        raise ConfigError(
            "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE) for the s3sqs World"
        ) from exc
    if isinstance(exc, NoRegionError):
        raise ConfigError("no AWS region set: set AWS_REGION for the s3sqs World") from exc
    if isinstance(exc, EndpointConnectionError):
        raise WorldError(
            f"cannot reach S3 at {endpoint} ({what}): {exc}; check AWS_ENDPOINT_URL"
        ) from exc
    if isinstance(exc, ClientError):
        code = error_code(exc) or http_status(exc)
        raise WorldError(
            f"S3 {what} failed: {code}: {exc}{_CLIENT_ADVICE.get(str(code), '')}"
        ) from exc
    raise WorldError(f"S3 {what} failed: {type(exc).__name__}: {exc}") from exc


class S3Store:
    """JSON documents and raw bytes in one bucket, with conditional writes. Thread-safe."""

    def __init__(self, client: S3Client, bucket: str, layout: Layout) -> None:
        self.client = client
        self.bucket = bucket
        self.layout = layout
        self.endpoint = str(client.meta.endpoint_url)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._pool_pid = os.getpid()

    # -- reads -----------------------------------------------------------------------
    def get_bytes(self, key: str) -> tuple[bytes, str] | None:
        """(body, ETag), or ``None`` when the object does not exist."""
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
            return response["Body"].read(), str(response["ETag"])
        except ClientError as exc:
            if error_code(exc) in _MISSING_CODES or http_status(exc) == 404:
                return None
            raise_mapped(f"GET {key}", exc, self.endpoint)
        except BotoCoreError as exc:
            raise_mapped(f"GET {key}", exc, self.endpoint)

    def get(self, key: str) -> Doc | None:
        """The JSON object at ``key``; :class:`CorruptJournal` if it is not one."""
        found = self.get_bytes(key)
        if found is None:
            return None
        body, etag = found
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise CorruptJournal(f"s3://{self.bucket}/{key} is not valid JSON") from exc
        if not isinstance(data, dict):
            raise CorruptJournal(f"s3://{self.bucket}/{key} is not a JSON object")
        return Doc(data, etag)

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as exc:
            if error_code(exc) in _MISSING_CODES or http_status(exc) == 404:
                return False
            raise_mapped(f"HEAD {key}", exc, self.endpoint)
        except BotoCoreError as exc:
            raise_mapped(f"HEAD {key}", exc, self.endpoint)

    def list_keys(self, prefix: str, start_after: str = "", page: int = 1000) -> Iterator[str]:
        """Keys under ``prefix`` in ascending order, page by page (S3 lists are consistent)."""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": page}
            if token:
                kwargs["ContinuationToken"] = token
            elif start_after:
                kwargs["StartAfter"] = start_after
            try:
                response = self.client.list_objects_v2(**kwargs)
            except (ClientError, BotoCoreError) as exc:
                raise_mapped(f"LIST {prefix}", exc, self.endpoint)
            for item in response.get("Contents", []):
                yield str(item["Key"])
            if not response.get("IsTruncated"):
                return
            token = response.get("NextContinuationToken")

    # -- writes ----------------------------------------------------------------------
    def put_bytes(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        """Write ``body``; return the new ETag. :class:`Precondition` if the condition failed."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": body}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        try:
            return str(self.client.put_object(**kwargs)["ETag"])
        except ClientError as exc:
            code, status = error_code(exc), http_status(exc)
            if code in _PRECONDITION_CODES or status in (409, 412):
                raise Precondition(key) from exc
            if if_match is not None and (code in _MISSING_CODES or status == 404):
                raise Precondition(key) from exc  # replaced-if-unchanged, but it is gone
            raise_mapped(f"PUT {key}", exc, self.endpoint)
        except BotoCoreError as exc:
            raise_mapped(f"PUT {key}", exc, self.endpoint)

    def put(
        self,
        key: str,
        data: dict[str, Any],
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> Doc:
        """Write a JSON document (stamped with a fresh ``write_id``) conditionally.

        A :class:`Precondition` is re-checked: when the stored document carries our
        ``write_id``, the write did land (its response was lost and the retry hit the
        condition) and the call succeeds.
        """
        stamped = {**data, "write_id": new_write_id()}
        body = json.dumps(stamped, separators=(",", ":")).encode()
        try:
            etag = self.put_bytes(key, body, if_none_match=if_none_match, if_match=if_match)
        except Precondition:
            current = self.get(key)
            if current is not None and current.data.get("write_id") == stamped["write_id"]:
                return current
            raise
        return Doc(stamped, etag)

    def update(
        self, key: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> Doc | None:
        """Compare-and-swap loop: read, ``change(data)``, replace if unchanged, else again.

        ``change`` returns the new document, or ``None`` to write nothing (then the read
        document is returned); it may raise to abort. ``None`` if the object is absent.
        """
        while True:
            current = self.get(key)
            if current is None:
                return None
            new = change(dict(current.data))
            if new is None:
                return current
            try:
                return self.put(key, new, if_match=current.etag)
            except Precondition:
                continue

    # -- start-up checks -------------------------------------------------------------
    def check_bucket(self) -> None:
        """The bucket exists and can be listed with these credentials; else ConfigError."""
        where = f"S3 bucket {self.bucket!r} at {self.endpoint}"
        try:
            self.client.list_objects_v2(Bucket=self.bucket, MaxKeys=1, Prefix=self.layout.probe())
        except ClientError as exc:
            code = error_code(exc)
            if code == "NoSuchBucket":
                raise ConfigError(
                    f"{where} does not exist: create it or fix DURABLE_HARNESS_S3_BUCKET"
                ) from exc
            if code in CREDENTIAL_CODES:
                raise ConfigError(
                    f"{where}: the AWS credentials were rejected ({code}); check "
                    "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
                ) from exc
            if code in ("AccessDenied", "AllAccessDisabled"):
                raise ConfigError(
                    f"{where}: access denied ({code}); the worker needs the S3 permissions "
                    "listed in docs/s3sqs.md"
                ) from exc
            raise_mapped(f"ListObjectsV2 on {self.bucket}", exc, self.endpoint)
        except BotoCoreError as exc:
            raise_mapped(f"ListObjectsV2 on {self.bucket}", exc, self.endpoint)

    def check_conditional_writes(self, cached: bool) -> None:
        """Refuse an S3 server that ignores If-None-Match or If-Match on PutObject: the
        journal's uniqueness and fencing rest on them. One put and two that must fail."""
        ident = (self.endpoint, self.bucket)
        if cached and ident in _verified:
            return
        key = self.layout.probe()
        self.put_bytes(key, b"durable-harness conditional-write probe")
        wrong = '"0123456789abcdef0123456789abcdef"'
        for header, if_none_match, if_match in (
            ("If-None-Match: *", True, None),
            ("If-Match: <wrong ETag>", False, wrong),
        ):
            try:
                self.put_bytes(key, b"", if_none_match=if_none_match, if_match=if_match)
            except Precondition:
                continue
            raise ConfigError(
                f"the S3 server at {self.endpoint} ignores conditional writes (a PUT "
                f"with {header} on an existing object succeeded); the s3sqs World needs them "
                "to fence workers: use AWS S3 or a server that implements them"
            )
        with _verified_lock:
            _verified.add(ident)

    # -- parallel fetches ------------------------------------------------------------
    def map(self, fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
        """``[fn(x) for x in items]`` with up to :data:`FETCH_THREADS` requests in flight."""
        batch = list(items)
        if len(batch) <= 1:
            return [fn(item) for item in batch]
        return list(self._executor().map(fn, batch))

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None or self._pool_pid != os.getpid():
                # A pool's threads do not survive fork(): a child makes its own.
                self._pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="s3-get")
                self._pool_pid = os.getpid()
            return self._pool

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None and self._pool_pid == os.getpid():
                self._pool.shutdown(wait=True)
            self._pool = None
