"""The Docker sandbox's snapshots: the workspace exported to and imported from a
:class:`SandboxState`, and the mark naming the snapshot the workspace holds.

An export lists the workspace (files with size, times and mode, links with their target,
empty folders) and copies out only the files whose stat changed since the last one (the
cache of what was copied); an import writes one tar stream and sets the bash tool's cwd.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import time

from durable_harness.core.errors import SandboxError
from durable_harness.core.sandbox import Sandbox, SandboxState, check_state_paths
from durable_harness.core.tree import RACY_SECONDS
from durable_harness.sandbox.docker import scripts as sh
from durable_harness.sandbox.docker.exec import Commands, text


class _Listing:
    """What :data:`~.scripts.LIST` found: the time it ran, the bash tool's cwd, each
    regular file's stat key (size, mtime, ctime, mode), links and empty folders."""

    def __init__(self, stdout: bytes) -> None:
        fields = stdout.split(b"\0")
        self.time = float(fields[0] or 0)
        self.cwd = text(fields[1]).strip() or sh.WORKSPACE
        self.files: dict[str, tuple[int, str, str, int]] = {}
        self.links: dict[str, str] = {}
        self.dirs: set[str] = set()
        i = 2
        while i < len(fields) and fields[i]:
            kind, *stat = fields[i].split(b" ")
            rel = fields[i + 1].decode("utf-8", "surrogateescape")
            if kind == b"f":
                size, mtime, ctime, mode = stat
                self.files[rel] = (int(size), mtime.decode(), ctime.decode(), int(mode, 8))
                i += 2
            elif kind == b"l":
                self.links[rel] = fields[i + 2].decode("utf-8", "surrogateescape")
                i += 3
            else:
                self.dirs.add(rel)
                i += 2


class DockerState(Commands, Sandbox):
    """The snapshots of :class:`~durable_harness.sandbox.docker.DockerSandbox`."""

    max_snapshot_bytes: int
    # path -> (stat key, content) as last copied out, so export_state copies only the
    # files whose size, mtime, ctime or mode changed since (a chmod changes ctime and
    # mode; a write hidden by `touch -d` still changes ctime).
    _cache: dict[str, tuple[tuple[int, str, str, int], bytes]]
    _mark: str | None  # the mark as last read or written by this process

    def _listing(self) -> _Listing:
        result = self.exec(sh.LIST, max_output=1 << 30)
        if result.exit_code != 0:
            raise result.failure("listing the workspace")
        return _Listing(result.whole_stdout("listing the workspace"))

    def export_state(self) -> SandboxState:
        """Everything under ``/workspace`` (``.git`` included), sorted, and the bash
        tool's cwd: regular files with their executable bit, symbolic links (the target
        as ``readlink`` gives it: never followed) and empty directories.

        Only files whose size, mtime, ctime or mode changed since the last export are
        copied out of the container (a file changed just before the listing is copied
        again next time: :data:`~durable_harness.core.tree.RACY_SECONDS`). SandboxError
        if the files hold more than ``max_snapshot_bytes``.
        """
        listing = self._listing()
        total = sum(stat[0] for stat in listing.files.values())
        if total > self.max_snapshot_bytes:
            raise SandboxError(
                f"the workspace holds {total:,} bytes, more than a snapshot may "
                f"({self.max_snapshot_bytes:,}); remove build outputs or raise max_snapshot_bytes"
            )
        changed = [p for p, stat in listing.files.items() if self._cached(p) != stat]
        fetched: dict[str, bytes] = {}
        if changed:
            names = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in changed)
            size = sum(listing.files[p][0] for p in changed)
            result = self.exec(
                sh.EXPORT, stdin=names, max_output=2 * size + 1024 * (len(changed) + 4) + (1 << 20)
            )
            what = "copying the workspace out for a snapshot"
            data = result.whole_stdout(what)
            if not data:  # tar writes an end-of-archive block even when every file went
                raise result.failure(what)
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
                for member in archive:
                    handle = archive.extractfile(member) if member.isfile() else None
                    if handle is not None and member.name in listing.files:
                        fetched[member.name] = handle.read()
        cache: dict[str, tuple[tuple[int, str, str, int], bytes]] = {}
        files: dict[str, bytes] = {}
        for rel in sorted(listing.files):
            stat = listing.files[rel]
            if rel in fetched:
                content = fetched[rel]
            elif self._cached(rel) == stat:
                content = self._cache[rel][1]
            else:
                continue  # removed between the listing and the copy
            files[rel] = content
            if max(float(stat[1]), float(stat[2])) < listing.time - RACY_SECONDS:
                cache[rel] = (stat, content)
        self._cache = cache
        return SandboxState(
            files=files,
            cwd=listing.cwd,
            executable=frozenset(p for p in files if listing.files[p][3] & 0o100),
            links=dict(sorted(listing.links.items())),
            dirs=frozenset(listing.dirs),
        )

    def _cached(self, rel: str) -> tuple[int, str, str, int] | None:
        entry = self._cache.get(rel)
        return None if entry is None else entry[0]

    def import_state(self, state: SandboxState) -> None:
        """Replace the workspace with ``state`` (files 755 if executable, else 644; links
        as links, whatever they point at; empty directories) and set the bash tool's cwd,
        as the agent user; SandboxError (and no change) for a state with invalid paths
        (outside the workspace, or a file below a link)."""
        check_state_paths(
            {**state.files, **dict.fromkeys(state.links, b""), **dict.fromkeys(state.dirs, b"")}
        )
        buffer = io.BytesIO()
        now = time.time()
        members: list[tuple[str, bytes | None]] = [
            *state.files.items(),
            *((p, None) for p in (*state.links, *state.dirs)),
        ]
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for rel, data in sorted(members):
                info = tarfile.TarInfo(rel)
                info.mtime, info.uid, info.gid = now, 1000, 1000
                if data is not None:
                    info.size = len(data)
                    info.mode = 0o755 if rel in state.executable else 0o644
                    archive.addfile(info, io.BytesIO(data))
                elif rel in state.links:
                    info.type, info.linkname, info.mode = tarfile.SYMTYPE, state.links[rel], 0o777
                    archive.addfile(info)
                else:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    archive.addfile(info)
        cwd = state.cwd if state.cwd.startswith(sh.WORKSPACE) else sh.WORKSPACE
        result = self.exec(sh.IMPORT, posixpath.normpath(cwd), stdin=buffer.getvalue())
        if result.exit_code != 0:
            raise result.failure("restoring the workspace")
        # What was just written is known: the next export copies out only what changes.
        listing = self._listing()
        self._cache = {
            p: (listing.files[p], data)
            for p, data in state.files.items()
            if p in listing.files and listing.files[p][0] == len(data)
        }

    def snapshot_mark(self) -> str | None:
        self._mark = text(self.exec(sh.GET_MARK).stdout).strip() or None
        return self._mark

    def set_snapshot_mark(self, digest: str | None) -> None:
        if digest is not None and digest == self._mark:
            return  # unchanged workspace: the same snapshot again (one worker per turn)
        result = self.exec(sh.SET_MARK, digest or "")
        if result.exit_code != 0:
            raise result.failure("recording the snapshot mark")
        self._mark = digest
