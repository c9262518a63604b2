"""Workspace snapshots in the World: what git keeps survives, and a step adds what it
changed, not the workspace's size."""

from __future__ import annotations

from pathlib import Path

from durable_harness.core.canonical import canonical_json
from durable_harness.core.sandbox import SandboxState
from durable_harness.harness.workspace import SnapshotStore
from durable_harness.worlds import open_world


class CountingWorld:
    """A real local World's blob store, counting what each save adds."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.added: dict[str, int] = {}

    def put_blob(self, data: bytes) -> str:
        digest: str = self.inner.put_blob(data)  # type: ignore[attr-defined]
        self.added[digest] = len(data)
        return digest

    def get_blob(self, digest: str) -> bytes:
        return self.inner.get_blob(digest)  # type: ignore[attr-defined,no-any-return]


def test_round_trip_and_growth_with_what_changed(tmp_path: Path) -> None:
    files = {f"src/pkg{i // 100}/mod{i}.py": f"x = {i}\n".encode() * 50 for i in range(2000)}
    files["bin/run"] = b"#!/bin/sh\n"
    state = SandboxState(
        files=files,
        cwd="src",
        executable=frozenset({"bin/run"}),
        links={"run": "bin/run", "src/up": "../.."},
        dirs=frozenset({"empty/inner", "src/pkg3/cache"}),
    )
    with open_world("local", data_dir=str(tmp_path / "w")) as world:
        first = CountingWorld(world)
        digest = SnapshotStore(first).save(state)  # type: ignore[arg-type]
        assert SnapshotStore(world).load(digest) == state
        whole = sum(first.added.values())

        # One file changed, in a new process (nothing remembered): the step adds that file
        # and the folders on its path; re-putting what is there already costs no bytes.
        changed = SandboxState(
            files={**files, "src/pkg7/mod700.py": b"x = 'fixed'\n"},
            cwd="src",
            executable=state.executable,
            links=state.links,
            dirs=state.dirs,
        )
        second = CountingWorld(world)
        store = SnapshotStore(second)
        store.load(digest)  # a resumed worker reads the snapshot it restores first
        second.added.clear()
        after = store.save(changed)
        assert SnapshotStore(world).load(after) == changed
        new = sum(second.added.values())
        assert len(second.added) == 5  # the file, src/pkg7, src, the root folder, the manifest
        assert new < whole / 20, (new, whole)


def test_manifests_of_the_first_format_still_load(tmp_path: Path) -> None:
    with open_world("local", data_dir=str(tmp_path / "w")) as world:
        blob = world.put_blob(b"print(1)\n")
        flat = {"cwd": "", "files": {"a/b.py": blob}, "exec": ["a/b.py"]}
        digest = world.put_blob(canonical_json(flat).encode())
        loaded = SnapshotStore(world).load(digest)
    assert loaded.files == {"a/b.py": b"print(1)\n"}
    assert loaded.executable == {"a/b.py"}


def test_a_workspace_1200_folders_deep_saves_and_loads(tmp_path: Path) -> None:
    # Past Python's recursion limit (1000): one blob per folder, walked with a stack.
    deep = "/".join(["d"] * 1200)
    state = SandboxState(
        files={f"{deep}/leaf.txt": b"at the bottom\n", "top.txt": b"top\n"},
        cwd="",
        links={f"{deep}/up": "../../.."},
        dirs=frozenset({f"{deep}/empty"}),
    )
    with open_world("local", data_dir=str(tmp_path / "w")) as world:
        digest = SnapshotStore(world).save(state)
        assert SnapshotStore(world).load(digest) == state
