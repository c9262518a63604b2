"""The S3+SQS World's tenancy: API tokens, owners of sessions and turns, rate counters.

Package-private. Each is kept by conditional writes on one object, as the rest of the
World is:

* **Tokens** ``tokens/<id>``: created with ``If-None-Match: *`` (an id is used once),
  revoked with a compare-and-swap (``If-Match``) that keeps the first ``revoked_at``.
* **Owners** ``owners/<kind>/<item>``: created with ``If-None-Match: *``, so two tenants
  racing for one item cannot both own it. Each tenant's listing is the index objects
  ``owned/<tenant>/<kind>/<order>``, written *before* the owner object, so an owned
  item is always listed; an entry counts only if the owner object agrees with it (same
  tenant, same time), so a tenant that lost the race for an item never lists it.
  ``<order>`` sorts as ``list_owned`` pages (time descending, then id descending): the
  time's IEEE-754 bits made order-preserving and inverted (exact, so a page's last item
  is its own cursor), then the id's UTF-8 bytes inverted, in hex, closed by ``ff`` (a
  longer id sorts before its prefix). A cursor is then one ``StartAfter``.
* **Rate counters** ``rates/<bucket>/<window_s>/<window>``: the uses in one fixed window
  of the World's clock, created with ``If-None-Match: *`` and counted up by CAS; a use
  past the limit writes nothing. Old windows are never read again, and the World never
  deletes (no ``s3:DeleteObject``): a lifecycle rule expiring ``rates/`` after a day
  keeps the bucket tidy.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from typing import Any

from durable_harness.core.errors import CorruptJournal, NotFound, StepConflict
from durable_harness.core.types import ApiToken
from durable_harness.worlds.s3sqs.store import Doc, Precondition, S3Store

_SIGN = 1 << 63
_ALL = (1 << 64) - 1
_CLOSE = "ff"  # closes an id: a longer id sorts before its prefix


def order_key(created_at: float, item_id: str) -> str:
    """The index entry's name: ascending names are (time, id) descending."""
    bits = struct.unpack(">Q", struct.pack(">d", created_at))[0]
    # IEEE-754 bits sort like the numbers once negatives are flipped whole and positives
    # get their sign bit set; inverted, the newest comes first.
    ordered = bits ^ _ALL if bits & _SIGN else bits | _SIGN
    # UTF-8 bytes compare as code points do (the local World's order); ff never occurs in
    # UTF-8, so an inverted byte is below _CLOSE (only a NUL would tie with it).
    inverted_id = bytes(0xFF - b for b in item_id.encode("utf-8", "surrogatepass")).hex()
    return f"{_ALL - ordered:016x}{inverted_id}{_CLOSE}"


def from_order_key(name: str) -> tuple[float, str]:
    ordered = _ALL - int(name[:16], 16)
    bits = ordered ^ _SIGN if ordered & _SIGN else ordered ^ _ALL
    created_at = struct.unpack(">d", struct.pack(">Q", bits))[0]
    raw = bytes(0xFF - b for b in bytes.fromhex(name[16 : -len(_CLOSE)]))
    return float(created_at), raw.decode("utf-8", "surrogatepass")


def token_to_json(token: ApiToken) -> dict[str, Any]:
    return dataclasses.asdict(token)


