"""The ``fs/*`` and ``terminal/*`` requests of an ACP agent, served from the turn's
sandbox as journaled steps.

Each request the client serves is one journal step of kind ``tool`` named by its ACP
method, keyed by :func:`~durable_harness.core.keys.acp_request_key` (the method, the
hash of its parameters without the session id, and how many equal requests came before
it in the turn), so the same request asked again after a resume is found again:

* a finished one is answered from the journal (the call does not run again);
* an interrupted ``never`` one (a write, a command) is answered *possibly ran*, with the
  text every adapter gives (:data:`~durable_harness.harness.journal.POSSIBLY_RAN_MESSAGE`);
  an interrupted ``safe`` one (a read) runs again.

Replay labels: ``fs/read_text_file`` is ``safe``; ``fs/write_text_file`` and
``terminal/create`` are ``never`` unless the agent config marks them safe
(``[replay] tools``, by method name). Paths are the sandbox's: inside the workspace
only (the sandbox refuses ``..`` and symlinks leading out). ``terminal/create`` runs the
command to its end inside its step (the operator's tool timeout caps it), keeps at most
``outputByteLimit`` (and never more than :data:`MAX_OUTPUT`) bytes of its output, the
end kept as ACP asks, and answers ``terminal/output``/``wait_for_exit`` from that; a
``kill`` finds it ended, a ``release`` forgets it (at most :data:`MAX_TERMINALS` are kept
until released).
"""

from __future__ import annotations

import shlex
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from durable_harness.core.errors import SandboxError
from durable_harness.core.keys import acp_request_key, input_digest
from durable_harness.core.sandbox import Sandbox
from durable_harness.core.types import Replay, StepStatus
from durable_harness.harness.journal import Journal, Outcome, StepResult

__all__ = [
    "FS_READ",
    "FS_WRITE",
    "MAX_OUTPUT",
    "TERMINAL_CREATE",
    "Refused",
    "SandboxRequests",
    "command_line",
]

FS_READ = "fs/read_text_file"
FS_WRITE = "fs/write_text_file"
TERMINAL_CREATE = "terminal/create"
#: Bytes of a command's output kept (the end of it), whatever the agent asks for.
MAX_OUTPUT = 1024 * 1024
#: The largest file a read returns.
MAX_READ = 16 * 1024 * 1024
#: Terminals kept at once (each holds its command's output until released).
MAX_TERMINALS = 64
DEFAULT_LABELS: dict[str, Replay] = {FS_READ: "safe", FS_WRITE: "never", TERMINAL_CREATE: "never"}


class Refused(Exception):
    """A request the client answers with a JSON-RPC error (its message is the text)."""


