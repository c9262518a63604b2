"""A CLI's session record in the World, and the message that resumes a turn.

Written for Claude Code's transcript and shared by every CLI adapter (Codex stores its
rollout with :class:`TranscriptStore`; Pi and OpenCode resume with the same messages).
Claude Code keeps a conversation in an append-only JSONL transcript
(``~/.claude/projects/<cwd with / as ->/<session-id>.jsonl``). The adapter saves it to the
World after steps and restores it into a fresh HOME on resume, then continues the CLI with
``--resume``. Saving the whole file each time would grow the World quadratically with a
conversation (invariant 7), so :class:`TranscriptStore` stores what was appended since the
last save as a blob and links the saves: a node ``{"prev", "chunk", "size"}``.

Saves are pointed at by session records named ``claude-code/<turn_id>/<epoch>``: one name
per lease epoch, so a zombie worker (fenced out, still running) can only write a name no
newer worker reads. A turn's final transcript is kept in the outcome of its last launch
step (fenced like every journal write), where the session's next turn finds it.

:func:`resume_message` tells the resumed CLI, from the journal alone, what happened to
each tool call of the interrupted turn: finished (with its result when the restored
transcript lacks it), possibly ran (must be checked first), or never started. What a
CLI's own record already holds (:class:`TranscriptFacts`) is read by each agent's package
(:func:`~.claude_code.session.transcript_facts` for Claude Code).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from durable_harness.adapters.proxy.server import message_of
from durable_harness.core.canonical import parse_json
from durable_harness.core.keys import (
    idempotency_key,
    is_launch_key,
    session_record_name,
    tool_use_id_of,
)
from durable_harness.core.types import Step, StepStatus, TurnStatus
from durable_harness.core.world import World
from durable_harness.harness.journal import POSSIBLY_RAN_MESSAGE, decode_output

T = TypeVar("T")

__all__ = [
    "Saved",
    "TranscriptFacts",
    "TranscriptStore",
    "compose_resume_message",
    "jsonl_messages",
    "latest_turn_transcript",
    "previous_turn_record",
    "previous_turn_transcript",
    "resume_message",
    "resume_message_from_facts",
]

#: A finished tool's result is quoted in the resume message up to this many characters.
RESULT_QUOTE_CHARS = 2000


@dataclass(frozen=True)
class Saved:
    digest: str  # the node blob
    size: int  # bytes of transcript it stands for


class TranscriptStore:
    """Append-only transcript saves as linked delta blobs (see the module docstring)."""

    def __init__(self, world: World, record_prefix: str = "claude-code") -> None:
        self.world = world
        self.record_prefix = record_prefix  # another CLI adapter keeps its saves apart
        self._last: tuple[Saved, bytes] | None = None

    def save(self, data: bytes) -> Saved:
        """Store ``data`` (only complete lines: a line still being written is left out)."""
        data = data[: data.rfind(b"\n") + 1]
        previous = self._last
        if previous is not None and previous[1] == data:
            return previous[0]
        if previous is not None and data.startswith(previous[1]):
            node = {
                "prev": previous[0].digest,
                "chunk": self.world.put_blob(data[previous[0].size :]),
                "size": len(data),
            }
        else:  # rewritten, or the first save: a full copy
            node = {"prev": None, "chunk": self.world.put_blob(data), "size": len(data)}
        saved = Saved(self.world.put_blob(json.dumps(node, sort_keys=True).encode()), len(data))
        self._last = (saved, data)
        return saved

    def load(self, digest: str) -> bytes:
        """The transcript a save stands for; also primes the next :meth:`save`'s delta."""
        chunks: list[bytes] = []
        cursor: str | None = digest
        while cursor is not None:
            node = json.loads(self.world.get_blob(cursor))
            chunks.append(self.world.get_blob(node["chunk"]))
            cursor = node["prev"]
        data = b"".join(reversed(chunks))
        self._last = (Saved(digest, len(data)), data)
        return data

    def point(self, session_id: str, turn_id: str, epoch: int, saved: Saved) -> None:
        name = session_record_name(self.record_prefix, turn_id, epoch)
        self.world.put_session_record(session_id, name, saved.digest)


def latest_turn_transcript(
    world: World, session_id: str, turn_id: str, epoch: int, record_prefix: str = "claude-code"
) -> str | None:
    """The newest transcript save of the turn by an earlier lease epoch, or None."""
    for older in range(epoch - 1, -1, -1):
        digest = world.get_session_record(
            session_id, session_record_name(record_prefix, turn_id, older)
        )
        if digest is not None:
            return digest
    return None


#: ``(world, session_id, turn_id, epoch)`` -> the turn's newest record save by an epoch
#: before ``epoch`` (:func:`latest_turn_transcript`'s shape), or None.
LatestSave = Callable[[World, str, str, int], str | None]


def previous_turn_transcript(
    world: World, session_id: str, index: int, latest_save: LatestSave | None = None
) -> str | None:
    """The final transcript of the session's newest finished turn before ``index``: the
    outcome of its last finished launch; for a turn that was cancelled mid-launch (given
    ``latest_save``), the newest save of its record (before a tool intent, or when its CLI
    was stopped), so the next turn continues from what the cancelled one finished. A turn
    cancelled before it ran has neither and is passed over."""

    def transcript(value: Any) -> str | None:
        if isinstance(value, dict) and value.get("transcript"):
            return str(value["transcript"])
        return None

    return previous_turn_record(world, session_id, index, transcript, latest_save)


