"""Tool calls of a CLI agent journaled through its PreToolUse/PostToolUse hooks.

The CLI runs a hook command before and after every tool call; the command posts the
hook's JSON to the journaling proxy (``POST /_dh/<event>``), which hands it to
:meth:`ToolHooks.handle` and prints the reply back to the CLI. A step is keyed by the
model's ``tool_use_id``, so a call is found again whatever order the calls come in.

PreToolUse, for the call's journal row:

================================  ==============================================
nothing recorded                   commit the intent (durable), then **allow**
intent, no outcome, ``never``      finish it *possibly ran*, **deny** with that message
intent, no outcome, ``safe``       **allow** (it runs again)
outcome recorded                   **deny**: "already ran; its result was …"
possibly ran                       **deny** with the possibly-ran message
================================  ==============================================

PostToolUse (and PostToolUseFailure) record the outcome. A hook command that cannot
reach the harness exits 2, which makes the CLI block the tool: a tool never runs
without its intent recorded first (invariant 1). Tools the harness serves itself over
MCP (host tools) are journaled by the MCP handler instead; their hooks only allow, except
for the wait tools, which :class:`~.cli.waits.WaitGate` lets run only once the wait is
over (otherwise the call is deferred and the turn parked).

:class:`ReplayPolicy` gives Claude Code's own tools their labels: read-only tools are
``safe``; Bash, Edit, Write and every other tool are ``never`` unless the user's
configuration marks them safe (a tool by name, or Bash commands by pattern).

With a :class:`~.cli.ledger.ToolLedger`, a hook event counts only for a tool use the
model made this turn: a PreToolUse for an id no recorded model response holds, or with
another tool or input (compared by the spec's ``same_call``), is denied before anything
is journaled; a PostToolUse (or an outcome read from a model request) finishes only a
step this launch opened through that check, or (re-attached) an open intent of the CLI's
own tool for a model-made id, never a host tool's or a wait's.
"""

from __future__ import annotations

import fnmatch
import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from durable_harness.adapters.cli.mcp import host_names
from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import ConfigError
from durable_harness.core.keys import tool_key
from durable_harness.core.types import Replay, StepStatus
from durable_harness.harness.journal import Journal, OpenStep, Outcome, StepResult

if TYPE_CHECKING:
    from durable_harness.adapters.cli.ledger import ToolLedger, ToolUse
    from durable_harness.adapters.cli.waits import WaitGate

__all__ = [
    "AgentConfig",
    "Control",
    "ReplayPolicy",
    "SameCall",
    "ToolHooks",
    "same_call",
    "save_before_host_calls",
]

#: A CLI's hook handler: (event, payload) -> the answer the CLI reads.
Control = Callable[[str, dict[str, Any]], dict[str, Any]]
#: Whether a hook's ``(tool_name, tool_input)`` is the model's tool use, as the CLI
#: reports its own tools (Codex renames and reshapes its shell tool).
SameCall = Callable[["ToolUse", str, Any], bool]


def same_call(use: ToolUse, name: str, tool_input: Any) -> bool:
    """The CLI reports the model's call as it was: same name, same input."""
    return use.name == name and use.canonical == _canonical(tool_input)


def _canonical(value: Any) -> str:
    try:
        return canonical_json({} if value is None else value)
    except (TypeError, ValueError):
        return repr(value)


#: Claude Code tools that only read (files, the web, the CLI's own task list).
SAFE_TOOLS = frozenset(
    {
        "Read", "Glob", "Grep", "LS", "NotebookRead", "WebFetch", "WebSearch", "ToolSearch",
        "TodoWrite", "TaskGet", "TaskList", "ListAgents", "BashOutput", "Skill",
    }
)  # fmt: skip
#: A Bash command holding any of these is never marked safe by a pattern: it chains,
#: redirects or substitutes, so a pattern cannot tell what it does.
_SHELL_METACHARACTERS = (";", "&", "|", "<", ">", "`", "$(", "\n")
_RESULT_QUOTE = 2000


class _Replay(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tools: dict[str, Replay] = Field(default_factory=dict)
    safe_bash: list[str] = Field(default_factory=list)


class AgentConfig(BaseModel):
    """The user's ``--agent-config`` TOML for the claude-code agent (see docs/claude-code.md).

    ``[replay] tools = {Name = "safe"|"never"}`` overrides a tool's label;
    ``[replay] safe_bash = ["ls *", "git status"]`` marks Bash commands that match one of
    these shell patterns (the whole command, :mod:`fnmatch` syntax) safe.
    """

    model_config = ConfigDict(extra="forbid")

    replay: _Replay = Field(default_factory=_Replay)

    @classmethod
    def parse(cls, data: Any, source: str) -> Self:
        try:
            return cls.model_validate(data or {})
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
            )
            raise ConfigError(f"agent config {source}: {problems}") from None


