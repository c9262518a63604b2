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
  :class:`~durable_harness.core.errors.TurnSuspended`, so the worker parks the turn
  with no lease and no process. When the World delivers the turn again, the next launch
  resumes the session with an empty prompt, the CLI runs the hook again, and this time
  the wait is over.

A worker that dies after the deferral but before parking the turn leaves the turn to
its lease; the next delivery resumes the same way.

**CLIs without a defer decision** (Codex: its hooks know only allow, deny, ask) use the
*stop* mode: :attr:`WaitGate.stop` is set (the adapter passes its proxy's ``fail``).
Still waiting, the hook hands the wait's ``TurnSuspended`` to ``stop`` (the adapter then
kills the CLI, e.g. its Docker job, and raises it: the worker parks the turn), and holds
the hook's answer until the CLI is gone (:attr:`WaitGate.stopped`), so the CLI makes no
further model call. The wait's intent stays open. On the next delivery the adapter calls
:meth:`WaitGate.settle` *before* starting the CLI: each open wait is asked again (its
intent's ``started_at`` fixes the deadline); over, its outcome is recorded, and the resume
message written from the journal quotes it to the resumed CLI; still pending, ``settle``
raises its ``TurnSuspended`` and the turn parks again without starting the CLI.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from durable_harness.adapters.base import TurnRun
from durable_harness.adapters.cli.hooks import allow, deny
from durable_harness.adapters.cli.mcp import begin_host_tool
from durable_harness.core.canonical import parse_json
from durable_harness.core.errors import TurnSuspended
from durable_harness.core.keys import BLOB_PREFIX
from durable_harness.core.types import StepStatus
from durable_harness.core.world import World
from durable_harness.harness.journal import Journal, OpenStep, Outcome, StepResult
from durable_harness.harness.tools import Tool, ToolContext, ToolInputError
from durable_harness.harness.waits import wait_tools

__all__ = ["STOP_HOLD_SECONDS", "WaitGate", "defer"]

#: Stop mode: how long the hook's answer is held while the adapter stops the CLI.
STOP_HOLD_SECONDS = 30.0


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
        self.world = world
        self._lock = threading.Lock()
        #: The wait this launch stopped at, once a call was deferred.
        self.suspended: TurnSuspended | None = None
        #: Stop mode (CLIs without ``defer``): called with the wait that is still pending.
        self.stop: Callable[[TurnSuspended], None] | None = None
        #: Stop mode: set by the adapter once the CLI is stopped (releases the held hook).
        self.stopped = threading.Event()

    @classmethod
    def for_turn(cls, run: TurnRun) -> WaitGate:
        """The gate of ``run``'s turn (its signal secret signs the wait tools' URLs)."""
        secret = run.turn_config.signal_secret or ""
        return cls(run.world, run.journal, run.turn.session_id, secret)

    def handles(self, name: str) -> bool:
        return name in self._by_name

    def pre_tool_use(self, name: str, tool_input: Any, tool_use_id: str) -> dict[str, Any]:
        """``allow`` when the wait is over (its outcome recorded), else ``defer``."""
        tool = self._by_name[name]
        begun = begin_host_tool(self.journal, tool, name, tool_use_id, tool_input)
        if isinstance(begun, StepResult):
            return allow("the wait is over: its result is in the journal")
        ctx = ToolContext(self.journal.turn_id, self.session_id, begun.step.seq, self.signal_secret)
        try:
            result = tool.invoke(tool_input, ctx)
        except TurnSuspended as exc:
            with self._lock:
                self.suspended = self.suspended or exc
            reason = f"durable-harness: the turn is parked, waiting for {exc.waiting_for}"
            if self.stop is None:
                return defer(reason)
            self.stop(exc)
            self.stopped.wait(STOP_HOLD_SECONDS)  # answer only once the CLI is gone
            return deny(reason)
        except ToolInputError as exc:
            value = {"content": str(exc), "is_error": True}
            self.journal.end(begun, Outcome(value, {"source": "wait"}))
            return deny(str(exc))
        value = {"content": str(result), "is_error": False}
        self.journal.end(begun, Outcome(value, {"source": "wait"}))
        return allow("the wait is over: its result is in the journal")

    def settle(self) -> None:
        """Stop mode, before a CLI resumes: record the outcome of every wait this turn left
        open whose signal arrived or whose deadline passed; raise the ``TurnSuspended`` of
        the first one still pending (the turn parks again, no CLI started)."""
        steps = sorted(self.journal.recorded.values(), key=lambda s: s.seq)
        for step in steps:
            tool = self._by_name.get(step.name)
            if step.kind != "tool" or tool is None or step.status is not StepStatus.INTENT:
                continue
            text = step.input or "{}"
            if text.startswith(BLOB_PREFIX):
                text = self.world.get_blob(text.removeprefix(BLOB_PREFIX)).decode()
            ctx = ToolContext(self.journal.turn_id, self.session_id, step.seq, self.signal_secret)
            try:
                result = tool.invoke(parse_json(text), ctx)
            except ToolInputError as exc:
                value = {"content": str(exc), "is_error": True}
            else:
                value = {"content": str(result), "is_error": False}
            self.journal.end(OpenStep(step, time.monotonic()), Outcome(value, {"source": "wait"}))
