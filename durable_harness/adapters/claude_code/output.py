"""What a launch of Claude Code printed: its stream-json lines, read into a reply.

The adapter feeds every stdout line (``--output-format stream-json``) to
:meth:`LaunchOutput.feed`, which keeps the final ``result`` event and, when the worker
shows progress, prints the assistant's text and tool calls. A re-attached launch feeds
the lines again from the first one: feeding is idempotent (only the last ``result``
counts). :meth:`LaunchOutput.reply` turns the result into the turn's reply, or into the
error that says what to do (a model error is retried, a CLI error fails the turn).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from durable_harness.adapters.cli.host import json_event
from durable_harness.core.errors import DurableHarnessError, ModelError, TurnFailed

__all__ = ["LaunchOutput", "progress"]


@dataclass
class LaunchOutput:
    result: dict[str, Any] | None = None
    stderr: str = ""
    status: int | None = None  # the CLI's exit status (None: stopped by the harness)

    def feed(self, line: bytes, show_progress: bool) -> None:
        event = json_event(line)
        if event is None:
            return
        if event.get("type") == "result":
            self.result = event
        elif event.get("type") == "assistant" and show_progress:
            for block in (event.get("message") or {}).get("content") or []:
                if block.get("type") == "text" and block.get("text"):
                    progress(f"claude: {block['text']}")
                elif block.get("type") == "tool_use":
                    progress(f"claude: {block.get('name')} {json.dumps(block.get('input'))}")

    def reply(self, upstream_errors: list[str]) -> str:
        result = self.result
        # The distinct model errors of this launch, oldest first (a stream that broke may be
        # followed by the CLI's non-streaming retry breaking another way).
        upstream = "; ".join(dict.fromkeys(upstream_errors[-3:])) or None
        if result is None:
            raise DurableHarnessError(
                f"Claude Code exited with status {self.status} without a result"
                + (f" (last model error: {upstream})" if upstream else "")
                + f": {self.stderr.strip()[-500:] or 'no output'}"
            )
        if result.get("is_error") or result.get("subtype") != "success":
            text = str(result.get("result") or result.get("subtype"))
            if result.get("terminal_reason") == "api_error" or upstream:
                raise ModelError(
                    f"the model call failed ({upstream or text}); the turn will be resumed"
                )
            raise TurnFailed(f"Claude Code ended the turn with an error: {text}")
        return str(result.get("result") or "")


def progress(text: str) -> None:
    text = text.replace("\n", " ")
    sys.stderr.write(f"  {text[:160]}\n")
    sys.stderr.flush()
