"""Where a session's workspace began: the repository and commit it was seeded from.

``run --repo`` (``durable_harness/repo``) clones on the host, saves the checkout as an
ordinary workspace snapshot, and records a :class:`Seed` as the session's ``seed`` record
(a blob, like a CLI transcript). From then on the World alone is enough: a worker on
another machine restores the session's first workspace from ``snapshot`` (never from the
user's folder), and ``diff``/``apply``/``export`` compare the newest snapshot with
``commit``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from durable_harness.core.records import load_record, save_record
from durable_harness.core.world import BlobStore, Catalog

__all__ = ["SEED_RECORD", "Seed", "load_seed", "save_seed"]

#: The session record that points at the seed's blob.
SEED_RECORD = "seed"


class Seed(BaseModel):
    """The stored seed of a session (see the module docstring)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    #: Where the repository came from, as given (a path or URL) with any credentials
    #: taken out: it is shown to users and kept in the World.
    repo: str
    #: The full commit id the workspace was checked out at.
    commit: str
    #: The ref the user named (``--ref``), if any.
    ref: str | None = None
    #: The digest of the workspace snapshot made from the checkout.
    snapshot: str
    #: Whether uncommitted changes of the user's folder were carried in
    #: (``--include-uncommitted``): then the snapshot differs from ``commit``.
    uncommitted: bool = False


def save_seed(world: BlobStore, catalog: Catalog, session_id: str, seed: Seed) -> str:
    """Store ``seed`` as the session's seed record; returns the record's blob digest."""
    return save_record(world, catalog, session_id, SEED_RECORD, seed)


def load_seed(world: BlobStore, catalog: Catalog, session_id: str) -> Seed | None:
    """The session's seed, or None if it was not seeded from a repository."""
    return load_record(world, catalog, session_id, SEED_RECORD, Seed)
