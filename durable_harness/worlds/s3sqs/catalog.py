"""The S3+SQS World's catalog: blobs, sessions, turns and their listings, in S3.

Package-private (:mod:`.queue` holds the queue and leases, :mod:`.journal` the steps).
Everything here is written once with ``If-None-Match: *`` or is a plain overwrite of a
pointer (session records); listings read index objects whose keys sort in the order the
World promises, and skip entries that a lost race or a crash left behind (an entry counts
only if the object it names agrees with it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from durable_harness.core.errors import CorruptJournal, NotFound, WorldError
from durable_harness.core.types import Session, Turn, TurnStatus
from durable_harness.core.world import Signal
from durable_harness.worlds.s3sqs.store import Doc, Precondition, S3Store, micros, parse_entry

_DIGEST = re.compile(r"[0-9a-f]{64}")
TURN_FIELDS = [f.name for f in dataclasses.fields(Turn)]
_REQUIRED_TURN_FIELDS = [
    f.name
    for f in dataclasses.fields(Turn)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
]
_clock_lock = threading.Lock()
_last_stamp = 0.0


def stamp() -> float:
    """``time.time()``, strictly increasing in this process (orders the listings)."""
    global _last_stamp
    with _clock_lock:
        _last_stamp = max(time.time(), _last_stamp + 1e-6)
        return _last_stamp


def turn_from_doc(doc: Doc) -> Turn:
    try:
        fields = {name: doc.data[name] for name in _REQUIRED_TURN_FIELDS}
        # Fields added to Turn later have defaults: an older turn object lacks them.
        fields |= {name: doc.data[name] for name in TURN_FIELDS if name in doc.data}
        fields["status"] = TurnStatus(fields["status"])
        if not isinstance(fields["config"], dict):
            raise TypeError("config is not an object")
        return Turn(**fields)
    except (KeyError, ValueError, TypeError) as exc:
        where = doc.data.get("turn_id", "?")
        raise CorruptJournal(f"turn {where}: cannot decode the turn object ({exc})") from exc


def session_from_doc(doc: Doc) -> Session:
    try:
        data = doc.data
        meta = data["meta"]
        if not isinstance(meta, dict):
            raise TypeError("meta is not an object")
        return Session(session_id=data["session_id"], created_at=data["created_at"], meta=meta)
    except (KeyError, TypeError) as exc:
        raise CorruptJournal(f"cannot decode a session object ({exc})") from exc


class S3Catalog:
    """Blobs, sessions, turns (creation, reads, listings) and session records."""

    def __init__(self, store: S3Store, send_wake: Callable[[str, str, str], None]) -> None:
        self.store = store
        self.layout = store.layout
        self.bucket = store.bucket
        self._send_wake = send_wake  # (turn_id, session_id, token): the turn's SQS message

    # -- blobs ---------------------------------------------------------------------
    def put_blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        key = self.layout.blob(digest)
        if len(data) > 1 << 20 and self.store.exists(key):
            return digest  # do not upload a large payload only to hear it is there
        with contextlib.suppress(Precondition):  # content-addressed: what is there is data
            self.store.put_bytes(key, data, if_none_match=True)
        return digest

    def get_blob(self, digest: str) -> bytes:
        if not _DIGEST.fullmatch(digest):
            raise NotFound(f"no blob {digest!r}: not a sha256 hex digest")
        found = self.store.get_bytes(self.layout.blob(digest))
        if found is None:
            raise NotFound(f"no blob {digest} in s3://{self.bucket}")
        if hashlib.sha256(found[0]).hexdigest() != digest:
            raise CorruptJournal(f"blob {digest} in s3://{self.bucket} does not match its digest")
        return found[0]

    # -- sessions and turns ----------------------------------------------------------
    def create_session(self, session_id: str, meta: dict[str, Any] | None = None) -> Session:
        existing = self.store.get(self.layout.session(session_id))
        if existing is None:
            now = stamp()
            # The listing entry first: a session that exists is always listed (an entry
            # whose session lost the race below is skipped by list_sessions).
            self.store.put_bytes(self.layout.session_entry(now, session_id), b"")
            data = {"session_id": session_id, "created_at": now, "meta": meta or {}}
            try:
                existing = self.store.put(self.layout.session(session_id), data, if_none_match=True)
            except Precondition:
                existing = self.store.get(self.layout.session(session_id))
        if existing is None:
            raise WorldError(f"session {session_id!r} vanished while being created")
        return session_from_doc(existing)

    def get_session(self, session_id: str) -> Session:
        doc = self.store.get(self.layout.session(session_id))
        if doc is None:
            raise NotFound(f"no session {session_id!r}")
        return session_from_doc(doc)

    def list_sessions(self, limit: int = 100) -> list[Session]:
        def fetch(entry: str) -> Session | None:
            stamp, session_id = parse_entry(entry)
            doc = self.store.get(self.layout.session(session_id))
            session = None if doc is None else session_from_doc(doc)
            return session if session and micros(session.created_at) == stamp else None

        return self._listed(self.store.list_keys(self.layout.sessions_index()), fetch, limit)

    def create_turn(
        self, session_id: str, turn_id: str, prompt: str, config: dict[str, Any]
    ) -> Turn:
        self.get_session(session_id)
        existing = self.store.get(self.layout.turn(turn_id))
        if existing is None:
            index = self._take_slot(session_id, turn_id)
            token = uuid.uuid4().hex
            # Message first: a crash below leaves a stray message, never a silent turn.
            self._send_wake(turn_id, session_id, token)
            now = stamp()
            self.store.put_bytes(self.layout.turn_entry(now, turn_id), b"")
            data = {
                **{name: None for name in TURN_FIELDS},
                "turn_id": turn_id,
                "session_id": session_id,
                "index": index,
                "prompt": prompt,
                "status": str(TurnStatus.QUEUED),
                "config": config,
                "created_at": now,
                "attempts": 0,
                "epoch": 0,
                "visible_at": now,
                "wake": token,
                "receipt": None,
            }
            try:
                doc = self.store.put(self.layout.turn(turn_id), data, if_none_match=True)
                return turn_from_doc(doc)
            except Precondition:
                existing = self.store.get(self.layout.turn(turn_id))
                if existing is None:
                    raise WorldError(f"turn {turn_id!r} vanished while being created") from None
        turn = turn_from_doc(existing)
        # A retried create (the caller died after it) gets the same turn back; reusing the
        # id for different work is a bug worth stopping.
        if turn.session_id == session_id and turn.prompt == prompt:
            return turn
        raise WorldError(f"turn id {turn_id!r} is already used by another turn")

    def _take_slot(self, session_id: str, turn_id: str) -> int:
        """The session's next index, made ours by creating its slot with If-None-Match."""
        slots = list(self.store.list_keys(self.layout.slots(session_id)))
        index = int(slots[-1].rsplit("/", 1)[1]) + 1 if slots else 0
        while True:
            try:
                slot = self.layout.slot(session_id, index)
                self.store.put(slot, {"turn_id": turn_id}, if_none_match=True)
                return index
            except Precondition:
                index += 1

    def get_turn(self, turn_id: str) -> Turn:
        return turn_from_doc(self.turn_doc(turn_id))

    def list_turns(self, session_id: str | None = None, limit: int = 100) -> list[Turn]:
        if session_id is None:
            return self._listed(
                self.store.list_keys(self.layout.turns_index()), self._by_time, limit
            )

        def by_slot(slot: str) -> Turn | None:
            # A slot names a turn only if the turn agrees (a crashed or lost create_turn
            # can leave a slot that names nothing, or a turn that took another slot).
            doc = self.store.get(slot)
            turn_doc = doc and self.store.get(self.layout.turn(str(doc.data.get("turn_id"))))
            turn = turn_from_doc(turn_doc) if turn_doc else None
            ok = turn and turn.session_id == session_id and turn.index == int(slot[-10:])
            return turn if ok else None

        return self._listed(self.store.list_keys(self.layout.slots(session_id)), by_slot, limit)

    def first_turn(self, match: Callable[[Turn], bool]) -> Turn | None:
        """The newest turn ``match`` holds for, reading the index a page at a time and
        stopping there (``None`` after reading every turn)."""

        def fetch(entry: str) -> Turn | None:
            turn = self._by_time(entry)
            return turn if turn is not None and match(turn) else None

        found = self._listed(self.store.list_keys(self.layout.turns_index()), fetch, 1)
        return found[0] if found else None

    def _by_time(self, entry: str) -> Turn | None:
        """The turn an entry of the time index names, if the turn agrees with it."""
        stamp, turn_id = parse_entry(entry)
        doc = self.store.get(self.layout.turn(turn_id))
        turn = None if doc is None else turn_from_doc(doc)
        return turn if turn and micros(turn.created_at) == stamp else None

    def _listed(self, keys: Iterator[str], fetch: Callable[[str], Any], limit: int) -> list[Any]:
        """The first ``limit`` non-``None`` ``fetch(key)``, fetched a page at a time."""
        found: list[Any] = []
        seen: set[str] = set()
        while len(found) < limit:
            page = [key for _, key in zip(range(max(limit - len(found), 8)), keys, strict=False)]
            if not page:
                break
            for item in self.store.map(fetch, page):
                name = str(getattr(item, "turn_id", None) or getattr(item, "session_id", ""))
                if item is not None and name not in seen and len(found) < limit:
                    seen.add(name)
                    found.append(item)
        return found

    def put_session_record(self, session_id: str, name: str, digest: str) -> None:
        self.get_session(session_id)
        self.store.put(self.layout.record(session_id, name), {"digest": digest})

    def get_session_record(self, session_id: str, name: str) -> str | None:
        doc = self.store.get(self.layout.record(session_id, name))
        return None if doc is None else str(doc.data["digest"])

    def put_signal(self, turn_id: str, name: str, payload: str, delivery: str) -> bool:
        """Append the signal at the next free index; ``False`` if a signal of that name
        already carries ``delivery``. Two senders racing for one index: one create wins
        (If-None-Match), the other reads the winner and goes on from there, so the same
        delivery sent twice at once is stored once."""
        found = self.signal_docs(turn_id, name)
        while True:
            if any(doc.get("delivery_id", "legacy") == delivery for doc in found):
                return False
            data = {"payload": payload, "received_at": time.time(), "delivery_id": delivery}
            try:
                key = self.layout.signal(turn_id, name, len(found))
                self.store.put(key, data, if_none_match=True)
                return True
            except Precondition:
                found = self.signal_docs(turn_id, name)

    def signal_docs(self, turn_id: str, name: str) -> list[dict[str, Any]]:
        """The signals of a name, in order (the first, then the ones listed below it)."""
        first = self.store.get(self.layout.signal(turn_id, name))
        if first is None:
            return []
        later = self.store.list_keys(self.layout.signal(turn_id, name) + "/")
        docs = [first.data] + [d.data for d in self.store.map(self.store.get, list(later)) if d]
        return docs

    def list_signals(self, turn_id: str, name: str) -> list[Signal]:
        return [
            Signal(i, str(d["payload"]), str(d.get("delivery_id", "legacy")), d.get("claimed_by"))
            for i, d in enumerate(self.signal_docs(turn_id, name))
        ]

    def claim_signal(self, turn_id: str, name: str, index: int, seq: int) -> bool:
        def take(data: dict[str, Any]) -> dict[str, Any] | None:
            return None if data.get("claimed_by") is not None else {**data, "claimed_by": seq}

        doc = self.store.update(self.layout.signal(turn_id, name, index), take)
        return doc is not None and doc.data.get("claimed_by") == seq

    def watch(self, scope: str, ref: str, turn_id: str, name: str) -> None:
        self.turn_doc(turn_id)
        data = {"turn_id": turn_id, "name": name, "ref": ref}
        self.store.put(self.layout.watch(scope, turn_id, name), data)

    def watchers(self, scope: str, ref: str) -> list[tuple[str, str]]:
        """Reads every watch of the repository: a handful (one per turn and name)."""
        keys = list(self.store.list_keys(self.layout.watch(scope)))
        docs = [d for d in self.store.map(self.store.get, keys) if d is not None]
        found = {
            (str(d.data["turn_id"]), str(d.data["name"])) for d in docs if d.data["ref"] == ref
        }
        return sorted(found)

    def turn_doc(self, turn_id: str) -> Doc:
        doc = self.store.get(self.layout.turn(turn_id))
        if doc is None:
            raise NotFound(f"no turn {turn_id!r}")
        return doc
