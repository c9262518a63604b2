"""The tool uses the model asked for this turn: what a host-tool call or hook may claim.

The per-launch token the CLI holds reaches every process in the sandbox (the CLI's
environment, its config files), so it cannot tell the CLI's own hook or MCP request from
one a shell child made up. What the sandbox cannot forge is the journal: a tool use is
genuine only if a model response this turn *recorded* contains it. :class:`ToolLedger`
reads those responses from the journal's model steps (live ones are recorded before the
CLI sees their end, replayed and earlier workers' ones were recorded before; so the
ledger is the same whether the turn runs, resumes or re-attaches) in the three wire
formats the proxy speaks:

* Anthropic Messages: ``content[]`` blocks ``tool_use`` (``id``, ``name``, ``input``);
* OpenAI Responses: ``output[]`` items ``function_call`` / ``custom_tool_call``
  (``call_id``, ``name``, Codex's MCP ``namespace``, ``arguments`` as a JSON string);
* OpenAI Chat Completions: ``choices[].message.tool_calls[]`` (``id``,
  ``function.name``, ``function.arguments`` as a JSON string).

A request is accepted for a known id only, with the tool's name (in one of the spellings
the CLIs give a host tool) and its input equal in canonical JSON; :meth:`ToolLedger.claim`
lets each id run a host tool once per worker (a second call gets the recorded outcome or
a refusal, never a second run; across workers the journal's own rules apply).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from durable_harness.adapters.proxy.journaling import message_of
from durable_harness.adapters.proxy.wire.anthropic import ANTHROPIC
from durable_harness.adapters.proxy.wire.chat import CHAT
from durable_harness.adapters.proxy.wire.responses import RESPONSES
from durable_harness.core.canonical import canonical_json, parse_json
from durable_harness.core.types import StepStatus
from durable_harness.harness.journal import Journal, decode_output

__all__ = ["ToolLedger", "ToolUse", "tool_uses_of"]

#: The formats a recorded stream may be in (a step does not say which).
_WIRES = (ANTHROPIC, RESPONSES, CHAT)


@dataclass(frozen=True)
class ToolUse:
    """One tool use of a recorded model response."""

    id: str
    name: str  # as the model named it (Responses: ``namespace__name``)
    input: Any  # the parsed input (a Responses/Chat ``arguments`` string decoded)
    alias: str | None = None  # the same call's other id (see :meth:`ToolLedger.same_call`)

    @property
    def canonical(self) -> str:
        return _canonical(self.input)


#: The longest a hook or host-tool call waits for a model answer still streaming.
SETTLE_SECONDS = 300.0


class ToolLedger:
    """This turn's model-made tool uses, read from the journal (see the module docstring)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._uses: dict[str, ToolUse] = {}
        self._read: set[tuple[int, str]] = set()  # model steps already read (seq, key)
        self._claimed: set[str] = set()
        #: Each id to the ids of the same call (a Responses call is known by its
        #: ``call_id`` and, to Pi, as ``<call_id>|<item id>``): one claim for them all.
        self._same: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()
        #: Waits (up to the seconds given) for the model calls in flight to end; set by
        #: each launch to its proxy's (None: nothing streams, recorded is all there is).
        self.settle: Callable[[float], None] | None = None

    def find(self, tool_use_id: str) -> ToolUse | None:
        """The model's tool use with this id, or None if no recorded response has it.

        A CLI may run a tool as soon as its block has streamed (Claude Code does), before
        the answer ends and is recorded: an id not found yet is looked for again once the
        model calls in flight have ended (:attr:`settle`, the launch's proxy)."""
        use = self._find_recorded(tool_use_id)
        settle = self.settle
        if use is None and settle is not None:
            settle(SETTLE_SECONDS)
            use = self._find_recorded(tool_use_id)
        return use

    def _find_recorded(self, tool_use_id: str) -> ToolUse | None:
        with self._lock:
            use = self._uses.get(tool_use_id)
            if use is None:
                self._refresh()
                use = self._uses.get(tool_use_id)
            return use

    def refusal(self, tool_use_id: str, names: Iterable[str], tool_input: Any) -> str | None:
        """Why a request for ``tool_use_id`` (naming the tool one of ``names``, with
        ``tool_input``) is not a call the model made, or None when it is."""
        use = self.find(tool_use_id) if tool_use_id else None
        if use is None:
            return (
                f"durable-harness refused: no model response of this turn holds a tool use "
                f"with id {tool_use_id!r}"
            )
        wanted = set(names)
        if use.name not in wanted:
            return (
                f"durable-harness refused: tool use {tool_use_id!r} is a call of "
                f"{use.name!r}, not of {sorted(wanted)[0]!r}"
            )
        if use.canonical != _canonical(tool_input):
            return (
                f"durable-harness refused: the input differs from the one the model gave "
                f"tool use {tool_use_id!r}"
            )
        return None

    def claim(self, tool_use_id: str) -> bool:
        """True the first time ``tool_use_id`` (or another id of the same call) is claimed
        in this worker, False after."""
        with self._lock:
            ids = self._same.get(tool_use_id, frozenset({tool_use_id}))
            if ids & self._claimed:
                return False
            self._claimed |= ids
            return True

    def claimed(self, tool_use_id: str) -> bool:
        """Whether ``tool_use_id`` (or another id of the same call) was claimed in this
        worker: a call already served here."""
        with self._lock:
            return bool(self._same.get(tool_use_id, frozenset({tool_use_id})) & self._claimed)

    def same_call(self, tool_use_id: str) -> frozenset[str]:
        """Every id under which the model's call ``tool_use_id`` may be presented (itself
        included): a step journaled under any of them is this call's."""
        with self._lock:
            return self._same.get(tool_use_id, frozenset({tool_use_id}))

    def _refresh(self) -> None:
        for step in list(self.journal.recorded.values()):
            if step.kind != "model" or step.status is not StepStatus.DONE:
                continue
            if (step.seq, step.key) in self._read:
                continue
            self._read.add((step.seq, step.key))
            value = decode_output(self.journal.world, step)
            for use in tool_uses_of(value):
                self._uses.setdefault(use.id, use)
                if use.alias:
                    self._uses.setdefault(use.alias, use)
                    self._same[use.id] = self._same[use.alias] = frozenset({use.id, use.alias})


