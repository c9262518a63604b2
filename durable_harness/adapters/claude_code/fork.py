"""Claude Code's part of ``durable-harness fork``: its transcript, cut at the fork point.

A fork of a Claude Code turn before step ``SEQ`` (a model call) keeps the turn's final
transcript up to the first entry of a reply the journal recorded at ``SEQ`` or later
(the model step's ``message_id``), every line of it with the new session's Claude Code
session id. The fork's first launch restores it and runs ``claude --resume`` with the new
prompt: what the kept lines hold is not asked of the model again.
"""

from __future__ import annotations

import json
from typing import Any

from durable_harness.adapters.claude_code.session import transcript_facts
from durable_harness.adapters.claude_code.setup import claude_session_id
from durable_harness.adapters.cli.records import TranscriptStore, latest_turn_transcript
from durable_harness.core.canonical import parse_json
from durable_harness.core.errors import ConfigError
from durable_harness.core.types import Step, Turn
from durable_harness.core.world import World

__all__ = ["cut_transcript"]

RECORD_PREFIX = "claude-code"


def cut_transcript(world: World, turn: Turn, kept: list[Step], session_id: str) -> str:
    """The digest of a :class:`TranscriptStore` save of ``turn``'s transcript cut after
    ``kept`` (its steps before the fork point), for the new session ``session_id``."""
    at = kept[-1].seq + 1 if kept else 0
    steps = sorted(world.load_steps(turn.turn_id), key=lambda s: s.seq)
    step = next((s for s in steps if s.seq == at), None)  # None: after the final reply
    if step is not None and step.kind != "model":
        raise ConfigError(
            f"step {at} of turn {turn.turn_id} is a {step.kind} step: a Claude Code turn is "
            "forked before one of its model calls (its transcript is cut at a reply)"
        )
    saved = latest_turn_transcript(world, turn.session_id, turn.turn_id, turn.epoch + 1)
    if saved is None:
        raise ConfigError(f"turn {turn.turn_id} has no saved transcript to fork from")
    data = TranscriptStore(world, record_prefix=RECORD_PREFIX).load(saved)
    if step is not None and step.meta.get("message_id") not in transcript_facts(data).messages:
        # A call the main conversation does not hold (a subagent's, one a tool made) or a
        # reply lost to a crash: cutting at the next reply would keep results (or a
        # resume message quoting them) from after the cut.
        raise ConfigError(
            f"step {at} of turn {turn.turn_id} is a model call whose reply is not in Claude "
            "Code's transcript: fork at a model call of the main conversation"
        )
    cut_replies = {
        str(s.meta["message_id"])
        for s in steps
        if s.kind == "model" and s.seq >= at and s.meta.get("message_id")
    }
    new_id = claude_session_id(session_id)
    lines: list[bytes] = []
    for line in data.splitlines():
        entry = _entry(line)
        if entry is None:
            continue  # a line half written when it was saved, or not an entry
        message = entry.get("message")
        if isinstance(message, dict) and str(message.get("id")) in cut_replies:
            break
        if "sessionId" in entry:
            entry["sessionId"] = new_id
        # ASCII escapes: a lone surrogate (a tool output cut inside an emoji) round-trips.
        lines.append(json.dumps(entry).encode())
    cut = b"".join(line + b"\n" for line in lines)
    return TranscriptStore(world, record_prefix=RECORD_PREFIX).save(cut).digest


def _entry(line: bytes) -> dict[str, Any] | None:
    """A transcript line as a JSON object, or None (what the agent wrote is untrusted:
    any bytes, any nesting)."""
    try:
        entry = parse_json(line)
    except (ValueError, RecursionError):
        return None
    return entry if isinstance(entry, dict) else None