class SandboxRequests:
    """Serves one launch's ``fs/*`` and ``terminal/*`` requests (blocking; thread-safe).

    ``sandbox()`` opens the turn's sandbox (once, on the first request); ``labels``
    override the default replay labels by method; ``outcome_meta()`` joins each
    outcome's meta (the workspace snapshot in a container); ``timeout`` caps a command.
    """

    def __init__(
        self,
        journal: Journal,
        sandbox: Callable[[], AbstractContextManager[Sandbox]],
        *,
        labels: dict[str, Replay] | None = None,
        outcome_meta: Callable[[], dict[str, Any]] | None = None,
        timeout: float = 600.0,
        before_intent: Callable[[], None] | None = None,
    ) -> None:
        self.journal = journal
        self._open = sandbox
        self._opened: AbstractContextManager[Sandbox] | None = None
        self._sandbox: Sandbox | None = None
        self.labels = {**DEFAULT_LABELS, **(labels or {})}
        self.outcome_meta = outcome_meta
        self.timeout = timeout
        #: Runs before a new step's intent (the launcher saves the session record, so a
        #: resume finds the agent's conversation up to this request).
        self.before_intent = before_intent
        self._seen: Counter[tuple[str, str]] = Counter()
        self._terminals: dict[str, dict[str, Any]] = {}
        self._made = 0
        self._lock = threading.Lock()

    # -- the journaled requests ------------------------------------------------------

    def read(self, params: dict[str, Any]) -> dict[str, Any]:
        value = self._step(FS_READ, params, lambda sb: self._read(sb, params))
        return {"content": str(value.get("content", ""))}

    def write(self, params: dict[str, Any]) -> dict[str, Any]:
        self._step(FS_WRITE, params, lambda sb: self._write(sb, params))
        return {}

    def create_terminal(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if len(self._terminals) >= MAX_TERMINALS:
                raise Refused(
                    f"{MAX_TERMINALS} terminals are open: release one before creating another"
                )
        value = self._step(TERMINAL_CREATE, params, lambda sb: self._command(sb, params))
        with self._lock:
            self._made += 1
            terminal_id = f"term-{self._made}"
            self._terminals[terminal_id] = value
        return {"terminalId": terminal_id}

    # -- the terminal's other methods: answered from the recorded run ------------------

    def terminal_output(self, params: dict[str, Any]) -> dict[str, Any]:
        run = self._terminal(params)
        return {
            "output": run.get("output", ""),
            "truncated": bool(run.get("truncated")),
            "exitStatus": run.get("exitStatus"),
        }

    def wait_for_exit(self, params: dict[str, Any]) -> dict[str, Any]:
        status = self._terminal(params).get("exitStatus") or {}
        return {"exitCode": status.get("exitCode"), "signal": status.get("signal")}

    def kill(self, params: dict[str, Any]) -> dict[str, Any]:
        self._terminal(params)  # it ran to its end inside its step
        return {}

    def release(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._terminals.pop(str(params.get("terminalId")), None)
        return {}

    def close(self) -> None:
        opened, self._opened, self._sandbox = self._opened, None, None
        if opened is not None:
            opened.__exit__(None, None, None)

    # -- helpers ----------------------------------------------------------------------

    def _terminal(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            run = self._terminals.get(str(params.get("terminalId")))
        if run is None:
            raise Refused(f"no such terminal: {params.get('terminalId')!r}")
        return run

    def _step(
        self, method: str, params: dict[str, Any], call: Callable[[Sandbox], dict[str, Any]]
    ) -> dict[str, Any]:
        request = {k: v for k, v in params.items() if k not in ("sessionId", "_meta")}
        digest = input_digest(request)
        with self._lock:
            occurrence = self._seen[(method, digest)]
            self._seen[(method, digest)] += 1
        key = acp_request_key(method, digest, occurrence)
        if self.before_intent is not None and self.journal.lookup(key) is None:
            self.before_intent()
        begun = self.journal.begin_keyed(
            kind="tool",
            name=method,
            key=key,
            input=request,
            replay=self.labels[method],
            store_input=True,
        )
        if isinstance(begun, StepResult):
            return self._recorded(method, begun)
        try:
            value = call(self.sandbox())
        except SandboxError as exc:
            value = {"error": str(exc)}
        meta: dict[str, Any] = {"source": "acp"}
        if self.outcome_meta is not None:
            meta.update(self.outcome_meta())
        self.journal.end(begun, Outcome(value, meta))
        if "error" in value:
            raise Refused(str(value["error"]))
        return value

    def _recorded(self, method: str, result: StepResult) -> dict[str, Any]:
        if result.status is StepStatus.POSSIBLY_RAN:
            message = str(result.value)
            if method == TERMINAL_CREATE:  # the agent reads a command's result as output
                return {"output": message, "truncated": False, "exitStatus": None}
            raise Refused(message)
        value = result.value if isinstance(result.value, dict) else {}
        if "error" in value:
            raise Refused(str(value["error"]))
        return value

    def sandbox(self) -> Sandbox:
        with self._lock:
            if self._sandbox is None:
                self._opened = self._open()
                self._sandbox = self._opened.__enter__()
            return self._sandbox

    def _read(self, sandbox: Sandbox, params: dict[str, Any]) -> dict[str, Any]:
        data = sandbox.read_data(_path(params))
        if len(data) > MAX_READ:
            raise SandboxError(f"read: {params.get('path')} is larger than {MAX_READ} bytes")
        text = data.decode("utf-8", "replace")
        line, limit = params.get("line"), params.get("limit")
        if isinstance(line, int) or isinstance(limit, int):
            lines = text.splitlines(keepends=True)
            start = max((line if isinstance(line, int) else 1) - 1, 0)
            end = start + limit if isinstance(limit, int) and limit >= 0 else None
            text = "".join(lines[start:end])
        return {"content": text}

    def _write(self, sandbox: Sandbox, params: dict[str, Any]) -> dict[str, Any]:
        content = params.get("content")
        if not isinstance(content, str):
            raise SandboxError("write: the request has no text content")
        sandbox.write(_path(params), content)
        return {}

    def _command(self, sandbox: Sandbox, params: dict[str, Any]) -> dict[str, Any]:
        command = params.get("command")
        if not isinstance(command, str) or not command:
            raise SandboxError("terminal/create: the request has no command")
        result = sandbox.bash(command_line(command, params), timeout=self.timeout)
        limit = params.get("outputByteLimit")
        cap = min(limit, MAX_OUTPUT) if isinstance(limit, int) and limit >= 0 else MAX_OUTPUT
        data = (result.stdout + result.stderr).encode("utf-8", "surrogateescape")
        truncated = len(data) > cap
        kept = data[len(data) - cap :] if truncated else data
        exit_code = None if result.timed_out else result.exit_code
        return {
            "output": kept.decode("utf-8", "ignore"),
            "truncated": truncated,
            "exitStatus": {"exitCode": exit_code, "signal": "SIGINT" if result.timed_out else None},
        }


def _path(params: dict[str, Any]) -> str:
    path = params.get("path")
    if not isinstance(path, str) or not path:
        raise SandboxError("the request names no file")
    return path


def command_line(command: str, params: dict[str, Any]) -> str:
    """The bash line a ``terminal/create`` runs: ``command`` and its ``args`` (quoted), or,
    without args, ``command`` as a shell line (claude-code-acp sends its Bash tool's whole
    line so); ``env`` for the whole of it, in a ``bash -c`` of its own (an ``env`` prefix
    would reach only the line's first simple command: ``env A=1 x=$(…) && y`` runs
    ``env`` with ``x`` as a variable and ``y`` without ``A``); then ``cwd``."""
    args = [str(a) for a in params.get("args") or []]
    env = [
        f"{e.get('name')}={e.get('value', '')}"
        for e in params.get("env") or []
        if isinstance(e, dict) and str(e.get("name", "")).isidentifier()
    ]
    line = shlex.join([command, *args]) if args else command
    if env:
        line = f"env {shlex.join(env)} bash -c {shlex.quote(line)}"
    cwd = params.get("cwd")
    if isinstance(cwd, str) and cwd:
        line = f"cd {shlex.quote(cwd)} && {line}"
    return line