def previous_turn_record(
    world: World,
    session_id: str,
    index: int,
    from_outcome: Callable[[Any], T | None],
    latest_save: Callable[[World, str, str, int], T | None] | None = None,
) -> T | None:
    """The CLI's record as the session's newest finished turn before ``index`` left it:
    ``from_outcome`` of its last finished launch's outcome; failing that, for a turn that
    was cancelled mid-launch, ``latest_save`` of it (its newest save by any epoch)."""
    for turn in reversed(world.list_turns(session_id)):
        if turn.index >= index or turn.status not in (TurnStatus.DONE, TurnStatus.CANCELLED):
            continue
        launches = [s for s in world.load_steps(turn.turn_id) if is_launch_key(s.key)]
        done = [s for s in launches if s.status is StepStatus.DONE]
        if done:
            record = from_outcome(decode_output(world, done[-1]))
            if record is not None:
                return record
        if turn.status is TurnStatus.CANCELLED and latest_save is not None:
            saved = latest_save(world, session_id, turn.turn_id, turn.epoch + 1)
            if saved is not None:
                return saved
    return None


@dataclass(frozen=True)
class TranscriptFacts:
    tool_uses: frozenset[str]  # tool_use ids the transcript holds
    tool_results: frozenset[str]  # tool_use ids it holds a result for
    messages: frozenset[str]  # assistant message ids


def resume_message(
    world: World,
    prompt: str,
    steps: list[Step],
    transcript: bytes,
    facts_of: Callable[[bytes], TranscriptFacts],
) -> str:
    """The prompt that continues an interrupted turn, written from its journal.

    Lists every tool call of the turn the journal knows of: finished (quoting the result
    if the restored transcript lacks it), possibly ran (the model must check before
    repeating it), interrupted but safe to repeat, or never started. Model replies the
    restored transcript lacks are quoted too, so they are not asked for again.
    ``facts_of`` reads the CLI's session record.
    """
    facts = facts_of(transcript)
    return compose_resume_message(world, prompt, steps, facts, _lost_reply)


def resume_message_from_facts(
    world: World, prompt: str, steps: list[Step], facts: TranscriptFacts
) -> str:
    """:func:`resume_message` for a CLI on the Anthropic wire whose session record the
    adapter reads itself (``facts``: which calls, results and replies it holds)."""
    return compose_resume_message(world, prompt, steps, facts, _lost_reply)


def compose_resume_message(
    world: World,
    prompt: str,
    steps: list[Step],
    facts: TranscriptFacts,
    lost_reply: Callable[[World, Step], str],
) -> str:
    """:func:`resume_message` for any CLI: ``facts`` says what its restored session record
    holds, ``lost_reply`` quotes a recorded model reply the record lacks."""
    lines: list[str] = []
    tool_steps = {tool_use_id_of(s.key): s for s in steps if s.kind == "tool"}
    for step in steps:
        if step.kind == "model" and step.status is StepStatus.DONE:
            message_id = step.meta.get("message_id")
            if message_id and message_id not in facts.messages:
                lines.append(lost_reply(world, step))
            for tool_use_id in step.meta.get("tool_use_ids") or []:
                if tool_use_id not in tool_steps:
                    lines.append(
                        f"- tool call {tool_use_id}: did NOT run (it was stopped before it "
                        "started); make it again if it is still needed."
                    )
        elif step.kind == "tool":
            lines.append(_tool_line(world, step, tool_use_id_of(step.key), facts))
    listing = "\n".join(lines) if lines else "- (no tool call was recorded)"
    return (
        "[durable-harness] This turn was interrupted (the process running it stopped) and "
        "is resumed from its journal. Do not start over: continue the task from where it "
        "stopped. What the journal recorded about this turn's calls:\n"
        f"{listing}\n"
        "Calls marked MAY OR MAY NOT HAVE HAPPENED must not be repeated blindly: check "
        "the current state first (read-only), and repeat a call only if its effect is "
        f"absent.\nThe task, as first given: {prompt}"
    )


def _tool_line(world: World, step: Step, tool_use_id: str, facts: TranscriptFacts) -> str:
    label = f"- {step.name} {tool_use_id}"
    if step.status is StepStatus.DONE:
        if tool_use_id in facts.tool_results:
            return f"{label}: finished (its result is above)."
        return f"{label}: finished. Its result: {_quote(decode_output(world, step))}"
    if step.status is StepStatus.POSSIBLY_RAN:
        key = idempotency_key(step.turn_id, step.seq)
        return f"{label}: MAY OR MAY NOT HAVE HAPPENED. {POSSIBLY_RAN_MESSAGE.format(key=key)}"
    return f"{label}: was interrupted; it is safe to run it again."


def _lost_reply(world: World, step: Step) -> str:
    """A recorded reply the restored transcript lacks, quoted for the resumed CLI."""
    message = message_of(decode_output(world, step))
    parts = []
    for block in message.get("content") or []:
        if block.get("type") == "text":
            parts.append(f"text {json.dumps(block.get('text', ''))}")
        elif block.get("type") == "tool_use":
            parts.append(f"tool call {block.get('id')} {block.get('name')} {block.get('input')}")
    return f"- your reply {message.get('id')} (recorded): " + "; ".join(parts)


def _quote(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) > RESULT_QUOTE_CHARS:
        text = text[:RESULT_QUOTE_CHARS] + f"… ({len(text) - RESULT_QUOTE_CHARS} more chars)"
    return text


def jsonl_messages(data: bytes) -> Iterator[dict[str, Any]]:
    """The ``message`` objects of a session file of JSON lines (``{"message": {...}}``
    entries, as Claude Code's transcript and Pi's session file write them); lines that
    do not parse, or hold no message, are skipped (a line may still be half written)."""
    for line in data.splitlines():
        try:
            entry = parse_json(line)
        except (ValueError, RecursionError):  # the agent writes the file: any bytes, any depth
            continue
        message = entry.get("message") if isinstance(entry, dict) else None
        if isinstance(message, dict):
            yield message
