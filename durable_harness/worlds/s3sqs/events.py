"""The S3+SQS World's event log: one object per event, created in seq order.

Package-private; the package's docstring explains the consistency design as a whole.
``turns/<tid>/events/<seq:012d>`` holds one event (seq, key, kind, data, at, epoch). The
rules this module keeps, without a transaction:

* **No gap, no reordering.** Event ``n + 1`` is created (``If-None-Match: *``) only by a
  writer that knows ``n`` exists, so a turn's objects are always exactly ``1..N``, and
  ``n`` is visible before ``n + 1`` is even tried: a reader that saw ``n`` never sees a
  smaller seq appear later. A reader still stops at the first seq missing from what it
  listed and fetched (a listing racing the writers), so each read is a contiguous run.
* **Once per key.** A writer knows every key of events ``1..cursor`` (a per-turn cache in
  this process, filled by reading the turn's events the first time). Its create at
  ``cursor + 1`` succeeding proves that no event past ``cursor`` existed, so the key was
  not in the log. When the create loses (another writer took that seq), the writer reads
  the events from its cursor on: if one carries its key (a racing writer of the same key)
  that event is the answer, else it tries the next seq. A write whose response was lost
  and that botocore retried into a 412 is recognised by its ``write_id`` (``store.put``).
* **Fenced appends** read the turn object (status ``running`` at the writer's epoch)
  after learning the log's end and before each create. The window: a takeover whose
  epoch CAS lands between that read and the create lets the zombie's event land after
  the takeover began, stamped with its older epoch. It harms no reader: the zombie's
  create names the seq after the last event it knew *before* its epoch check, so it wins
  only if nobody appended after the takeover; else it loses, reads on, checks the epoch
  again and is refused. So a late event always sorts before every event appended after
  the takeover (the new owner's ``attempt.started`` first): the log reads as if it had
  landed before it. The zombie's next fenced append is refused. (A transaction would
  close the window; S3 has none.)

Cost: an append is one PUT (unfenced) or a GET and a PUT (fenced) while this process's
cursor is current; a lost race adds a LIST and a GET per event it missed; the first append
to a turn in a process reads the turn's whole log (LIST and parallel GETs). A read is one
LIST (of up to ``limit`` keys) and parallel GETs. Nothing notifies a waiting reader:
``wait_for_events`` sleeps, and the reader's next read is a LIST.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time
from typing import Any

from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import CorruptJournal, NotFound, WorldError
from durable_harness.core.types import Event
from durable_harness.core.world import MAX_EVENT_BYTES
from durable_harness.worlds.s3sqs.journal import S3Journal
from durable_harness.worlds.s3sqs.store import Doc, Precondition, S3Store

#: Turns whose (cursor, keys) this process keeps; a turn evicted is read again if needed.
CACHED_TURNS = 256
#: Events a catch-up reads per LIST.
_PAGE = 1000


@dataclasses.dataclass
class _Known:
    """What this process knows of one turn's log: every key of events ``1..cursor``."""

    cursor: int = 0
    keys: dict[str, int] = dataclasses.field(default_factory=dict)  # key -> seq
    filled: bool = False
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def event_from_doc(doc: Doc, turn_id: str, seq: int) -> Event:
    data = doc.data
    try:
        if int(data["seq"]) != seq or not isinstance(data["data"], dict):
            raise ValueError(f"seq {data['seq']} or its data does not fit object {seq}")
        epoch = data.get("epoch")
        return Event(
            turn_id=turn_id,
            seq=seq,
            key=str(data["key"]),
            kind=str(data["kind"]),
            data=data["data"],
            at=float(data["at"]),
            epoch=None if epoch is None else int(epoch),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptJournal(f"turn {turn_id} event {seq}: cannot decode it ({exc})") from exc


class S3EventLog:
    """The event log over an :class:`S3Store`; thread-safe (one appender per turn at a
    time in this process, so its threads do not race each other for a seq)."""

    def __init__(self, store: S3Store, journal: S3Journal) -> None:
        self.store = store
        self.layout = store.layout
        self._journal = journal  # its fence(): the turn object at the writer's epoch
        self._known: collections.OrderedDict[str, _Known] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _for(self, turn_id: str) -> _Known:
        with self._lock:
            known = self._known.pop(turn_id, None) or _Known()
            self._known[turn_id] = known  # most recently used last
            while len(self._known) > CACHED_TURNS:
                self._known.popitem(last=False)
            return known

    def append(
        self, turn_id: str, key: str, kind: str, data: dict[str, Any], epoch: int | None
    ) -> Event:
        size = len(canonical_json(data).encode("utf-8", "surrogatepass"))
        if size > MAX_EVENT_BYTES:
            raise WorldError(
                f"turn {turn_id}: event {key!r} is {size} bytes of JSON, over the "
                f"{MAX_EVENT_BYTES} bytes an event may hold; append it in pieces"
            )
        known = self._for(turn_id)
        with known.lock:
            if not known.filled:
                self._catch_up(turn_id, known)
                if known.cursor == 0 and not self.store.exists(self.layout.turn(turn_id)):
                    raise NotFound(f"no turn {turn_id!r}")
                known.filled = True
            while True:
                seq = known.keys.get(key)
                if seq is not None:
                    return self._read_one(turn_id, seq)
                if epoch is not None:
                    self._journal.fence(turn_id, epoch)
                seq = known.cursor + 1
                at = time.time()
                record = {
                    "turn_id": turn_id,
                    "seq": seq,
                    "key": key,
                    "kind": kind,
                    "data": data,
                    "at": at,
                    "epoch": epoch,
                }
                try:
                    self.store.put(self.layout.event(turn_id, seq), record, if_none_match=True)
                except Precondition:
                    self._catch_up(turn_id, known)
                    continue
                known.cursor, known.keys[key] = seq, seq
                return Event(turn_id, seq, key, kind, data, at, epoch)

    def _catch_up(self, turn_id: str, known: _Known) -> None:
        """Learn the keys of the events after ``known.cursor``, up to the log's end."""
        while True:
            events = self.read(turn_id, known.cursor, _PAGE)
            if not events:
                # Listed nothing: ask for the next seq itself (a lost create says it
                # exists; a listing that lags behind it must not make us spin).
                doc = self.store.get(self.layout.event(turn_id, known.cursor + 1))
                if doc is None:
                    return
                events = [event_from_doc(doc, turn_id, known.cursor + 1)]
            for event in events:
                known.keys.setdefault(event.key, event.seq)
            known.cursor = events[-1].seq

    def _read_one(self, turn_id: str, seq: int) -> Event:
        doc = self.store.get(self.layout.event(turn_id, seq))
        if doc is None:  # events are never deleted: the cache saw it
            raise CorruptJournal(f"turn {turn_id}: event {seq} was seen and is gone")
        return event_from_doc(doc, turn_id, seq)

    def read(self, turn_id: str, after: int, limit: int) -> list[Event]:
        after = max(after, 0)
        if limit <= 0:
            return []
        listed = self.store.list_keys(
            self.layout.events(turn_id),
            start_after=self.layout.event(turn_id, after),
            page=min(limit, _PAGE),
        )
        seqs: list[int] = []
        for key in itertools.islice(listed, limit):
            name = key.rsplit("/", 1)[1]
            if not name.isdigit() or int(name) != after + len(seqs) + 1:
                break  # a gap in what was listed: the run ends before it
            seqs.append(int(name))
        docs = self.store.map(lambda seq: self.store.get(self.layout.event(turn_id, seq)), seqs)
        events = []
        for seq, doc in zip(seqs, docs, strict=True):
            if doc is None:
                break
            events.append(event_from_doc(doc, turn_id, seq))
        return events
