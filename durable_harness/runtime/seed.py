"""Seeding a new session's workspace from the user's repository (``run --repo``).

Two halves, so bad input records nothing:

* :func:`prepare_seed` does everything that can fail, before the World is touched: the
  clone on the host (``repo/clone.py``, into a temporary folder removed afterwards), the
  checkout read as a state with its ``.git`` (the agent commits in the workspace), the
  uncommitted changes carried or counted, and the checks against where the turn runs (the
  virtual workspace's caps; a host folder that is the user's own checkout or not empty);
* :func:`record_seed` (called by ``start_turn`` between creating the session and its first
  turn) saves the state as an ordinary workspace snapshot and the session's ``seed``
  record. The first delivery of the first turn, on any worker, restores from that
  snapshot (``harness/workspace.py: session_snapshot``), never from the user's folder.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_harness.core.errors import ConfigError, RepositoryError
from durable_harness.core.sandbox import SandboxState
from durable_harness.core.seed import Seed, save_seed
from durable_harness.core.tree import read_tree
from durable_harness.core.turn_config import DOCKER, VIRTUAL, TurnConfig
from durable_harness.core.world import World
from durable_harness.harness.workspace import SnapshotStore
from durable_harness.repo.clone import (
    carry_over,
    clone_checkout,
    find_repository,
    is_url,
    uncommitted_paths,
)
from durable_harness.repo.git import redact_url

__all__ = ["PreparedSeed", "default_repository", "prepare_seed", "record_seed"]


@dataclass(frozen=True)
class PreparedSeed:
    """A checkout ready to become a session's first workspace (nothing stored yet)."""

    repo: str  # the source as stored: a folder's top, or the URL without credentials
    commit: str
    ref: str | None
    state: SandboxState
    uncommitted: bool  # the user's uncommitted changes were carried in
    left_out: int  # uncommitted changes there were, and were not carried

    def describe(self) -> str:
        carried = " with its uncommitted changes" if self.uncommitted else ""
        return (
            f"workspace seeded from {self.repo} at {self.commit[:12]}{carried} "
            f"({len(self.state.files) + len(self.state.links)} files, .git included)"
        )


def default_repository(folder: str | Path = ".") -> Path | None:
    """The git repository ``run`` works on when no ``--repo`` is given: the one holding
    ``folder`` (the current folder), if any."""
    return find_repository(folder)


def prepare_seed(
    source: str,
    config: dict[str, Any],
    *,
    ref: str | None = None,
    include_uncommitted: bool = False,
    on_checkout: Callable[[Path], None] | None = None,
) -> PreparedSeed:
    """Clone ``source`` (a folder or URL) at ``ref`` and check it against the turn's
    ``config`` (see the module docstring). RepositoryError for a source that is not a
    repository or an unknown ref, ConfigError for a checkout the workspace cannot take.

    ``on_checkout`` is called with the clean checkout of the commit (before any
    uncommitted change is carried over, while it exists): ``run`` reads the repository's
    devcontainer there (runtime/toolchain.py)."""
    turn = TurnConfig.of(config)
    top = None if is_url(source) else find_repository(source)
    if not is_url(source) and top is None:
        raise RepositoryError(
            f"{source} is not a git repository: give --repo PATH|URL of one, or --no-repo"
        )
    if include_uncommitted and top is None:
        raise ConfigError(
            "--include-uncommitted carries a folder's changes: a URL has none (drop it, or "
            "give --repo PATH of your checkout)"
        )
    _check_host_folder(turn.workspace, top)
    with tempfile.TemporaryDirectory(prefix="durable-harness-seed-") as tmp:
        checkout = clone_checkout(str(top or source), Path(tmp) / "repo", ref)
        if on_checkout is not None:
            on_checkout(checkout.path)
        changes = {} if top is None else uncommitted_paths(top)
        if include_uncommitted and top is not None:
            carry_over(top, checkout.path, changes)
        state = read_tree(checkout.path)
    prepared = PreparedSeed(
        repo=str(top) if top is not None else redact_url(source),
        commit=checkout.commit,
        ref=ref,
        state=state,
        uncommitted=include_uncommitted and bool(changes),
        left_out=0 if include_uncommitted else len(changes),
    )
    if turn.workspace == VIRTUAL:
        _check_caps(prepared, turn)
    return prepared


def record_seed(world: World, session_id: str, prepared: PreparedSeed) -> Seed:
    """Store the checkout as a workspace snapshot and the session's seed record."""
    snapshot = SnapshotStore(world).save(prepared.state)
    seed = Seed(
        repo=prepared.repo,
        commit=prepared.commit,
        ref=prepared.ref,
        snapshot=snapshot,
        uncommitted=prepared.uncommitted,
    )
    save_seed(world, world, session_id, seed)
    return seed


def _check_caps(prepared: PreparedSeed, turn: TurnConfig) -> None:
    """Refuse up front a checkout the virtual workspace could not hold (it would fail at
    the first restore, after the turn was queued). Links count as files there."""
    files = len(prepared.state.files) + len(prepared.state.links)
    size = sum(len(data) for data in prepared.state.files.values())
    if turn.max_files is not None and files > turn.max_files:
        raise ConfigError(
            f"{prepared.repo} has {files:,} files (its .git included), over the virtual "
            f"workspace's cap of {turn.max_files:,}: raise it with --max-files {files}, or "
            "use --workspace docker"
        )
    if turn.max_bytes is not None and size > turn.max_bytes:
        raise ConfigError(
            f"{prepared.repo} has {size:,} bytes (its .git included), over the virtual "
            f"workspace's cap of {turn.max_bytes:,}: raise it with --max-bytes {size}, or "
            "use --workspace docker"
        )


def _check_host_folder(workspace: str, top: Path | None) -> None:
    """A host folder seeded from a repository must be a new, empty folder of its own:
    never the user's checkout (nor a folder inside it), whose files the agent would
    overwrite."""
    if workspace in (VIRTUAL, DOCKER):
        return
    folder = Path(workspace).resolve()
    if top is not None and (folder == top or folder.is_relative_to(top)):
        raise ConfigError(
            f"--workspace {folder} is inside the repository {top}: the agent never works in "
            "your own checkout; give an empty folder outside it (the repository is cloned "
            "there)"
        )
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(
            f"--workspace {folder} is not empty: a workspace seeded from a repository starts "
            "in an empty folder (give a new one, or --no-repo to work in this one as it is)"
        )
