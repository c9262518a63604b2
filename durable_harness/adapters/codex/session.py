"""Codex's session record (its rollout file) in the World, and what it tells a resume.

Codex appends a thread's conversation to ``$CODEX_HOME/sessions/YYYY/MM/DD/
rollout-<time>-<thread-id>.jsonl`` (one JSON line per item, a ``function_call`` written
before its tool runs); ``codex exec resume <thread-id>`` finds it there, and needs nothing
else of the old ``CODEX_HOME`` (measured on 0.171.0: the SQLite state files are rebuilt).

The adapter saves the rollout before every tool intent as linked delta blobs
(:class:`~.cli.records.TranscriptStore`) and points at it with a session record
``codex/<turn_id>/<epoch>`` (one name per lease epoch, so a fenced-out worker writes a
name no newer worker reads). The record names a :class:`Rollout` blob: the thread id,
the file's path below ``CODEX_HOME`` and the transcript save. A finished turn's rollout is
kept in the outcome of its last launch step, where the session's next turn finds it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from durable_harness.adapters.cli.records import (
    TranscriptFacts,
    latest_turn_transcript,
    previous_turn_record,
)
from durable_harness.adapters.proxy.server import message_of
from durable_harness.adapters.proxy.wire.responses import RESPONSES
from durable_harness.core.canonical import parse_json
from durable_harness.core.keys import session_record_name
from durable_harness.core.types import Step, StepStatus
from durable_harness.core.world import World
from durable_harness.harness.journal import decode_output

__all__ = [
    "Rollout",
    "latest_turn_rollout",
    "lost_reply",
    "point",
    "previous_turn_rollout",
    "rollout_facts",
]

#: Codex's output for a tool call it was killed during (it never ran to an end).
ABORTED = "aborted"


@dataclass(frozen=True)
class Rollout:
    thread: str  # Codex's thread id (``codex exec resume <thread>``)
    path: str  # the rollout file, relative to CODEX_HOME
    transcript: str  # the TranscriptStore save of its content

    @classmethod
    def of(cls, value: Any) -> Rollout | None:
        if isinstance(value, dict) and {"thread", "path", "transcript"} <= value.keys():
            return cls(str(value["thread"]), str(value["path"]), str(value["transcript"]))
        return None

    def as_json(self) -> dict[str, str]:
        return asdict(self)


def point(world: World, session_id: str, turn_id: str, epoch: int, rollout: Rollout) -> None:
    digest = world.put_blob(json.dumps(rollout.as_json(), sort_keys=True).encode())
    world.put_session_record(session_id, session_record_name("codex", turn_id, epoch), digest)


def latest_turn_rollout(world: World, session_id: str, turn_id: str, epoch: int) -> Rollout | None:
    """The newest rollout save of the turn by an earlier lease epoch, or None."""
    digest = latest_turn_transcript(world, session_id, turn_id, epoch, "codex")
    return None if digest is None else Rollout.of(json.loads(world.get_blob(digest)))


def previous_turn_rollout(world: World, session_id: str, index: int) -> Rollout | None:
    """The final rollout of the session's newest finished turn before ``index``; of a turn
    cancelled mid-launch, its newest save (before a tool intent): what it finished."""

    def rollout(value: Any) -> Rollout | None:
        return Rollout.of(value.get("rollout") if isinstance(value, dict) else None)

    return previous_turn_record(world, session_id, index, rollout, latest_turn_rollout)


def rollout_facts(world: World, steps: list[Step], data: bytes) -> TranscriptFacts:
    """What a rollout already tells Codex: its calls, their real outputs (not ``aborted``),
    and which recorded model replies (by response id) it holds."""
    items: set[str] = set()
    uses: set[str] = set()
    results: set[str] = set()
    for line in data.splitlines():
        try:
            entry = parse_json(line)
        except ValueError:
            continue
        payload = entry.get("payload") if isinstance(entry, dict) else None
        if not isinstance(payload, dict) or entry.get("type") != "response_item":
            continue
        if isinstance(payload.get("id"), str):
            items.add(payload["id"])
        call_id = payload.get("call_id")
        if not isinstance(call_id, str):
            continue
        if payload.get("type") in ("function_call", "custom_tool_call"):
            uses.add(call_id)
        elif payload.get("output") != ABORTED:
            results.add(call_id)
    replies: set[str] = set()
    for step in steps:
        if step.kind != "model" or step.status is not StepStatus.DONE:
            continue
        response = message_of(decode_output(world, step), RESPONSES)
        output = [i for i in response.get("output") or [] if isinstance(i, dict)]
        if any(i.get("id") in items or i.get("call_id") in uses for i in output):
            replies.add(str(step.meta.get("message_id")))
    return TranscriptFacts(frozenset(uses), frozenset(results), frozenset(replies))


def lost_reply(world: World, step: Step) -> str:
    """A recorded model reply the restored rollout lacks, quoted for the resumed CLI."""
    response = message_of(decode_output(world, step), RESPONSES)
    parts = []
    for item in response.get("output") or []:
        if item.get("type") == "message":
            text = "".join(str(p.get("text", "")) for p in item.get("content") or [])
            parts.append(f"text {json.dumps(text)}")
        elif item.get("type") in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments", item.get("input"))
            parts.append(f"tool call {item.get('call_id')} {item.get('name')} {arguments}")
    return f"- your reply {response.get('id')} (recorded): " + "; ".join(parts)
