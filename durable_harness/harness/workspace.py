"""Workspace snapshots: journaled sandboxes (the virtual workspace) and sandboxes whose
workspace can be lost with its machine (Docker volumes).

A snapshot is a manifest blob ``{"cwd": …, "files": {path: sha256}}`` over one blob per
file, so an unchanged file is stored once however many steps snapshot it (invariant 7).
The manifest's digest is kept in the ``meta`` of the tool step that produced it, written
atomically with the step's outcome: the journal says exactly which files a resumed turn
had.
"""

from __future__ import annotations

import hashlib
import json

from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import CorruptJournal
from durable_harness.core.sandbox import Sandbox, SandboxState
from durable_harness.core.seed import load_seed
from durable_harness.core.types import StepStatus, TurnStatus
from durable_harness.core.world import BlobStore, World


class SnapshotStore:
    def __init__(self, world: BlobStore) -> None:
        self.world = world
        self._stored: set[str] = set()  # digests already in the blob store

    def save(self, state: SandboxState) -> str:
        files: dict[str, str] = {}
        for path, data in sorted(state.files.items()):
            digest = hashlib.sha256(data).hexdigest()
            if digest not in self._stored:
                self.world.put_blob(data)
                self._stored.add(digest)
            files[path] = digest
        manifest: dict[str, object] = {"cwd": state.cwd, "files": files}
        # Written only when present, so a workspace without them keeps the digest (and the
        # manifest format) it had before these keys existed.
        if state.executable:
            manifest["exec"] = sorted(state.executable)
        if state.links:
            manifest["links"] = dict(sorted(state.links.items()))
        if state.dirs:
            manifest["dirs"] = sorted(state.dirs)
        return self.world.put_blob(canonical_json(manifest).encode())

    def load(self, digest: str) -> SandboxState:
        try:
            manifest = json.loads(self.world.get_blob(digest))
            files = {p: self.world.get_blob(d) for p, d in manifest["files"].items()}
            self._stored.update(manifest["files"].values())
            return SandboxState(
                files=files,
                cwd=str(manifest["cwd"]),
                executable=frozenset(str(p) for p in manifest.get("exec", ())),
                links={str(p): str(t) for p, t in manifest.get("links", {}).items()},
                dirs=frozenset(str(p) for p in manifest.get("dirs", ())),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptJournal(f"workspace snapshot {digest[:12]} is unreadable: {exc}") from exc


def save_workspace(sandbox: Sandbox, store: SnapshotStore) -> str | None:
    """Snapshot the workspace into the World at a step boundary; return the digest to keep
    in the step's ``meta["workspace"]`` (None if this sandbox is not snapshotted).

    For a ``snapshots`` sandbox the digest is also marked inside the workspace, so a later
    :func:`restore_workspace` knows the workspace already holds it.
    """
    if not (sandbox.journaled or sandbox.snapshots):
        return None
    digest = store.save(sandbox.export_state())
    if sandbox.snapshots:
        sandbox.set_snapshot_mark(digest)
    return digest


def restore_workspace(sandbox: Sandbox, store: SnapshotStore, digest: str | None) -> bool:
    """Bring the workspace to snapshot ``digest`` (the newest one the journal holds) if it
    does not hold it already; True if files were restored.

    A journaled sandbox is always rebuilt. A ``snapshots`` sandbox is rebuilt only when its
    mark differs: its workspace is new (the container and volume were lost) or stale (the
    session went on on another machine). A workspace whose mark equals ``digest`` is kept
    as it is, with any effects of an interrupted step after that snapshot, as on a host
    folder (the journal reports such a step as possibly ran).
    """
    if digest is None or not (sandbox.journaled or sandbox.snapshots):
        return False
    if sandbox.snapshots and sandbox.snapshot_mark() == digest:
        return False
    sandbox.import_state(store.load(digest))
    if sandbox.snapshots:
        sandbox.set_snapshot_mark(digest)
    return True


def session_snapshot(world: World, session_id: str, before_index: int) -> str | None:
    """The snapshot a turn of the session (the one at ``before_index``) starts from when
    its own journal holds none yet: the newest one of the session's earlier, finished
    turns, else the session's seed (``run --repo``), else None (an empty workspace).

    Every adapter asks this one function, so the first delivery of a seeded session's
    first turn starts from the seed on every backend and every worker."""
    digest: str | None = None
    for turn in world.list_turns(session_id):
        if turn.index < before_index and turn.status is TurnStatus.DONE:
            for step in world.load_steps(turn.turn_id):
                if step.status is StepStatus.DONE and "workspace" in step.meta:
                    digest = str(step.meta["workspace"])
    if digest is None:
        seed = load_seed(world, world, session_id)
        digest = None if seed is None else seed.snapshot
    return digest
