"""A custom agent loop on the ``anthropic`` SDK, made crash-safe by durable-harness.

The loop is yours: it builds each Messages request, calls the SDK, runs the tools the
model asks for. durable-harness only journals each call (``turn.model_call``,
``turn.run_tool``), so that running this program again with the same ``--turn`` after a
crash reads every finished call back instead of paying for it again, and an interrupted
``append_note`` (``replay="never"``) is not run twice: the model is told it possibly ran
and reads the notes before writing again.

    export ANTHROPIC_BASE_URL=http://127.0.0.1:8765      # `durable-harness fake-model ...`
    python examples/custom_anthropic.py --world local:///tmp/dh --turn note-1 \\
        "Write the note 'hello from my own loop' once."
    # kill it at any moment (or DURABLE_HARNESS_CRASH_AT=1:after_run), run it again

The World is ``--world URL`` (else ``DURABLE_HARNESS_WORLD``: docs/worlds.md); the model
endpoint and key are the SDK's ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY``.
The note goes to ``NOTES_FILE`` (default ``notes.txt``), outside the journal's reach,
like a payment provider's ledger.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
from pydantic import BaseModel

from durable_harness import JournaledTurn, Tool, ToolContext, journaled_turn, open_world, tool

MODEL = os.environ.get("EXAMPLE_MODEL", "claude-sonnet-4-6")
SYSTEM = (
    "You keep a notes file with the tools you are given. If a tool result says a call "
    "possibly ran, read the notes before calling it again."
)
MAX_MODEL_CALLS = 10
DESCRIPTION = "A custom agent loop on the anthropic SDK, made crash-safe by durable-harness."


class Note(BaseModel):
    text: str


class Nothing(BaseModel):
    pass


def notes_file() -> Path:
    return Path(os.environ.get("NOTES_FILE", "notes.txt"))


@tool(replay="never")
def append_note(args: Note, ctx: ToolContext) -> str:
    """Append one line to the notes file. It has a side effect: never repeat it blindly."""
    with notes_file().open("a", encoding="utf-8") as f:
        # A real API would take ctx.idempotency_key (<turn_id>:<seq>) and deduplicate.
        f.write(f"{args.text}  (key {ctx.idempotency_key})\n")
        f.flush()
        os.fsync(f.fileno())
    return "appended"


@tool(replay="safe")
def read_notes(args: Nothing) -> str:
    """Read the notes file."""
    path = notes_file()
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return f"notes:\n{text}" if text else "no notes yet"


TOOLS: dict[str, Tool] = {t.name: t for t in (append_note, read_notes)}


def agent_loop(turn: JournaledTurn, prompt: str) -> str:
    client: anthropic.Anthropic | None = None

    def send(request: dict[str, Any]) -> Any:
        nonlocal client
        client = client or anthropic.Anthropic()  # only for a live call: replays need no key
        return client.messages.create(**request)

    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for _ in range(MAX_MODEL_CALLS):
        request = {
            "model": MODEL,
            "max_tokens": 1024,
            "system": SYSTEM,
            "tools": [t.anthropic_spec() for t in TOOLS.values()],
            "messages": messages,
        }
        reply = turn.model_call(request, partial(send, request))
        messages.append({"role": "assistant", "content": reply["content"]})
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        if not uses:
            return "".join(b["text"] for b in reply["content"] if b["type"] == "text")
        results = []
        for use in uses:
            known = TOOLS.get(use["name"])
            if known is None:
                content, is_error = f"unknown tool {use['name']!r}", True
            else:
                result = turn.run_tool(known, use["input"], call_id=use["id"])
                content, is_error = result.text, result.is_error
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": use["id"],
                    "content": content,
                    "is_error": is_error,
                }
            )
        messages.append({"role": "user", "content": results})
    raise RuntimeError(f"no reply after {MAX_MODEL_CALLS} model calls")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("prompt")
    parser.add_argument("--world", help="World URL (default: env DURABLE_HARNESS_WORLD)")
    parser.add_argument("--turn", required=True, help="turn id: the same on every run")
    parser.add_argument("--force", action="store_true", help="take the turn without waiting")
    args = parser.parse_args(argv)
    with (
        open_world(args.world) as world,
        journaled_turn(world, args.turn, prompt=args.prompt, force=args.force) as turn,
    ):
        reply = agent_loop(turn, args.prompt)
        turn.finish(reply)
        print(f"{turn.replayed_steps} step(s) read back from the journal", file=sys.stderr)
    print(reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