def tool_uses_of(recorded: Any) -> list[ToolUse]:
    """The tool uses in a recorded model outcome, whichever wire format it came in: the
    body of a JSON reply, or (a stream) the message each format assembles from it."""
    if not isinstance(recorded, dict):
        return []
    messages: list[Any] = []
    if recorded.get("stream"):
        for wire in _WIRES:
            try:
                messages.append(message_of(recorded, wire))
            except Exception:
                continue
    else:
        messages.append(recorded.get("body"))
    found: dict[str, ToolUse] = {}
    for message in messages:
        for use in _uses_in(message):
            found.setdefault(use.id, use)
    return list(found.values())


def _uses_in(message: Any) -> Iterable[ToolUse]:
    if not isinstance(message, dict):
        return
    for block in _dicts(message.get("content")):  # Anthropic Messages
        if block.get("type") == "tool_use" and block.get("id"):
            yield ToolUse(str(block["id"]), str(block.get("name") or ""), block.get("input"))
    for item in _dicts(message.get("output")):  # OpenAI Responses
        if item.get("type") in ("function_call", "custom_tool_call") and item.get("call_id"):
            name = str(item.get("name") or "")
            if item.get("namespace"):
                name = f"{item['namespace']}__{name}"
            raw = item.get("arguments") if "arguments" in item else item.get("input")
            # Pi names a Responses tool call ``<call_id>|<item id>`` (pi-ai's
            # openai-responses provider), Codex by its ``call_id``: one call, two ids.
            alias = f"{item['call_id']}|{item['id']}" if item.get("id") else None
            yield ToolUse(str(item["call_id"]), name, _arguments(raw), alias)
    for choice in _dicts(message.get("choices")):  # OpenAI Chat Completions
        for call in _dicts((choice.get("message") or {}).get("tool_calls")):
            function = call.get("function") or {}
            if call.get("id") and isinstance(function, dict):
                yield ToolUse(
                    str(call["id"]),
                    str(function.get("name") or ""),
                    _arguments(function.get("arguments")),
                )


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _arguments(raw: Any) -> Any:
    """A call's arguments as the tool gets them: OpenAI sends a JSON string (empty for
    no arguments); a string that is not JSON is the input itself (a custom tool's)."""
    if not isinstance(raw, str):
        return raw if raw is not None else {}
    if not raw.strip():
        return {}
    try:
        return parse_json(raw)
    except ValueError:
        return raw


def _canonical(value: Any) -> str:
    try:
        return canonical_json({} if value is None else value)
    except (TypeError, ValueError):
        return repr(value)
