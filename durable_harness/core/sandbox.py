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


def shell_text(data: bytes) -> str:
    """A command's output, losslessly: see :class:`ShellResult`."""
    return data.decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class ShellResult:
    """A command's result. ``stdout`` and ``stderr`` are its bytes decoded as UTF-8 with
    ``surrogateescape`` (:func:`shell_text`): a byte that is not UTF-8 is U+DC80..U+DCFF,
    so the journal records, and a replay returns, exactly what the command wrote; only
    what is sent to a model provider shows it as U+FFFD."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


def cap_timeout(timeout: float) -> tuple[float, str]:
    """``timeout`` lowered to the operator's ceiling (``DURABLE_HARNESS_MAX_TOOL_TIMEOUT``,
    default 600 s), and the note for the tool result when it was ("" otherwise). Every
    backend's ``bash`` calls it: the timeout comes from the model, and a command runs on
    a worker whose lease renews while it runs, so an unbounded one would hold it forever.
    Read from the environment on each call, as the sandbox has no Settings of its own.
    SandboxError for a timeout that is not positive."""
    if timeout <= 0:
        raise SandboxError(f"timeout must be positive, got {timeout}")
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
    """Everything a workspace needs to be rebuilt: files and shell cwd, and what git keeps
    besides file contents (so a repository's workspace comes back as git would check it
    out): the executable bit, symbolic links, and empty directories.

    ``executable`` names keys of ``files``; ``links`` maps a path (never a key of
    ``files``) to its target exactly as stored (a backend writes the link, never follows
    it); ``dirs`` names directories that hold nothing else in the state. A backend that
    cannot hold one of these (the virtual workspace has no symlinks) keeps what it can
    and says so in its docstring.
    """

    files: dict[str, bytes]
    cwd: str
    executable: frozenset[str] = frozenset()
    links: dict[str, str] = dataclasses.field(default_factory=dict)
    dirs: frozenset[str] = frozenset()


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
    def read(self, path: str) -> str:
        """The file's text, for the model: bytes that are not UTF-8 shown as U+FFFD."""

    @abc.abstractmethod
    def read_data(self, path: str) -> bytes:
        """The file's bytes, exactly (what :meth:`edit` changes)."""

    @abc.abstractmethod
    def write(self, path: str, content: str) -> None: ...

    def edit(self, path: str, old: str, new: str) -> None:
        """Replace the single occurrence of ``old`` with ``new``; SandboxError if ``old``
        is absent or occurs more than once (then the model must quote more context)."""
        if not old:
            raise SandboxError("edit: the text to replace is empty; give the exact text")
        data = self.read_data(path)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            # read() shows such bytes as U+FFFD; writing that text back would replace every
            # one of them in the file, not just the text the model asked to change.
            raise SandboxError(
                f"edit: {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                f"{exc.start}), and edit would rewrite its other bytes; the file is unchanged. "
                "Change it with the shell instead (sed, or iconv to convert it)"
            ) from None
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
