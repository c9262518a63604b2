"""The Anthropic Messages API as the journaling proxy sees it (``POST /v1/messages``,
``x-api-key``, events ending in ``message_stop``; the SSE itself in :mod:`.proxy.sse`)."""

from __future__ import annotations

from typing import Any

from durable_harness.adapters.proxy.sse import (
    SseEvent,
    assemble_message,
    error_event,
    events_for_message,
)
from durable_harness.adapters.proxy.wire.base import WireFormat, WireTable
from durable_harness.core.usage import anthropic_usage, model_of

#: What Claude Code, Pi and OpenCode send on the Messages API (logged from their e2e
#: tests, docs/cli.md), and the plain sampling fields. Left out on purpose:
#: ``service_tier`` (a pricier tier); every beta not seen sent, such as the ones that
#: switch on provider-side tools, the Files API or Skills. ``mcp_servers`` (the provider
#: connects to any URL) and ``container`` (code execution's state) pass only with those
#: server tools enabled by the operator.
TABLE = WireTable(
    fields=frozenset(
        [
            "model",
            "messages",
            "system",
            "max_tokens",
            "metadata",
            "stop_sequences",
            "stream",
            "temperature",
            "top_k",
            "top_p",
            "tools",
            "tool_choice",
            "thinking",
            "context_management",
            "output_config",
            "output_format",
        ]
    ),
    token_fields=("max_tokens",),
    # A client tool has no type, or "custom"; every other type is run by the provider
    # (web_search_*, web_fetch_*, code_execution_*) or names a provider-defined schema
    # (computer_*, bash_*, text_editor_*, memory_*) that no CLI here uses.
    client_tools=frozenset({None, "custom"}),
    query=frozenset({"beta"}),
    server_fields={"mcp_servers": "mcp", "container": "code_execution"},
    beta_header="anthropic-beta",
    betas=frozenset(
        [
            "advanced-tool-use-2025-11-20",
            "claude-code-20250219",
            "context-management-2025-06-27",
            # Claude Code 2.1.332 under claude-code-acp (acp:claude-code): it knows the
            # model by an alias there, so it sets the effort it already sends as a field.
            "effort-2025-11-24",
            "interleaved-thinking-2025-05-14",
            "structured-outputs-2025-11-13",
            "thinking-display-updates-2026-08-18",
            "thinking-token-count-2026-05-13",
        ]
    ),
)


class AnthropicMessages(WireFormat):
    name = "anthropic-messages"
    path = "/v1/messages"
    plain_paths = ("/v1/messages/count_tokens",)
    final_event = "message_stop"
    table = TABLE

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key}

    def error_body(self, kind: str, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind, "message": message}}

    def error_event(self, kind: str, message: str) -> str:
        return error_event(kind, message)

    def assemble(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        return assemble_message(events)

    def is_response(self, body: Any) -> bool:
        return isinstance(body, dict) and body.get("type") == "message"

    def events_for(self, response: dict[str, Any]) -> list[str]:
        return events_for_message(response)

    def text_delta(self, event: SseEvent) -> str | None:
        delta = event.data.get("delta") if event.type == "content_block_delta" else None
        if isinstance(delta, dict) and delta.get("type") == "text_delta":
            text = delta.get("text")
            return text if isinstance(text, str) else None
        return None

    def meta(self, response: dict[str, Any]) -> dict[str, Any]:
        usage = response.get("usage") or {}
        return {
            "model": model_of(response, None),
            **anthropic_usage(usage if isinstance(usage, dict) else {}),
            "stop_reason": response.get("stop_reason"),
            "message_id": response.get("id"),
            "tool_use_ids": [
                b.get("id") for b in response.get("content") or [] if b.get("type") == "tool_use"
            ],
        }


ANTHROPIC = AnthropicMessages()
