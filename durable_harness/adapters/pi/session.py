"""What Pi's session file already tells a resumed CLI (for the resume message).

Pi appends one JSON line per entry (``{"type": "message", "message": {...}}``): an
assistant message keeps its content blocks (``toolCall`` with ``id``) and the provider's
message id as ``responseId``; a tool result is a message of role ``toolResult`` with the
``toolCallId``. The "No result provided" result Pi shows the model for a call that was
cut off is made up per request and never written here, so it is not counted.
"""

from __future__ import annotations

from durable_harness.adapters.cli.records import TranscriptFacts, jsonl_messages

__all__ = ["pi_session_facts"]


def pi_session_facts(data: bytes) -> TranscriptFacts:
    """Tool call ids, tool result ids and assistant message ids in a Pi session file."""
    uses: set[str] = set()
    results: set[str] = set()
    messages: set[str] = set()
    for message in jsonl_messages(data):
        role = message.get("role")
        if role == "assistant":
            if isinstance(message.get("responseId"), str):
                messages.add(message["responseId"])
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if (
                    isinstance(block, dict)
                    and block.get("type") == "toolCall"
                    and isinstance(block.get("id"), str)
                ):
                    uses.add(block["id"])
        elif role == "toolResult" and isinstance(message.get("toolCallId"), str):
            results.add(message["toolCallId"])
    return TranscriptFacts(frozenset(uses), frozenset(results), frozenset(messages))
