"""What a Claude Code transcript already tells the resumed CLI (for the resume message of
:mod:`.cli.records`)."""

from __future__ import annotations

import json

from durable_harness.adapters.cli.records import TranscriptFacts, jsonl_messages


def transcript_facts(data: bytes) -> TranscriptFacts:
    """What a Claude Code transcript already tells the CLI (unparseable lines are skipped)."""
    uses: set[str] = set()
    results: set[str] = set()
    messages: set[str] = set()
    for message in jsonl_messages(data):
        if message.get("role") == "assistant" and isinstance(message.get("id"), str):
            messages.add(message["id"])
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use" and isinstance(block.get("id"), str):
                uses.add(block["id"])
            elif (
                block.get("type") == "tool_result"
                and isinstance(block.get("tool_use_id"), str)
                # The CLI's own "[Tool call interrupted …]" is not a result.
                and "Tool call interrupted" not in json.dumps(block.get("content"))
            ):
                results.add(block["tool_use_id"])
    return TranscriptFacts(frozenset(uses), frozenset(results), frozenset(messages))
