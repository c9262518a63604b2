"""Commands in a container over the Docker API, with what ``exec_run`` lacks.

docker-py's ``exec_run`` cannot send stdin, has no deadline of its own (a silent command
hits the HTTP read timeout instead) and keeps unbounded output in memory. Here:

* :func:`run` sends ``stdin`` (file contents, tar streams) while it reads, so neither side
  blocks on a full pipe; stops reading at a deadline (``timed_out``; the process itself is
  stopped inside the container, by the command's own ``timeout``); keeps stdout and stderr
  apart (the multiplexed stream of a non-tty exec) and keeps at most ``max_output`` bytes
  of each: the head and the tail, with a note of what was left out in between;
* :func:`stream` yields stdout chunks as they come, for following a file (``tail -f``);
  closing the generator closes the connection, and the process in the container then
  dies of SIGPIPE on its next write.

Both speak the raw exec protocol on the hijacked connection (docker-py exposes no public
way to write stdin and read with a deadline); Docker errors are left to the caller, which
maps them at the sandbox's boundary.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from durable_harness.core.errors import SandboxError

__all__ = ["ExecResult", "run", "stream"]

_CHUNK = 65536
_HEADER = struct.Struct(">BxxxL")  # stream id (1 stdout, 2 stderr), payload length
_STDOUT, _STDERR = 1, 2


@dataclass(frozen=True)
class ExecResult:
    """``exit_code`` is None when the deadline passed first (``timed_out``)."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    #: Bytes of stdout left out by the cap (a note in ``stdout`` marks where).
    stdout_cut: int = 0
    #: The runtime refused to start the process (Docker recorded an exit code but no
    #: pid, e.g. 126 "OCI runtime exec failed: ... write init-p: broken pipe" on a loaded
    #: machine): nothing of the command ran. Only Docker sets it; no output can forge it.
    refused: bool = False

    def whole_stdout(self, what: str) -> bytes:
        """``stdout`` when nothing was left out of it; SandboxError otherwise. For the
        reads whose output is data, not text for the model (a file's contents, a session
        record, a snapshot's tar or listing): the note the cap puts in would become part
        of the data, and a record or snapshot saved so would be taken for whole."""
        if self.stdout_cut:
            raise SandboxError(
                f"{what}: the output was cut by {self.stdout_cut:,} bytes at the read's cap "
                "(the data grew while it was read, or is larger than a read may be); "
                "nothing was taken from it"
            )
        if self.timed_out:
            raise SandboxError(f"{what}: the read timed out before its end; nothing was taken")
        return self.stdout

    def said(self) -> str:
        """What the exec printed, for an error: its stderr, else its stdout (where Docker
        puts the runtime's own error, e.g. "OCI runtime exec failed")."""
        said = (self.stderr or self.stdout).decode(errors="replace").strip()
        return said[-500:] or "nothing on stdout or stderr"

    def failure(self, what: str) -> SandboxError:
        """The error for a script that did not end with exit code 0: how it ended (an exit
        code, a timeout, or no exit code recorded) and what it printed."""
        ended = (
            "timed out"
            if self.timed_out
            else "no exit code"
            if self.exit_code is None
            else f"exit code {self.exit_code}"
        )
        return SandboxError(f"{what} failed ({ended}): {self.said()}")


class Commands:
    """What the Docker sandbox's facets (:mod:`.files`, :mod:`.state`) run their scripts
    with: :meth:`~durable_harness.sandbox.docker.DockerSandbox.exec`, which runs
    ``bash -c script dh args…`` in the container as the agent user."""

    exec: Callable[..., ExecResult]


def text(data: bytes) -> str:
    """A command's output as text; bytes that are not UTF-8 become U+FFFD."""
    return data.decode("utf-8", errors="replace")


class _Capped:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        excess = len(self.tail) - self.half
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def value(self) -> bytes:
        if not self.dropped:
            return bytes(self.head + self.tail)
        note = f"\n[... {self.dropped} bytes of output left out ...]\n".encode()
        return bytes(self.head) + note + bytes(self.tail)


