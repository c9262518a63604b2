"""The user's host tools served to OpenCode over MCP, keyed by OpenCode's call id.

OpenCode connects to the harness's MCP endpoint (``/mcp`` on the journaling proxy) as a
remote MCP server named ``durable-harness`` and names its tools ``durable-harness_<name>``.
Unlike Claude Code, it does not send the model's tool_use id with ``tools/call``, but the
journaling plugin's ``tool.execute.before`` runs first and carries it (``callID``). So
:class:`CallIds` remembers, per ``(tool, arguments)``, the call ids the plugin announced,
and :class:`OpenCodeHostTools` gives the oldest one not yet served to the MCP call with
the same tool and arguments: the step is keyed ``tool:<callID>`` as every other tool call,
and journaled by :class:`~.mcp.HostToolServer` under the tool's own replay label.

An announcement is only a PreToolUse, which any process holding the token can post again
for a model-made id that already ran. Such a spent id must not take the place of a later
call with the same arguments (that call would get the old result and never run), so a
served id (claimed in this worker, or with an outcome in the journal) is passed over while
a fresh one waits; it is paired only when nothing else is, and then gets its recorded
result, never a second run.

A call posted again by the stdio relay (``dh-mcp.js``, in Docker) after its worker died
finds no announcement in the new worker: it takes the id of the interrupted call with
the same tool and arguments, an intent in the journal (:meth:`OpenCodeHostTools.
_interrupted`), and is answered from it.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

from durable_harness.adapters.cli.host import stored_input
from durable_harness.adapters.cli.mcp import SERVER_NAME, TOOL_USE_META, HostToolServer
from durable_harness.core.canonical import canonical_json
from durable_harness.core.keys import tool_key, tool_use_id_of
from durable_harness.core.types import StepStatus

__all__ = ["HOST_TOOL_PREFIX", "CallIds", "OpenCodeHostTools"]

#: How OpenCode names a tool of the MCP server ``durable-harness``.
HOST_TOOL_PREFIX = f"{SERVER_NAME}_"


class CallIds:
    """Call ids of host tool calls the plugin announced, waiting for their MCP call."""

    def __init__(self) -> None:
        self._pending: dict[tuple[str, str], deque[str]] = defaultdict(deque)
        self._lock = threading.Lock()

    def announce(self, name: str, arguments: Any, call_id: str) -> None:
        with self._lock:
            self._pending[(name, _arguments_key(arguments))].append(call_id)

    def claim(
        self, name: str, arguments: Any, served: Callable[[str], bool] = lambda _: False
    ) -> str | None:
        """The oldest announced id for this call not ``served`` yet, else the oldest one
        (None: nothing announced)."""
        with self._lock:
            waiting = self._pending.get((name, _arguments_key(arguments)))
            if not waiting:
                return None
            fresh = next((i for i in waiting if not served(i)), waiting[0])
            waiting.remove(fresh)
            return fresh

    def control(
        self, inner: Callable[[str, dict[str, Any]], dict[str, Any]]
    ) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
        """Wrap the hooks' ``/_dh/<event>`` handler: note host calls' ids on the way."""

        def handle(event: str, payload: dict[str, Any]) -> dict[str, Any]:
            reply = inner(event, payload)
            name = str(payload.get("tool_name") or "")
            # Announced once the hooks allowed it (the MCP call comes only after the
            # plugin has the answer): a refused, made-up id never reaches an MCP call.
            if event == "PreToolUse" and name.startswith(HOST_TOOL_PREFIX) and _allowed(reply):
                call_id = str(payload.get("tool_use_id") or "")
                if call_id:
                    self.announce(
                        name.removeprefix(HOST_TOOL_PREFIX), payload.get("tool_input"), call_id
                    )
            return reply

        return handle


class OpenCodeHostTools(HostToolServer):
    """:class:`~.mcp.HostToolServer` with the call id taken from :class:`CallIds`."""

    def __init__(self, *args: Any, call_ids: CallIds, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.call_ids = call_ids

    def call(self, params: dict[str, Any]) -> dict[str, Any]:
        meta = dict(params.get("_meta") or {})
        if not meta.get(TOOL_USE_META):
            name, arguments = str(params.get("name") or ""), params.get("arguments")
            call_id = self.call_ids.claim(name, arguments, self._served)
            if call_id is None:
                call_id = self._interrupted(name, arguments)
            if call_id is not None:
                meta[TOOL_USE_META] = call_id
        return super().call({**params, "_meta": meta})

    def _interrupted(self, name: str, arguments: Any) -> str | None:
        """The id of a call of this tool with these arguments that an earlier worker
        began and never finished (an intent in the journal; a model-made id this worker
        has not served): OpenCode's call posted again by the stdio relay after that
        worker died, whose announcement died with it. Answered as any call with that id
        (a ``never`` tool *possibly ran*, a ``safe`` one runs again)."""
        wanted = _arguments_key(arguments)
        for step in sorted(self.journal.recorded.values(), key=lambda s: s.seq):
            if step.kind != "tool" or step.name != name or step.status is not StepStatus.INTENT:
                continue
            call_id = tool_use_id_of(step.key)
            if self.ledger is not None and (
                self.ledger.claimed(call_id) or self.ledger.find(call_id) is None
            ):
                continue
            stored = json.loads(stored_input(self.journal.world, step))
            if _arguments_key(stored) == wanted:
                return call_id
        return None

    def _served(self, call_id: str) -> bool:
        """Whether the call ``call_id`` was already served: claimed in this worker, or
        finished in the journal (by this worker or an earlier one)."""
        if self.ledger is not None and self.ledger.claimed(call_id):
            return True
        recorded = self.journal.lookup(tool_key(call_id))
        return recorded is not None and recorded.status is not StepStatus.INTENT


def _allowed(reply: dict[str, Any]) -> bool:
    decision = (reply.get("hookSpecificOutput") or {}).get("permissionDecision")
    return decision != "deny"


def _arguments_key(arguments: Any) -> str:
    try:
        return canonical_json(arguments or {})
    except TypeError:
        return repr(arguments)
