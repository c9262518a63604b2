"""The local World's blob folder: content-addressed payloads, named by their sha256 hex.

``<data_dir>/blobs/ab/cdef...``: a blob is written to a temporary file, fsynced, renamed
into place and its directory fsynced, so a blob that ``put`` returned survives a power
cut; ``get`` checks the bytes against the name (a damaged file is a
:class:`CorruptJournal`, never wrong data).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from pathlib import Path

from durable_harness.core.errors import CorruptJournal, NotFound, WorldError

_DIGEST = re.compile(r"[0-9a-f]{64}")


class BlobFolder:
    """The blobs under ``root``, which the caller has created."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, digest: str) -> Path:
        if not _DIGEST.fullmatch(digest):
            # Also keeps a crafted digest like "../../x" from escaping the blob folder.
            raise NotFound(f"no blob {digest!r}: not a sha256 hex digest")
        return self.root / digest[:2] / digest[2:]

    def put(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.path(digest)
        if path.exists():
            return digest
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            _fsync_dir(path.parent)  # makes the rename itself survive a power cut
        except OSError as exc:
            raise WorldError(
                f"cannot write blob {digest} under {self.root}: {exc}; check that this user "
                "may write there and the disk is not full"
            ) from exc
        return digest

    def get(self, digest: str) -> bytes:
        path = self.path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise NotFound(f"no blob {digest} in {self.root}") from exc
        except OSError as exc:
            raise WorldError(f"cannot read blob {digest}: {exc}") from exc
        if hashlib.sha256(data).hexdigest() != digest:
            raise CorruptJournal(f"blob {digest} in {self.root} does not match its digest")
        return data


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return  # directories cannot be opened for fsync on Windows
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
