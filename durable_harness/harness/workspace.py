"""Workspace snapshots for journaled sandboxes (the virtual workspace).

A snapshot is a manifest blob ``{"cwd": …, "files": {path: sha256}}`` over one blob per
file, so an unchanged file is stored once however many steps snapshot it (invariant 7).
The manifest's digest is kept in the ``meta`` of the tool step that produced it, written
atomically with the step's outcome: the journal says exactly which files a resumed turn
had.
"""

from __future__ import annotations

import hashlib
import json

from durable_harness.harness.errors import CorruptJournal
from durable_harness.harness.tools import canonical_json
from durable_harness.sandbox.base import SandboxState
from durable_harness.worlds.base import World


class SnapshotStore:
    def __init__(self, world: World) -> None:
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
        return self.world.put_blob(canonical_json({"cwd": state.cwd, "files": files}).encode())

    def load(self, digest: str) -> SandboxState:
        try:
            manifest = json.loads(self.world.get_blob(digest))
            files = {p: self.world.get_blob(d) for p, d in manifest["files"].items()}
            self._stored.update(manifest["files"].values())
            return SandboxState(files=files, cwd=str(manifest["cwd"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptJournal(f"workspace snapshot {digest[:12]} is unreadable: {exc}") from exc
