"""A session's records that are one pydantic model each, stored as a canonical JSON blob
(the seed, a fork): one way to write and read them, and one error for a bad one."""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import CorruptJournal
from durable_harness.core.world import BlobStore, Catalog

__all__ = ["load_record", "save_record"]

M = TypeVar("M", bound=BaseModel)


def save_record(
    world: BlobStore, catalog: Catalog, session_id: str, name: str, record: BaseModel
) -> str:
    """Store ``record`` as the session's record ``name``; returns the blob's digest."""
    digest = world.put_blob(canonical_json(record.model_dump()).encode())
    catalog.put_session_record(session_id, name, digest)
    return digest


def load_record(
    world: BlobStore, catalog: Catalog, session_id: str, name: str, model: type[M]
) -> M | None:
    """The session's record ``name`` as ``model``, or None if it has none."""
    digest = catalog.get_session_record(session_id, name)
    if digest is None:
        return None
    try:
        return model.model_validate(json.loads(world.get_blob(digest)))
    except (ValueError, ValidationError) as exc:
        raise CorruptJournal(
            f"the {name} record of session {session_id} is unreadable: {exc}"
        ) from exc
