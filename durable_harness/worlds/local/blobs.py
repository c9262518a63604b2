"""The local World's blob folder: content-addressed payloads, named by their sha256 hex.

``<data_dir>/blobs/ab/cdef...``: a blob is written to a temporary file, fsynced, renamed
into place and its directory fsynced, so a blob that ``put`` returned survives a power
cut; ``get`` checks the bytes against the name (a damaged file is a
:class:`CorruptJournal`, never wrong data).

``gc`` (``runtime/gc.py``) and a ``put`` of a blob already there are ordered by an
advisory lock on the blob's file: the ``put`` takes it shared and *touches* the file (its
mtime becomes now: the blob's ``touched_at``), ``delete`` takes it exclusive and unlinks
the file only if it is still untouched since the sweep's cutoff. So a reuse either lands
first (the delete then keeps the blob) or finds the file unlinked (``st_nlink`` 0) and
writes it again: a ``put`` that returned always leaves the blob stored and fresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from durable_harness.core.errors import CorruptJournal, NotFound, WorldError
from durable_harness.core.retention import BlobInfo

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
        if self._touch(path):
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

    def _touch(self, path: Path) -> bool:
        """Mark a stored blob as just reused; False if it is not (or no longer) stored."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise WorldError(f"cannot open blob {path.name} under {self.root}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if os.fstat(fd).st_nlink == 0:
                return False  # gc unlinked it while this waited for the lock
            os.utime(fd)
            return True
        except OSError as exc:
            raise WorldError(
                f"cannot touch blob {path.name} under {self.root}: {exc}; every worker "
                "sharing the World folder must run as its owner"
            ) from exc
        finally:
            os.close(fd)

    def list(self) -> Iterator[BlobInfo]:
        """Every stored blob (temporary files of a write in progress left out)."""
        for folder in sorted(self.root.iterdir()):
            if len(folder.name) != 2 or not folder.is_dir():
                continue
            for entry in os.scandir(folder):
                digest = folder.name + entry.name
                if _DIGEST.fullmatch(digest):
                    with contextlib.suppress(FileNotFoundError):
                        info = entry.stat()
                        yield BlobInfo(digest, info.st_size, info.st_mtime)

    def delete(self, digest: str, touched_before: float) -> int | None:
        """Unlink the blob unless it was touched at or after ``touched_before``; its size,
        or None if it was kept or is gone (see the module docstring for the lock)."""
        path = self.path(digest)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            info = os.fstat(fd)
            if info.st_nlink == 0 or info.st_mtime >= touched_before:
                return None
            if os.stat(path).st_ino != info.st_ino:
                return None  # another file took the name: not the one checked
            os.unlink(path)
            return info.st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise WorldError(f"cannot delete blob {digest} under {self.root}: {exc}") from exc
        finally:
            os.close(fd)

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