def token_from_doc(doc: Doc) -> ApiToken:
    data = doc.data
    try:
        revoked = data["revoked_at"]
        return ApiToken(
            token_id=str(data["token_id"]),
            tenant=str(data["tenant"]),
            digest=str(data["digest"]),
            created_at=float(data["created_at"]),
            operator=bool(data["operator"]),
            label=str(data["label"]),
            revoked_at=None if revoked is None else float(revoked),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptJournal(f"cannot decode an API token object ({exc})") from exc


class S3Tenancy:
    """Tokens, owners and rate counters over an :class:`S3Store`; thread-safe."""

    def __init__(self, store: S3Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.layout = store.layout
        self._clock = clock  # the World's clock: what rate windows are measured by

    # -- tokens ----------------------------------------------------------------------
    def put_token(self, token: ApiToken) -> None:
        try:
            self.store.put(
                self.layout.token(token.token_id), token_to_json(token), if_none_match=True
            )
        except Precondition:
            raise StepConflict(f"API token {token.token_id} exists") from None

    def get_token(self, token_id: str) -> ApiToken:
        doc = self.store.get(self.layout.token(token_id))
        if doc is None:
            raise NotFound(f"no API token {token_id!r}")
        return token_from_doc(doc)

    def list_tokens(self) -> list[ApiToken]:
        keys = list(self.store.list_keys(self.layout.tokens()))
        docs = self.store.map(self.store.get, keys)
        tokens = [token_from_doc(doc) for doc in docs if doc is not None]
        return sorted(tokens, key=lambda t: (t.created_at, t.token_id))

    def revoke_token(self, token_id: str, at: float) -> ApiToken:
        def revoke(data: dict[str, Any]) -> dict[str, Any] | None:
            return None if data.get("revoked_at") is not None else {**data, "revoked_at": at}

        doc = self.store.update(self.layout.token(token_id), revoke)
        if doc is None:
            raise NotFound(f"no API token {token_id!r}")
        return token_from_doc(doc)

    # -- owners ----------------------------------------------------------------------
    def put_owner(self, kind: str, item_id: str, tenant: str, created_at: float) -> None:
        key = self.layout.owner(kind, item_id)
        existing = self.store.get(key)
        if existing is None:
            # The entry first: an owned item is always listed (list_owned skips an entry
            # whose owner object says otherwise, as it does when we lose the race below).
            entry = self.layout.owned(tenant, kind) + order_key(created_at, item_id)
            self.store.put_bytes(entry, b"")
            data = {"kind": kind, "item_id": item_id, "tenant": tenant, "created_at": created_at}
            try:
                self.store.put(key, data, if_none_match=True)
                return
            except Precondition:
                existing = self.store.get(key)
        if existing is None or existing.data.get("tenant") != tenant:
            raise StepConflict(f"{kind} {item_id} belongs to another tenant")

    def get_owner(self, kind: str, item_id: str) -> str | None:
        doc = self.store.get(self.layout.owner(kind, item_id))
        return None if doc is None else str(doc.data["tenant"])

    def list_owned(
        self, tenant: str, kind: str, limit: int, before: tuple[float, str] | None
    ) -> list[tuple[float, str]]:
        prefix = self.layout.owned(tenant, kind)
        start = prefix + order_key(*before) if before is not None else ""
        names = self.store.list_keys(prefix, start_after=start, page=min(max(limit, 1), 1000))
        found: list[tuple[float, str]] = []

        def agrees(entry: tuple[float, str]) -> bool:
            """Whether the owner object is this entry's: its tenant, at its time."""
            doc = self.store.get(self.layout.owner(kind, entry[1]))
            owner = {} if doc is None else doc.data
            return owner.get("tenant") == tenant and owner.get("created_at") == entry[0]

        while len(found) < limit:
            # A page at a time: an entry left by a lost race costs one more GET, no more.
            room = range(limit - len(found))
            page = [from_order_key(n[len(prefix) :]) for _, n in zip(room, names, strict=False)]
            if not page:
                break
            agreed = self.store.map(agrees, page)
            found += [entry for entry, ok in zip(page, agreed, strict=True) if ok]
        return found

    # -- rate counters ---------------------------------------------------------------
    def take_rate(self, bucket: str, limit: int, window_s: float) -> bool:
        key = self.layout.rate(bucket, window_s, int(self._clock() // window_s))
        while True:
            taken = False

            def count(data: dict[str, Any]) -> dict[str, Any] | None:
                nonlocal taken
                taken = int(data["used"]) < limit
                return {**data, "used": int(data["used"]) + 1} if taken else None

            if self.store.update(key, count) is not None:
                return taken
            if limit < 1:
                return False
            try:
                self.store.put(key, {"used": 1}, if_none_match=True)
                return True
            except Precondition:
                continue  # another process opened the window first: count in it
