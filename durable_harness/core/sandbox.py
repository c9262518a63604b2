"""The Sandbox seam: where an agent's file and shell tools act.

Backends: ``virtual`` (in-memory files and a bash-compatible interpreter, no network, no
host binaries), ``local`` (a host folder and a persistent shell), ``docker`` (one hardened
container per session, its workspace on a volume).

Contract:

* ``read``/``write``/``edit``/``bash`` act on the workspace; paths are relative to the
  workspace root (absolute paths are taken inside it). Errors the agent should see (file
  missing, edit text not found, a cap reached) raise :class:`SandboxError` subclasses;
  the core turns them into tool error results.
* ``journaled`` tells the core whether the workspace lives only in memory. If it does,
  the core snapshots it after every tool step (``export_state``) and restores it on
  resume (``import_state``), so a resumed turn sees exactly the files it had; its tools
  can then replay as ``safe`` because their effects vanish with the process.
* ``snapshots`` tells the core that the workspace outlives the process but may be lost
  with its machine (a container's volume). The core saves ``export_state`` to the World at
  step boundaries and records each digest with :meth:`Sandbox.set_snapshot_mark` inside the
  workspace; on start it restores the newest snapshot only if
  :meth:`Sandbox.snapshot_mark` differs (the workspace is new, or stale because the
  session went on elsewhere). Tools still replay as on a host folder: effects persist.
  See :func:`durable_harness.harness.workspace.restore_workspace`.
"""

from __future__ import annotations

import abc
import dataclasses
import posixpath
from dataclasses import dataclass

from durable_harness.core.closing import Closing
from durable_harness.core.errors import SandboxError
from durable_harness.core.settings import Settings


@dataclass(frozen=True)
class ShellResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


def cap_timeout(timeout: float) -> tuple[float, str]:
    """``timeout`` lowered to the operator's ceiling (``DURABLE_HARNESS_MAX_TOOL_TIMEOUT``,
    default 600 s), and the note for the tool result when it was ("" otherwise). Every
    backend's ``bash`` calls it: the timeout comes from the model, and a command runs on
    a worker whose lease renews while it runs, so an unbounded one would hold it forever.
    Read from the environment on each call, as the sandbox has no Settings of its own."""
    ceiling = Settings.load().max_tool_timeout
    if timeout <= ceiling:
        return timeout, ""
    return ceiling, (
        f"bash: the timeout of {timeout:g}s was capped at {ceiling:g}s "
        "(the operator's limit, DURABLE_HARNESS_MAX_TOOL_TIMEOUT)\n"
    )


def noted(result: ShellResult, note: str) -> ShellResult:
    """``result`` with ``note`` (from :func:`cap_timeout`) at the start of its stderr."""
    return dataclasses.replace(result, stderr=note + result.stderr) if note else result


@dataclass(frozen=True)
class SandboxState:
    """Everything a journaled sandbox needs to be rebuilt: files and shell cwd."""

    files: dict[str, bytes]
    cwd: str


def check_state_paths(files: dict[str, bytes]) -> None:
    """SandboxError unless every key is a clean relative path and no file is also a
    directory of another file. Backends call it before ``import_state`` changes anything,
    so a state that cannot be restored leaves the workspace as it was."""
    for rel in files:
        if (
            not rel
            or "\x00" in rel
            or rel.startswith("/")
            or posixpath.normpath(rel) != rel
            or rel.split("/")[0] in (".", "..")
        ):
            raise SandboxError(f"invalid path in workspace state: {rel!r}")
        parent = posixpath.dirname(rel)
        while parent:
            if parent in files:
                raise SandboxError(f"invalid workspace state: {parent!r} is a file and a directory")
            parent = posixpath.dirname(parent)


class Sandbox(abc.ABC, Closing):
    journaled: bool = False
    snapshots: bool = False

    @abc.abstractmethod
    def read(self, path: str) -> str: ...

    @abc.abstractmethod
    def write(self, path: str, content: str) -> None: ...

    def edit(self, path: str, old: str, new: str) -> None:
        """Replace the single occurrence of ``old`` with ``new``; SandboxError if ``old``
        is absent or occurs more than once (then the model must quote more context)."""
        if not old:
            raise SandboxError("edit: the text to replace is empty; give the exact text")
        text = self.read(path)
        found = text.count(old)
        if found == 0:
            raise SandboxError(
                f"edit: the text to replace was not found in {path}; "
                "read the file and copy the text exactly"
            )
        if found > 1:
            raise SandboxError(
                f"edit: the text to replace occurs {found} times in {path}; "
                "include more surrounding lines so it occurs once"
            )
        self.write(path, text.replace(old, new, 1))

    @abc.abstractmethod
    def bash(self, command: str, timeout: float = 60.0) -> ShellResult: ...

    def export_state(self) -> SandboxState:
        raise NotImplementedError(f"{type(self).__name__} is not journaled")

    def import_state(self, state: SandboxState) -> None:
        raise NotImplementedError(f"{type(self).__name__} is not journaled")

    def snapshot_mark(self) -> str | None:
        """The digest of the World snapshot this workspace last matched (``snapshots``
        sandboxes only); None for a new workspace."""
        return None

    def set_snapshot_mark(self, digest: str | None) -> None:
        """Record that the workspace now matches snapshot ``digest`` (None: forget)."""

    def close(self) -> None:
        """Stop shells and free resources."""
