"""Where a forked session began: a turn of another session, cut before one of its steps.

``durable-harness fork TURN --at SEQ`` (``runtime/fork.py``) records a :class:`Fork` as the
new session's ``fork`` record (a blob, like the seed): the conversation the fork starts
with, rebuilt from the origin's journal when the fork was made, and the workspace snapshot
as it was at the fork point. The new session needs nothing of the origin's after that: a
worker anywhere continues it from its own records, and ``gc`` of the origin session does
not touch it (the record names the snapshot, which marks it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from durable_harness.core.records import load_record, save_record
from durable_harness.core.seed import Seed
from durable_harness.core.world import BlobStore, Catalog

__all__ = ["FORK_RECORD", "Cut", "Fork", "load_fork", "save_fork"]

#: The session record that points at the fork's blob.
FORK_RECORD = "fork"


class Fork(BaseModel):
    """The stored fork of a session (see the module docstring)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    #: The session and turn forked, and the step the fork was cut before: the steps
    #: ``0 .. at-1`` of that turn are the end of :attr:`history`.
    session_id: str
    turn_id: str
    at: int
    #: The conversation the new session's first turn continues, in the agent's own form
    #: (the built-in agent: Anthropic Messages), the origin session's earlier turns first.
    history: list[dict[str, Any]] = Field(default_factory=list)
    #: A CLI agent's own session record, cut at the fork point (Claude Code: a
    #: ``TranscriptStore`` save of its transcript), which the first launch restores.
    record: str | None = None
    #: The digest of the workspace snapshot at the fork point; None: an empty workspace.
    workspace: str | None = None
    #: The origin session's seed (``run --repo``), its snapshot the fork point's: stored
    #: as the new session's own seed, so ``diff``, ``apply`` and ``export`` compare the
    #: fork's work with the commit the origin started from.
    seed: Seed | None = None


@dataclass(frozen=True)
class Cut:
    """What an agent keeps of a turn cut before a step (``Adapter.fork_cut``): the
    conversation (the built-in agent) or the digest of its own record, cut."""

    history: list[dict[str, Any]] = field(default_factory=list)
    record: str | None = None


def save_fork(world: BlobStore, catalog: Catalog, session_id: str, fork: Fork) -> str:
    """Store ``fork`` as the session's fork record; returns the record's blob digest."""
    return save_record(world, catalog, session_id, FORK_RECORD, fork)


def load_fork(world: BlobStore, catalog: Catalog, session_id: str) -> Fork | None:
    """The session's fork, or None if it was not made by ``fork``."""
    return load_record(world, catalog, session_id, FORK_RECORD, Fork)
