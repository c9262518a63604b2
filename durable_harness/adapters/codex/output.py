"""What a Codex launch printed: its ``codex exec --json`` events and the reply they give
(see :mod:`.codex.spec`). A re-attached launch feeds the events again from the first line."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from durable_harness.adapters.cli.host import json_event
from durable_harness.core.errors import DurableHarnessError, ModelError, TurnFailed

__all__ = ["CodexOutput"]


@dataclass
class CodexOutput:
    thread: str | None = None
    replies: list[str] = field(default_factory=list)
    completed: bool = False
    failure: str | None = None

    def feed(self, line: bytes, *, show_progress: bool) -> None:
        """Take one stdout line (an event; anything else is ignored)."""
        event = json_event(line)
        if event is None:
            return
        kind = event.get("type")
        item: dict[str, Any] = event["item"] if isinstance(event.get("item"), dict) else {}
        if kind == "thread.started" and isinstance(event.get("thread_id"), str):
            self.thread = event["thread_id"]
        elif kind == "turn.completed":
            self.completed = True
        elif kind == "turn.failed":
            error = event.get("error") or {}
            self.failure = str(error.get("message") if isinstance(error, dict) else error)
        elif kind == "item.completed" and item.get("type") == "agent_message":
            self.replies.append(str(item.get("text") or ""))
            if show_progress:
                _progress(f"codex: {item.get('text')}")
        elif kind == "item.started" and item.get("type") == "command_execution" and show_progress:
            _progress(f"codex: $ {item.get('command')}")

    def reply(self, status: int | None, stderr: str, upstream_errors: list[str]) -> str:
        """The turn's reply; the error that says why there is none otherwise."""
        upstream = "; ".join(dict.fromkeys(upstream_errors[-3:])) or None
        if self.completed:
            return self.replies[-1] if self.replies else ""
        if upstream:
            raise ModelError(f"the model call failed ({upstream}); the turn will be resumed")
        if self.failure is not None:
            raise TurnFailed(f"Codex ended the turn with an error: {self.failure}")
        raise DurableHarnessError(
            f"Codex exited with status {status} without finishing the turn: "
            f"{stderr.strip()[-500:] or 'no output'}"
        )


def _progress(text: str) -> None:
    text = text.replace("\n", " ")
    sys.stderr.write(f"  {text[:160]}\n")
    sys.stderr.flush()
