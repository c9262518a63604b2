"""Taking a session's work out: ``diff``, ``apply`` and ``export`` (issue 14, item 3).

Everything comes from the World: the session's seed record (``core/seed.py``: the seed
commit and the snapshot of the clone) and its newest workspace snapshot, so these work
on any machine, after the container is gone. The git side is ``repo/changes.py``; this
module finds the snapshots and turns what can go wrong into one line that says what to do.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from durable_harness.core.errors import ConfigError, CorruptJournal, NotFound, RepositoryError
from durable_harness.core.sandbox import SandboxState
from durable_harness.core.seed import Seed, load_seed
from durable_harness.core.tree import write_tree
from durable_harness.core.world import World
from durable_harness.harness.workspace import SnapshotStore, session_snapshot
from durable_harness.repo.changes import Work, apply_work, build_work, work_files
from durable_harness.repo.clone import find_repository

__all__ = ["Applied", "apply_session", "diff_session", "export_session", "newest_snapshot"]


@dataclass(frozen=True)
class Applied:
    """What ``apply`` made: ``branch`` at ``commit`` in ``repo``."""

    repo: Path
    branch: str
    commit: str


def newest_snapshot(world: World, session_id: str) -> str | None:
    """The digest of the session's newest workspace snapshot over all its turns (None if
    none): :func:`~durable_harness.harness.workspace.session_snapshot` without the seed."""
    return session_snapshot(world, session_id, seed=False)


def diff_session(world: World, session: str, patch: bool = False) -> bytes:
    """The session's work against its seed commit: a unified diff, or (``patch``) its
    commits as ``git format-patch --stdout`` with one more for uncommitted changes."""
    with _work(world, session) as work:
        return work.patch() if patch else work.diff()


def apply_session(
    world: World, session: str, repo: Path | None = None, branch: str | None = None
) -> Applied:
    """Put the session's work on a new branch (``dh/<session>`` by default) of ``repo``
    (default: the repository of the current folder), checking nothing out."""
    start = Path(repo) if repo is not None else Path.cwd()
    top = find_repository(start)
    if top is None:
        raise RepositoryError(
            f"{start} is not inside a git repository; give --repo PATH of a clone of the "
            "repository the session was seeded from"
        )
    session_id = _session_id(world, session)
    name = branch or f"dh/{session_id}"
    with _work(world, session_id) as work:
        apply_work(work, top, name, f"durable-harness apply {session_id}")
        return Applied(top, name, work.final)


def export_session(world: World, session: str, folder: Path) -> SandboxState:
    """Write the session's newest workspace files (links, modes and empty folders kept;
    no ``.git``) into ``folder``, which must be new or empty; returns what was written.
    A session not seeded from a repository is exported from its newest snapshot too."""
    if folder.is_symlink() or (folder.exists() and (not folder.is_dir() or any(folder.iterdir()))):
        raise ConfigError(f"{folder} is not an empty folder; give a new or empty one")
    session_id = _session_id(world, session)
    # The newest snapshot, else where the session began (its seed's, or its fork point's).
    digest = session_snapshot(world, session_id)
    if digest is None:
        raise ConfigError(f"session {session_id} has no workspace snapshot: nothing to export")
    state = work_files(_load(world, session_id, digest))
    write_tree(folder, state)
    return state


@contextlib.contextmanager
def _work(world: World, session: str) -> Iterator[Work]:
    session_id = _session_id(world, session)
    seed = _seed(world, session_id)
    seed_state = _load(world, session_id, seed.snapshot)
    digest = newest_snapshot(world, session_id)
    final = seed_state if digest is None else _load(world, session_id, digest)
    with tempfile.TemporaryDirectory(prefix="durable-harness-changes-") as tmp:
        os.chmod(tmp, 0o700)
        yield build_work(Path(tmp), seed.commit, seed_state, final)


def _session_id(world: World, session: str) -> str:
    """``session`` as a session id; a turn id is taken as its session's."""
    try:
        return world.get_session(session).session_id
    except NotFound:
        pass
    try:
        return world.get_turn(session).session_id
    except NotFound:
        raise ConfigError(
            f"no session {session!r} in this World; `durable-harness ls` lists them "
            "(or give the World with --world)"
        ) from None


def _seed(world: World, session_id: str) -> Seed:
    seed = load_seed(world, world, session_id)
    if seed is None:
        raise ConfigError(
            f"session {session_id} was not started with --repo: it has no seed commit to "
            f"compare with; `durable-harness export {session_id} DIR` writes its files"
        )
    return seed


def _load(world: World, session_id: str, digest: str) -> SandboxState:
    try:
        return SnapshotStore(world).load(digest)
    except (NotFound, CorruptJournal) as exc:
        raise CorruptJournal(
            f"workspace snapshot {digest[:12]} of session {session_id} is missing or "
            f"damaged in this World ({exc}); it cannot be taken out"
        ) from exc
