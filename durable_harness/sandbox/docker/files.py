"""The Docker sandbox's files: read and written by ``cat`` as the agent user.

``put_archive`` fails on a read-only root and writes as root, so every file operation is
a small script (:mod:`.scripts`) run in the container, confined to ``/workspace`` after
resolving symlinks there (``read_bytes`` / ``write_bytes`` also reach ``/home/agent`` and
``/tmp``, for a CLI's session record).
"""

from __future__ import annotations

import posixpath

from durable_harness.core.errors import SandboxError
from durable_harness.core.sandbox import Sandbox
from durable_harness.sandbox.docker import exec as docker_exec
from durable_harness.sandbox.docker import scripts as sh
from durable_harness.sandbox.docker.exec import Commands, text

#: The most a file read takes from the container (the cap of its exec's output). Past it
#: the read fails (``ExecResult.whole_stdout``): a file's contents are never cut.
READ_CAP = 1 << 31


class DockerFiles(Commands, Sandbox):
    """The file operations of :class:`~durable_harness.sandbox.docker.DockerSandbox`."""

    def _path(self, path: str) -> str:
        if not path or "\x00" in path:
            raise SandboxError(f"invalid path {path!r}")
        joined = path if path.startswith("/") else f"{sh.WORKSPACE}/{path}"
        full = "/" + posixpath.normpath(joined).lstrip("/")
        if full != sh.WORKSPACE and not full.startswith(sh.WORKSPACE + "/"):
            raise SandboxError(
                f"path {path!r} is outside the workspace {sh.WORKSPACE}; use a path relative to it"
            )
        return full

    def _file_error(self, op: str, path: str, result: docker_exec.ExecResult) -> SandboxError:
        code = result.exit_code
        if code == sh.NOT_FOUND:
            return SandboxError(f"{op}: no such file: {path}")
        if code == sh.OUTSIDE:
            return SandboxError(f"{op}: {path} leads outside the workspace {sh.WORKSPACE}")
        if code == sh.NOT_A_FILE:
            return SandboxError(f"{op}: {path} is a directory or not a regular file")
        detail = text(result.stderr).strip() or f"exit code {code}"
        return SandboxError(f"{op}: {path}: {detail}")

    def read(self, path: str) -> str:
        """The file's text; bytes that are not UTF-8 are shown as U+FFFD."""
        return text(self.read_data(path))

    def read_data(self, path: str) -> bytes:
        full = self._path(path)
        result = self.exec(sh.READ, full, max_output=READ_CAP)
        if result.exit_code != 0:
            raise self._file_error("read", path, result)
        return result.whole_stdout(f"read: {path}")

    def write(self, path: str, content: str) -> None:
        """Create or replace the file (and its parent directories) with ``content``."""
        full = self._path(path)
        result = self.exec(sh.WRITE, full, stdin=content.encode("utf-8"))
        if result.exit_code != 0:
            raise self._file_error("write", path, result)

    def read_bytes(self, path: str) -> bytes | None:
        """The bytes of a container file under ``/workspace``, ``/home/agent`` or ``/tmp``
        (for a CLI's session record), or None if there is none."""
        result = self.exec(sh.READ_ANY, path, max_output=READ_CAP)
        if result.exit_code == sh.NOT_FOUND:
            return None
        if result.exit_code != 0:
            raise self._file_error("read", path, result)
        return result.whole_stdout(f"reading {path}")

    def write_bytes(self, path: str, data: bytes) -> None:
        """Create or replace a container file under ``/workspace``, ``/home/agent`` or
        ``/tmp`` (restoring a CLI's session record), as the agent user."""
        result = self.exec(sh.WRITE_ANY, path, stdin=data)
        if result.exit_code != 0:
            raise self._file_error("write", path, result)
