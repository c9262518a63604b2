"""The agent's own tools, journaled at ``session/request_permission`` (the pre-tool
hook) through the CLI agents' :class:`~.cli.hooks.ToolHooks`.

An ACP agent runs most tools itself and asks the client before each one that changes
something (the presets set the agent's permissions to *ask*). The request names the
call by its ``toolCallId``, which is the model's tool-use id (OpenCode, the Claude and
Codex ACP agents pass it through), so the hooks' ledger finds the model's call, its
name and input, and the step is keyed ``tool:<id>`` like every CLI's:

* the hooks allow it (intent committed first): the first ``allow_once`` option;
* they deny it (already finished, possibly ran, not a call the model made, or a tool the
  agent config denies): the first ``reject_once`` option, or ``cancelled`` without one;

and the outcome is the ``tool_call_update`` whose status is ``completed`` or ``failed``
(its ``rawOutput``, else its content), read from ``session/update``.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from typing import Any

from pydantic import Field

from durable_harness.adapters.cli.hooks import AgentConfig, ReplayPolicy, ToolHooks
from durable_harness.adapters.cli.mcp import host_names
from durable_harness.core.types import Replay

__all__ = ["AcpConfig", "AcpReplayPolicy", "PermissionHook"]


class AcpConfig(AgentConfig):
    """The ``--agent-config`` of an ACP agent: the CLI agents' ``[replay]`` table (by the
    agent's tool names, and by ACP method for ``fs/write_text_file``/``terminal/create``),
    and ``deny``: tools of the agent's own whose permission request is rejected."""

    deny: list[str] = Field(default_factory=list)


class AcpReplayPolicy(ReplayPolicy):
    """An ACP agent's tool names under the CLI rules: a preset's read-only tools are
    ``safe``, a shell tool's command is ``safe`` when a ``safe_bash`` pattern matches it,
    every other tool is ``never``; ``[replay] tools`` overrides by name (the ACP methods
    the client serves, ``fs/write_text_file`` and ``terminal/create``, included)."""

    def __init__(self, config: Any, safe_tools: frozenset[str]) -> None:
        super().__init__(config)
        self.safe_tools = safe_tools

    def label(self, tool_name: str, tool_input: Any) -> Replay:
        override = self.config.replay.tools.get(tool_name)
        if override is not None:
            return override
        command = tool_input.get("command", "") if isinstance(tool_input, dict) else ""
        if tool_name in ("bash", "Bash", "shell", "exec_command") and self.safe_command(
            str(command).strip()
        ):
            return "safe"
        if tool_name == "fs/read_text_file":
            return "safe"
        return "safe" if tool_name in self.safe_tools else "never"


class PermissionHook:
    """``session/request_permission`` and the tool updates, for one launch."""

    def __init__(
        self,
        hooks: ToolHooks,
        denied: frozenset[str] = frozenset(),
        served: frozenset[str] = frozenset(),
    ) -> None:
        self.hooks = hooks
        self.denied = denied
        self.served = served  # the preset's client_served_tools
        self.names: dict[str, str] = {}  # toolCallId -> the tool's name at its first report
        #: Host tool name -> the ids of its allowed permission requests, oldest first:
        #: the MCP call that follows gets its id (:meth:`take_host_call`).
        self._host_calls: defaultdict[str, deque[str]] = defaultdict(deque)
        #: Outcomes being recorded now (the workspace snapshot first, in a container).
        self._ending: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def settle(self, call_ids: list[str], timeout: float) -> None:
        """Wait until the outcomes of ``call_ids`` being recorded now are in the journal: a
        model request quoting their results is keyed by those outcomes, as its replay is."""
        with self._lock:
            ending = [self._ending[i] for i in call_ids if i in self._ending]
        for event in ending:
            event.wait(timeout)

    def take_host_call(self, name: str) -> str | None:
        """The id of the oldest allowed permission request for host tool ``name``."""
        with self._lock:
            waiting = self._host_calls.get(name)
            return waiting.popleft() if waiting else None

    def request(self, tool_call: dict[str, Any], options: list[dict[str, Any]]) -> dict[str, Any]:
        call_id = str(tool_call.get("toolCallId") or "")
        use = self.hooks.ledger.find(call_id) if self.hooks.ledger is not None and call_id else None
        name = use.name if use is not None else self.names.get(call_id, str(tool_call.get("title")))
        tool_input = use.input if use is not None else tool_call.get("rawInput")
        if name in self.denied:
            return _choose(options, allow=False)
        if name in self.served:  # its fs/* and terminal/* requests are the journaled steps
            refused = self.hooks.refusal(call_id, name, tool_input)
            return _choose(options, allow=refused is None)
        payload = {"tool_use_id": call_id, "tool_name": name, "tool_input": tool_input}
        decision = self.hooks.pre_tool_use(payload)
        allowed = decision["hookSpecificOutput"]["permissionDecision"] == "allow"
        prefix = self.hooks.host_tool_prefix
        if allowed and name.startswith(prefix):
            bare = name.removeprefix(prefix)
            with self._lock:
                for each in host_names(bare) | {bare}:
                    self._host_calls[each].append(call_id)
        return _choose(options, allow=allowed)

    def update(self, update: dict[str, Any]) -> None:
        kind = update.get("sessionUpdate")
        call_id = str(update.get("toolCallId") or "")
        if not call_id:
            return
        if kind == "tool_call" and update.get("title"):
            self.names.setdefault(call_id, str(update["title"]))
        status = update.get("status")
        if kind not in ("tool_call", "tool_call_update") or status not in ("completed", "failed"):
            return
        output = update.get("rawOutput")
        if output is None:
            output = update.get("content")
        payload: dict[str, Any] = {"tool_use_id": call_id, "tool_response": output}
        if status == "failed":
            payload = {
                "tool_use_id": call_id,
                "hook_event_name": "PostToolUseFailure",
                "error": output,
            }
        done = threading.Event()
        with self._lock:
            self._ending[call_id] = done
        try:
            self.hooks.post_tool_use(payload)
        finally:
            done.set()
            with self._lock:
                self._ending.pop(call_id, None)


def _choose(options: list[dict[str, Any]], *, allow: bool) -> dict[str, Any]:
    kinds = ("allow_once", "allow_always") if allow else ("reject_once", "reject_always")
    for kind in kinds:
        for option in options:
            if option.get("kind") == kind:
                return {"outcome": {"outcome": "selected", "optionId": option.get("optionId")}}
    return {"outcome": {"outcome": "cancelled"}}
