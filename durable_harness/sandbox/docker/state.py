"""The Docker sandbox's snapshots: the workspace exported to and imported from a
:class:`SandboxState`, and the mark naming the snapshot the workspace holds.

An export copies out only the files whose size or mtime changed since the last one (the
cache of what was copied); an import writes one tar stream and sets the bash tool's cwd.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import time

from durable_harness.core.errors import SandboxError
from durable_harness.core.sandbox import Sandbox, SandboxState, check_state_paths
from durable_harness.sandbox.docker import scripts as sh
from durable_harness.sandbox.docker.exec import Commands, text


class DockerState(Commands, Sandbox):
    """The snapshots of :class:`~durable_harness.sandbox.docker.DockerSandbox`."""

    max_snapshot_bytes: int
    # path -> (size, mtime, content) as last copied out, so export_state copies only
    # the files that changed since.
    _cache: dict[str, tuple[int, str, bytes]]
    _mark: str | None  # the mark as last read or written by this process

    def _listing(self) -> tuple[str, dict[str, tuple[int, str]]]:
        """The bash tool's cwd and every regular file's (size, mtime)."""
        result = self.exec(sh.LIST, max_output=1 << 30)
        if result.exit_code != 0:
            raise SandboxError(f"listing the workspace failed: {text(result.stderr)[-500:]}")
        cwd, *records = result.whole_stdout("listing the workspace").split(b"\0")
        listing: dict[str, tuple[int, str]] = {}
        for record in records:
            if record:
                size, mtime, rel = record.split(b" ", 2)
                listing[rel.decode("utf-8", "surrogateescape")] = (int(size), mtime.decode())
        return text(cwd).strip() or sh.WORKSPACE, listing

    def export_state(self) -> SandboxState:
        """Every regular file under ``/workspace`` (sorted) and the bash tool's cwd.

        Only files whose size or mtime changed since the last export are copied out of
        the container. Symlinks and empty folders are not carried. SandboxError if the
        workspace holds more than ``max_snapshot_bytes``.
        """
        cwd, listing = self._listing()
        total = sum(size for size, _ in listing.values())
        if total > self.max_snapshot_bytes:
            raise SandboxError(
                f"the workspace holds {total:,} bytes, more than a snapshot may "
                f"({self.max_snapshot_bytes:,}); remove build outputs or raise max_snapshot_bytes"
            )
        changed = [p for p, stat in listing.items() if self._cache.get(p, (0, "", b""))[:2] != stat]
        if changed:
            names = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in changed)
            size = sum(listing[p][0] for p in changed)
            result = self.exec(
                sh.EXPORT, stdin=names, max_output=2 * size + 1024 * (len(changed) + 4) + (1 << 20)
            )
            data = result.whole_stdout("copying the workspace out for a snapshot")
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
                for member in archive:
                    handle = archive.extractfile(member) if member.isfile() else None
                    if handle is not None and member.name in listing:
                        self._cache[member.name] = (*listing[member.name], handle.read())
        self._cache = {p: v for p, v in self._cache.items() if p in listing}
        files = {p: self._cache[p][2] for p in sorted(self._cache)}
        return SandboxState(files=files, cwd=cwd)

    def import_state(self, state: SandboxState) -> None:
        """Replace the workspace's files with ``state`` and set the bash tool's cwd;
        SandboxError (and no change) for a state with invalid paths."""
        check_state_paths(state.files)
        buffer = io.BytesIO()
        now = time.time()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for rel, data in sorted(state.files.items()):
                info = tarfile.TarInfo(rel)
                info.size, info.mtime, info.uid, info.gid = len(data), now, 1000, 1000
                info.mode = 0o755 if data.startswith(b"#!") else 0o644
                archive.addfile(info, io.BytesIO(data))
        cwd = state.cwd if state.cwd.startswith(sh.WORKSPACE) else sh.WORKSPACE
        result = self.exec(sh.IMPORT, posixpath.normpath(cwd), stdin=buffer.getvalue())
        if result.exit_code != 0:
            raise SandboxError(f"restoring the workspace failed: {text(result.stderr)[-500:]}")
        _cwd, listing = self._listing()
        self._cache = {
            p: (*listing[p], data)
            for p, data in state.files.items()
            if p in listing and listing[p][0] == len(data)
        }

    def snapshot_mark(self) -> str | None:
        self._mark = text(self.exec(sh.GET_MARK).stdout).strip() or None
        return self._mark

    def set_snapshot_mark(self, digest: str | None) -> None:
        if digest is not None and digest == self._mark:
            return  # unchanged workspace: the same snapshot again (one worker per turn)
        result = self.exec(sh.SET_MARK, digest or "")
        if result.exit_code != 0:
            raise SandboxError(f"recording the snapshot mark failed: {text(result.stderr)}")
        self._mark = digest