class ReplayPolicy:
    """The replay label of each Claude Code tool call."""

    def __init__(self, config: AgentConfig | None = None) -> None:
        self.config = config or AgentConfig()

    def label(self, tool_name: str, tool_input: Any) -> Replay:
        override = self.config.replay.tools.get(tool_name)
        if override is not None:
            return override
        if tool_name == "Bash" and isinstance(tool_input, dict):
            command = str(tool_input.get("command", "")).strip()
            if self.safe_command(command):
                return "safe"
        return "safe" if tool_name in SAFE_TOOLS else "never"

    def safe_command(self, command: str) -> bool:
        if not command or any(m in command for m in _SHELL_METACHARACTERS):
            return False
        return any(fnmatch.fnmatchcase(command, p) for p in self.config.replay.safe_bash)


def allow(reason: str = "journaled by durable-harness") -> dict[str, Any]:
    return _decision("allow", reason)


def deny(reason: str) -> dict[str, Any]:
    return _decision("deny", reason)


def _decision(decision: str, reason: str) -> dict[str, Any]:
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": decision,
            "permissionDecisionReason": reason,
        }
    }


class ToolHooks:
    """The ``/_dh/<event>`` handler of one CLI launch (see the module docstring).

    ``before_intent(transcript_path, tool_use_id)`` runs before a new intent is committed:
    the adapter saves the CLI's transcript there, once it holds the call.
    ``outcome_meta()`` runs before an outcome is recorded; what it returns joins the
    outcome's meta (a workspace snapshot's digest). ``adopt``: the CLI started under an
    earlier worker (re-attached), so a PostToolUse may finish an intent that worker opened.
    ``ledger``: the turn's model-made tool uses (None: every id is taken at its word, as
    the unit tests of the journal rules do); ``same_call`` compares a CLI tool's hook
    with the model's use; ``host_tools``: the names served over MCP (never finished here).
    """

    def __init__(
        self,
        journal: Journal,
        policy: ReplayPolicy,
        *,
        host_tool_prefix: str,
        before_intent: Callable[[str | None, str], None] | None = None,
        waits: WaitGate | None = None,
        outcome_meta: Callable[[], dict[str, Any]] | None = None,
        adopt: bool = False,
        ledger: ToolLedger | None = None,
        same_call: SameCall = same_call,
        host_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.journal = journal
        self.ledger = ledger
        self.same_call = same_call
        self.host_tools = host_tools
        self.policy = policy
        self.host_tool_prefix = host_tool_prefix
        self.before_intent = before_intent
        self.waits = waits
        self.outcome_meta = outcome_meta
        self.adopt = adopt
        self.open: dict[str, OpenStep] = {}
        self._adopted: set[str] = set()
        self.session_started = threading.Event()
        self._lock = threading.Lock()

    def handle(self, event: str, payload: dict[str, Any]) -> dict[str, Any]:
        if event == "SessionStart":
            self.session_started.set()
            return {}
        if event == "PreToolUse":
            return self.pre_tool_use(payload)
        if event in ("PostToolUse", "PostToolUseFailure"):
            tool_use_id = str(payload.get("tool_use_id") or "")
            if self.ledger is not None and self.ledger.find(tool_use_id) is None:
                # Not a model's call: say so, and record nothing (never fails the turn).
                return {"refused": self.ledger.refusal(tool_use_id, (), None)}
            self.post_tool_use(payload)
            return {}
        return {}

    def pre_tool_use(self, payload: dict[str, Any]) -> dict[str, Any]:
        tool_use_id = str(payload.get("tool_use_id") or "")
        name = str(payload.get("tool_name") or "")
        if not tool_use_id:
            return deny("durable-harness: this tool call has no tool_use_id to journal it by")
        tool_input = payload.get("tool_input") or {}
        refused = self.refusal(tool_use_id, name, tool_input)
        if refused is not None:
            return deny(refused)
        if name.startswith(self.host_tool_prefix):
            bare = name.removeprefix(self.host_tool_prefix)
            if self.waits is not None and self.waits.handles(bare):
                return self.waits.pre_tool_use(bare, tool_input, tool_use_id)
            return allow("a durable-harness host tool: journaled by the harness itself")
        with self._lock:
            running = tool_use_id in self.open
        if running:
            # Opened once already and not finished: a second PreToolUse is not the CLI's
            # (it would end the running call "possibly ran").
            return deny("durable-harness refused: this tool use is already running")
        key = tool_key(tool_use_id)
        if self.journal.lookup(key) is None and self.before_intent is not None:
            self.before_intent(payload.get("transcript_path"), tool_use_id)
        begun = self.journal.begin_keyed(
            kind="tool",
            name=name,
            key=key,
            input=tool_input,
            replay=self.policy.label(name, tool_input),
            store_input=True,
        )
        if isinstance(begun, StepResult):
            if begun.status is StepStatus.POSSIBLY_RAN:
                return deny(str(begun.value))
            return deny(
                "durable-harness: this call already ran and must not run again; "
                f"its result was: {_quote(begun.value)}"
            )
        with self._lock:
            self.open[tool_use_id] = begun
        return allow()

    def refusal(self, tool_use_id: str, name: str, tool_input: Any) -> str | None:
        """Why a PreToolUse is not a call the model made (None: it is, or no ledger)."""
        if self.ledger is None:
            return None
        if name.startswith(self.host_tool_prefix):
            bare = name.removeprefix(self.host_tool_prefix)
            return self.ledger.refusal(tool_use_id, host_names(bare), tool_input)
        use = self.ledger.find(tool_use_id)
        if use is None:
            return self.ledger.refusal(tool_use_id, [name], tool_input)
        if not self.same_call(use, name, tool_input):
            return (
                f"durable-harness refused: tool use {tool_use_id!r} is not this call of "
                f"{name!r} (the model asked for {use.name!r} with other input)"
            )
        return None

    def post_tool_use(self, payload: dict[str, Any]) -> None:
        tool_use_id = str(payload.get("tool_use_id") or "")
        step = self._take(tool_use_id)
        if step is None:
            return  # a host tool, a call this launch did not open, or one already finished
        if payload.get("hook_event_name") == "PostToolUseFailure" or "error" in payload:
            value: dict[str, Any] = {"error": payload.get("error"), "is_error": True}
            if payload.get("is_interrupt"):
                value["interrupted"] = True
        else:
            value = {"tool_response": payload.get("tool_response")}
        self._end(step, value, "hook")

    def close_open(self, tool_use_id: str, value: dict[str, Any], source: str) -> bool:
        """Record the outcome of a call this launch opened (or, re-attached, adopted) and
        whose PostToolUse never came (taken from the CLI's next model request); False if
        no such call is open. (Main's Codex adapter uses it.)"""
        step = self._take(tool_use_id)
        if step is None:
            return False
        self._end(step, value, source)
        return True

    def _take(self, tool_use_id: str) -> OpenStep | None:
        """The open step of a call, to finish once: this launch's, or (re-attached) an
        intent the earlier worker opened and did not finish."""
        with self._lock:
            step = self.open.pop(tool_use_id, None)
            if step is not None or not self.adopt or tool_use_id in self._adopted:
                return step
            recorded = self.journal.lookup(tool_key(tool_use_id))
            if recorded is None or recorded.status is not StepStatus.INTENT:
                return None
            if recorded.name in self.host_tools or (
                self.ledger is not None and self.ledger.find(tool_use_id) is None
            ):
                return None  # a host tool's or a wait's, or no model's: not the hooks' to end
            self._adopted.add(tool_use_id)
            return OpenStep(recorded, time.monotonic())

    def _end(self, step: OpenStep, value: dict[str, Any], source: str) -> None:
        meta: dict[str, Any] = {"source": source}
        if self.outcome_meta is not None:
            meta.update(self.outcome_meta())
        self.journal.end(step, Outcome(value, meta))

    def close_from_request(self, body: dict[str, Any]) -> None:
        """Record, from a model request, the result of a call whose PostToolUse never came.

        The request carries the tool_result the CLI made; without this a failed hook
        would leave the step an intent and the model's next request unkeyable on replay.
        """
        for block in _last_user_blocks(body):
            if block.get("type") != "tool_result":
                continue
            step = self._take(str(block.get("tool_use_id")))
            if step is not None:
                value = {
                    "tool_result": block.get("content"),
                    "is_error": bool(block.get("is_error")),
                }
                self._end(step, value, "proxy")

    def require_started(self, seconds: float, missing: str) -> None:
        """Wait up to ``seconds`` for the CLI's SessionStart; without it, stop the turn
        before any tool can run unjournaled (``missing`` says what the CLI did not do)."""
        if not self.wait_started(seconds):
            raise ConfigError(
                f"{missing}, so its tool calls could not be journaled: the turn was "
                "stopped before any tool ran"
            )

    def wait_started(self, seconds: float) -> bool:
        """Whether the CLI ran its SessionStart hook (proof the hooks are live)."""
        deadline = time.monotonic() + seconds
        return self.session_started.wait(max(deadline - time.monotonic(), 0.0))


def _last_user_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    return []


def _quote(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= _RESULT_QUOTE else text[:_RESULT_QUOTE] + "…"


def save_before_host_calls(
    journal: Journal,
    inner: Control,
    saver: Callable[[str | None, str], None] | None,
    prefix: str,
) -> Control:
    """The hooks' handler, saving the rollout (``saver``) before a host tool's PreToolUse:
    the MCP handler records that call's intent, and a resume must know the call exists (as
    for the CLI's own tools, whose ``before_intent`` precedes their intent). ``prefix``:
    how the CLI's hooks name a host tool."""

    def control(event: str, payload: dict[str, Any]) -> dict[str, Any]:
        name = str(payload.get("tool_name") or "")
        call_id = str(payload.get("tool_use_id") or "")
        if (
            event == "PreToolUse"
            and saver is not None
            and name.startswith(prefix)
            and call_id
            and journal.lookup(tool_key(call_id)) is None
        ):
            saver(payload.get("transcript_path"), call_id)
        return inner(event, payload)

    return control
