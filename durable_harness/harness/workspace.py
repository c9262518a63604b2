"""Workspace snapshots: journaled sandboxes (the virtual workspace) and sandboxes whose
workspace can be lost with its machine (Docker volumes).

A snapshot is a manifest blob ``{"cwd": …, "tree": digest}``: one blob per folder
(``{"files": {name: sha256}, "exec": [name], "links": {name: target}, "dirs": {name:
digest}}``, empty keys left out) over one blob per file, as git stores trees. An
unchanged file, or folder, is the same blob in every snapshot, so what a step adds to the
World is the files it changed and the folders on their paths, not the workspace's size
(invariant 7). Manifests of the first format (``{"cwd", "files": {path: sha256}}``, one
object for every path) are still read.
The manifest's digest is kept in the ``meta`` of the tool step that produced it, written
atomically with the step's outcome: the journal says exactly which files a resumed turn
had.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import CorruptJournal
from durable_harness.core.fork import load_fork
from durable_harness.core.sandbox import Sandbox, SandboxState
from durable_harness.core.seed import load_seed
from durable_harness.core.types import StepStatus, TurnStatus
from durable_harness.core.world import BlobStore, World


class SnapshotStore:
    """Saves and loads workspace snapshots (see the module docstring)."""

    def __init__(self, world: BlobStore) -> None:
        self.world = world
        self._stored: set[str] = set()  # digests already in the blob store

    def _put(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if digest not in self._stored:
            self.world.put_blob(data)
            self._stored.add(digest)
        return digest

    def save(self, state: SandboxState) -> str:
        root = _Folder()
        for path, data in state.files.items():
            folder, name = root.parent_of(path)
            folder.files[name] = self._put(data)
            if path in state.executable:
                folder.executable.append(name)
        for path, target in state.links.items():
            folder, name = root.parent_of(path)
            folder.links[name] = target
        for path in state.dirs:
            root.folder(path)
        manifest = {"cwd": state.cwd, "tree": root.save(self._put)}
        return self._put(canonical_json(manifest).encode())

    def load(self, digest: str) -> SandboxState:
        try:
            manifest = json.loads(self.world.get_blob(digest))
            if "tree" not in manifest:
                return self._load_flat(manifest)
            state = _Loaded()
            self._load_folder(str(manifest["tree"]), "", state)
            return SandboxState(
                files=state.files,
                cwd=str(manifest["cwd"]),
                executable=frozenset(state.executable),
                links=state.links,
                dirs=frozenset(state.dirs),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptJournal(f"workspace snapshot {digest[:12]} is unreadable: {exc}") from exc

    def _load_folder(self, digest: str, prefix: str, into: _Loaded) -> None:
        # A stack, not recursion: a workspace thousands of folders deep loads as any other.
        pending = [(digest, prefix)]
        while pending:
            digest, prefix = pending.pop()
            node = json.loads(self.world.get_blob(digest))
            self._stored.add(digest)
            for name, blob in node.get("files", {}).items():
                into.files[prefix + _name(name)] = self.world.get_blob(blob)
                self._stored.add(blob)
            into.executable.update(prefix + _name(n) for n in node.get("exec", ()))
            links = node.get("links", {})
            into.links.update({prefix + _name(n): str(t) for n, t in links.items()})
            folders = node.get("dirs", {})
            if not (node.get("files") or links or folders) and prefix:
                into.dirs.add(prefix.rstrip("/"))
            pending.extend(
                (str(child), prefix + _name(name) + "/") for name, child in folders.items()
            )

    def _load_flat(self, manifest: dict[str, Any]) -> SandboxState:
        """A manifest of the first format: every path in one object."""
        files = {p: self.world.get_blob(d) for p, d in manifest["files"].items()}
        self._stored.update(manifest["files"].values())
        return SandboxState(
            files=files,
            cwd=str(manifest["cwd"]),
            executable=frozenset(str(p) for p in manifest.get("exec", ())),
            links={str(p): str(t) for p, t in manifest.get("links", {}).items()},
            dirs=frozenset(str(p) for p in manifest.get("dirs", ())),
        )


def _name(name: object) -> str:
    """An entry name as stored: one path component."""
    text = str(name)
    if not text or "/" in text or text in (".", ".."):
        raise ValueError(f"bad entry name {text!r}")
    return text


@dataclass
class _Loaded:
    files: dict[str, bytes] = field(default_factory=dict)
    executable: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)


@dataclass
class _Folder:
    """One directory of a snapshot being saved: stored as its own blob, so an unchanged
    folder (and all below it) is the same blob in every snapshot."""

    files: dict[str, str] = field(default_factory=dict)
    executable: list[str] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)
    folders: dict[str, _Folder] = field(default_factory=dict)

    def folder(self, path: str) -> _Folder:
        here = self
        for part in path.split("/"):
            here = here.folders.setdefault(part, _Folder())
        return here

    def parent_of(self, path: str) -> tuple[_Folder, str]:
        head, _, name = path.rpartition("/")
        return (self.folder(head) if head else self), name

    def save(self, put: Callable[[bytes], str]) -> str:
        """Store this folder and every folder below it (children first, each its own blob);
        its digest. Iterative: depth costs no stack."""
        done: dict[int, str] = {}
        pending: list[tuple[_Folder, bool]] = [(self, False)]
        while pending:
            folder, children_done = pending.pop()
            if not children_done:
                pending.append((folder, True))
                pending.extend((child, False) for child in folder.folders.values())
                continue
            node: dict[str, object] = {}
            if folder.files:
                node["files"] = folder.files
            if folder.executable:
                node["exec"] = sorted(folder.executable)
            if folder.links:
                node["links"] = folder.links
            if folder.folders:
                node["dirs"] = {name: done.pop(id(c)) for name, c in folder.folders.items()}
            done[id(folder)] = put(canonical_json(node).encode())
        return done[id(self)]


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


def snapshot_failed(exc: Exception) -> str:
    """What the model and the log are told when a step's snapshot failed: the step stands,
    and a lost workspace comes back as the last snapshot that was taken."""
    return (
        f"[durable-harness] the workspace could not be saved after this call: {exc}. Until "
        "it can be, a lost sandbox comes back as it was at the last saved step."
    )


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


def session_snapshot(
    world: World, session_id: str, before_index: int | None = None, *, seed: bool = True
) -> str | None:
    """The newest workspace snapshot of the session: the last finished step's over the
    turns before ``before_index`` that are done or cancelled (every turn, finished or
    not, when it is None: what ``diff`` shows while a turn waits on CI); else, with
    ``seed``, the session's seed (``run --repo``) or the workspace at its fork point
    (``fork``); else None (an empty workspace).

    A turn whose own journal holds none yet starts from ``session_snapshot(world,
    session, turn.index)``: every adapter asks this one function, so the first delivery
    of a seeded session's first turn starts from the seed on every backend and worker."""
    digest: str | None = None
    for turn in world.list_turns(session_id, limit=2**31):  # every turn, not the first 100
        if before_index is not None and not (
            turn.index < before_index and turn.status in (TurnStatus.DONE, TurnStatus.CANCELLED)
        ):
            continue
        for step in sorted(world.load_steps(turn.turn_id), key=lambda s: s.seq):
            if step.status is StepStatus.DONE and "workspace" in step.meta:
                digest = str(step.meta["workspace"])
    if digest is None and seed:
        found = load_seed(world, world, session_id)
        if found is not None:
            return found.snapshot
        fork = load_fork(world, world, session_id)
        digest = None if fork is None else fork.workspace
    return digest
