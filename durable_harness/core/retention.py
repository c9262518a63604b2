"""What ``durable-harness gc`` asks of a World (:class:`Retention`), beside the World seam.

Not a facet of :class:`~durable_harness.core.world.World`: a backend opts in (the S3+SQS
World does not yet), and ``gc`` refuses a World without it.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Collection, Iterator, Sequence

__all__ = ["BlobInfo", "Dropped", "Retention", "digests_in"]


@dataclasses.dataclass
class Dropped:
    """What :meth:`Retention.drop_session` removed (or, in a dry run, would remove)."""

    turns: int = 0
    steps: int = 0
    events: int = 0
    records: int = 0


@dataclasses.dataclass(frozen=True)
class BlobInfo:
    """One stored blob, as :meth:`Retention.list_blobs` sees it."""

    digest: str
    size: int
    touched_at: float  # the World's clock when ``put_blob`` last wrote or reused it


class Retention(abc.ABC):
    """What ``durable-harness gc`` (``runtime/gc.py``) asks of a World: a mark and sweep.

    Not a facet of :class:`World`: a backend opts in (the S3+SQS World does not yet), and
    ``gc`` refuses a World without it. A backend that has it makes ``put_blob`` *touch*
    a blob it finds already stored (its ``touched_at`` becomes now), atomically with
    :meth:`delete_blobs`: a reuse either lands before the delete (which then keeps the
    blob) or after it (``put_blob`` then writes the blob again). That is what lets a turn
    reuse a deduplicated blob while ``gc`` sweeps.
    """

    @abc.abstractmethod
    def expired_sessions(self, before: float) -> list[str]:
        """Sessions with no unfinished turn whose last activity (the session's creation,
        each turn's creation and end) is before ``before``, on the World's clock."""

    @abc.abstractmethod
    def drop_session(self, session_id: str, before: float, dry_run: bool) -> Dropped | None:
        """Remove the session and all of it (turns, steps, events, signals, watches,
        records, owners) in one transaction that checks again that it is expired (a turn
        created on it meanwhile keeps it): ``None`` if it no longer is. ``dry_run``
        counts and removes nothing."""

    @abc.abstractmethod
    def referenced_digests(self, excluding: Collection[str] = ()) -> set[str]:
        """Every sha256 hex string in what the World keeps about its sessions (steps,
        turns, events, signals, records, session meta), sessions in ``excluding`` left
        out: the roots of the mark. Conservative on purpose: any 64-hex run counts."""

    @abc.abstractmethod
    def list_blobs(self) -> Iterator[BlobInfo]:
        """Every stored blob, in no particular order."""

    @abc.abstractmethod
    def delete_blobs(self, digests: Sequence[str], touched_before: float) -> dict[str, int]:
        """Delete each blob unless it was touched at or after ``touched_before`` (checked
        atomically with each delete, against ``put_blob``'s touch); the bytes freed per
        deleted digest (a blob kept or already gone is left out)."""


_DIGEST_RUN = re.compile(rb"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


def digests_in(data: bytes) -> set[str]:
    """The sha256 hex digests named in ``data``: every run of exactly 64 lowercase hex
    digits (how every reference to a blob is spelled: a step's ``output_blob``, a
    ``blob:`` input, a manifest's or a record chain's digests). What ``gc`` marks by."""
    return {match.decode() for match in _DIGEST_RUN.findall(data)}