class _Frames:
    """Splits the multiplexed exec stream into (stream id, payload) frames."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        self.buffer += data
        while len(self.buffer) >= _HEADER.size:
            kind, size = _HEADER.unpack_from(self.buffer)
            end = _HEADER.size + size
            if len(self.buffer) < end:
                return
            payload = bytes(self.buffer[_HEADER.size : end])
            del self.buffer[:end]
            yield kind, payload


def _start(
    api: Any,
    container_id: str,
    command: list[str],
    *,
    stdin: bool,
    user: str,
    environment: dict[str, str] | None,
    workdir: str | None,
) -> tuple[str, socket.socket, bytes, Any]:
    """Create and start an exec; return its id, the raw socket (non-blocking), bytes the
    HTTP reader had already buffered past the headers, and the response (kept alive)."""
    exec_id = api.exec_create(
        container_id,
        command,
        stdin=stdin,
        stdout=True,
        stderr=True,
        user=user,
        environment=environment,
        workdir=workdir,
    )["Id"]
    response = api._post_json(
        api._url("/exec/{0}/start", exec_id),
        headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        data={"Tty": False, "Detach": False},
        stream=True,
    )
    api._raise_for_status(response)
    reader = response.raw._fp.fp  # the buffered reader http.client parsed headers with
    sock: socket.socket = getattr(reader.raw, "_sock", reader.raw)
    sock.setblocking(False)
    # http.client may have read stream bytes together with the headers; they sit in the
    # reader's buffer, not in the socket. peek() on a non-blocking socket never waits.
    leftover = reader.peek() if reader.raw is not None else b""
    if leftover:
        reader.read(len(leftover))
    return exec_id, sock, leftover, response


#: How long after its stream ends an exec's exit code may take to be recorded. Usually
#: milliseconds; on a loaded machine dockerd has been seen to take over 2 s (the old
#: wait), and a None read as a failure made a command that had succeeded fail.
EXIT_CODE_WAIT_S = 30.0


def _ended(api: Any, exec_id: str, within: float = EXIT_CODE_WAIT_S) -> tuple[int | None, bool]:
    """The exec's exit code, once Docker has recorded it (shortly after the stream ends),
    and whether the runtime refused to start it (an exit code with pid 0: Docker sets the
    pid only once the process runs); None if no code is recorded ``within`` seconds (a
    process that closed its output and went on running)."""
    deadline = time.monotonic() + within
    pause = 0.01
    while True:
        info = api.exec_inspect(exec_id)
        if not info.get("Running") and info.get("ExitCode") is not None:
            return int(info["ExitCode"]), not info.get("Pid")
        if time.monotonic() >= deadline:
            return None, False
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


def run(
    api: Any,
    container_id: str,
    command: list[str],
    *,
    stdin: bytes | None = None,
    user: str,
    environment: dict[str, str] | None = None,
    workdir: str | None = None,
    timeout: float = 60.0,
    max_output: int = 1 << 20,
) -> ExecResult:
    """Run ``command`` to its end (or to ``timeout`` seconds) and return its result."""
    exec_id, sock, leftover, response = _start(
        api,
        container_id,
        command,
        stdin=stdin is not None,
        user=user,
        environment=environment,
        workdir=workdir,
    )
    out, err = _Capped(max_output), _Capped(max_output)
    frames = _Frames()
    pending = memoryview(stdin or b"")
    deadline = time.monotonic() + timeout
    selector = selectors.DefaultSelector()
    try:
        events = selectors.EVENT_READ
        if stdin is not None:
            events |= selectors.EVENT_WRITE
        selector.register(sock, events)
        for kind, payload in frames.feed(leftover):
            (out if kind == _STDOUT else err).add(payload)
        writing = stdin is not None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return ExecResult(None, out.value(), err.value(), True, out.dropped)
            for _key, mask in selector.select(min(remaining, 1.0)):
                if writing and mask & selectors.EVENT_WRITE:
                    try:
                        sent = sock.send(pending[:_CHUNK])
                        pending = pending[sent:]
                    except BlockingIOError:
                        pass
                    except (BrokenPipeError, ConnectionResetError):
                        pending = pending[:0]  # the process stopped reading: read its answer
                    if not pending:
                        writing = False
                        # EOF on the process's stdin; the connection stays open for output.
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_WR)
                        selector.modify(sock, selectors.EVENT_READ)
                if mask & selectors.EVENT_READ:
                    try:
                        data = sock.recv(_CHUNK)
                    except BlockingIOError:
                        continue
                    except ConnectionResetError:
                        # The process ended without reading all of its stdin (a write
                        # refused up front): dockerd then resets the stream instead of
                        # closing it. Its exit code says what happened.
                        data = b""
                    if not data:
                        code, refused = _ended(api, exec_id)
                        return ExecResult(
                            code, out.value(), err.value(), False, out.dropped, refused
                        )
                    for kind, payload in frames.feed(data):
                        (out if kind == _STDOUT else err).add(payload)
    finally:
        selector.close()
        sock.close()
        response.close()


def stream(
    api: Any,
    container_id: str,
    command: list[str],
    *,
    user: str,
    environment: dict[str, str] | None = None,
    idle: float = 1.0,
) -> Generator[bytes, None, int | None]:
    """Yield the command's stdout as it comes, until it ends (stderr is dropped); the
    generator's return value is the command's exit code, as Docker reports it.

    Yields ``b""`` after every ``idle`` seconds without output, so the caller can check
    its own deadline; closing the generator closes the connection.
    """
    exec_id, sock, leftover, response = _start(
        api, container_id, command, stdin=False, user=user, environment=environment, workdir=None
    )
    frames = _Frames()
    selector = selectors.DefaultSelector()
    try:
        selector.register(sock, selectors.EVENT_READ)
        for kind, payload in frames.feed(leftover):
            if kind == _STDOUT:
                yield payload
        while True:
            if not selector.select(idle):
                yield b""
                continue
            try:
                data = sock.recv(_CHUNK)
            except BlockingIOError:
                continue
            if not data:
                break
            for kind, payload in frames.feed(data):
                if kind == _STDOUT:
                    yield payload
    finally:
        selector.close()
        sock.close()
        response.close()
    return _ended(api, exec_id)[0]
