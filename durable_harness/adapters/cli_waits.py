"""Durable waits for CLI agents: the CLI leaves the turn at a wait and is resumed later.

The wait tools of the built-in agent (:mod:`durable_harness.harness.waits`) are served
to the CLI over MCP with the user's host tools. What makes them durable is the CLI's
PreToolUse hook, which :class:`WaitGate` answers before the tool is called:

* the wait's intent is committed (its ``started_at`` fixes the deadline for every later
  look, as in the built-in agent);
* the signal has arrived or the timer has fired: the outcome is recorded and the hook
  **allows** the call; the MCP handler then returns the recorded outcome;
* still waiting: the hook **defers** the call. Claude Code (print mode) then ends its
  run with ``stop_reason: "tool_deferred"`` and its transcript holds the pending call;
  the adapter records the launch as deferred and raises the wait's
  :class:`~durable_harness.harness.errors.TurnSuspended`, so the worker parks the turn
  with no lease and no process. When the World delivers the turn again, the next launch
  resumes the session with an empty prompt, the CLI runs the hook again, and this time
  the wait is over.

A worker that dies after the deferral but before parking the turn leaves the turn to
its lease; the next delivery resumes the same way.
"""

from __future__ import annotations

import threading
from typing import Any

from durable_harness.adapters.hooks import allow, deny
from durable_harness.harness.errors import TurnSuspended
from durable_harness.harness.journal import Journal, Outcome, StepResult
from durable_harness.harness.tools import Tool, ToolContext, ToolInputError
from durable_harness.harness.waits import wait_tools
from durable_harness.worlds.base import World

__all__ = ["WaitGate", "defer"]


def defer(reason: str) -> dict[str, Any]:
    """A PreToolUse reply that makes the CLI stop before the call, to resume it later."""
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "defer",
            "permissionDecisionReason": reason,
        }
    }


class WaitGate:
    """Answers the PreToolUse hook of a wait tool call (see the module docstring)."""

    def __init__(
        self, world: World, journal: Journal, session_id: str, signal_secret: str = ""
    ) -> None:
        self.journal = journal
        self.session_id = session_id
        self.signal_secret = signal_secret
        self.tools: list[Tool] = wait_tools(world, journal)
        self._by_name = {t.name: t for t in self.tools}
        self._lock = threading.Lock()
        #: The wait this launch stopped at, once a call was deferred.
        self.suspended: TurnSuspended | None = None

    def handles(self, name: str) -> bool:
        return name in self._by_name

    def pre_tool_use(self, name: str, tool_input: Any, tool_use_id: str) -> dict[str, Any]:
        """``allow`` when the wait is over (its outcome recorded), else ``defer``."""
        tool = self._by_name[name]
        begun = self.journal.begin_keyed(
            kind="tool",
            name=name,
            key=f"tool:{tool_use_id}",
            input=tool_input,
            replay=tool.replay,
            store_input=True,
        )
        if isinstance(begun, StepResult):
            return allow("the wait is over: its result is in the journal")
        ctx = ToolContext(self.journal.turn_id, self.session_id, begun.step.seq, self.signal_secret)
        try:
            result = tool.invoke(tool_input, ctx)
        except TurnSuspended as exc:
            with self._lock:
                self.suspended = self.suspended or exc
            return defer(f"durable-harness: the turn is parked, waiting for {exc.waiting_for}")
        except ToolInputError as exc:
            value = {"content": str(exc), "is_error": True}
            self.journal.end(begun, Outcome(value, {"source": "wait"}))
            return deny(str(exc))
        value = {"content": str(result), "is_error": False}
        self.journal.end(begun, Outcome(value, {"source": "wait"}))
        return allow("the wait is over: its result is in the journal")
