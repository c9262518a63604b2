"""The Anthropic Messages API as the journaling proxy sees it (``POST /v1/messages``,
``x-api-key``, events ending in ``message_stop``; the SSE itself in :mod:`.proxy.sse`)."""

from __future__ import annotations

from typing import Any

from durable_harness.adapters.proxy.sse import assemble_message, error_event, events_for_message
from durable_harness.adapters.proxy.wire.base import WireFormat


class AnthropicMessages(WireFormat):
    name = "anthropic-messages"
    path = "/v1/messages"
    plain_paths = ("/v1/messages/count_tokens",)
    final_event = "message_stop"

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

    def meta(self, response: dict[str, Any]) -> dict[str, Any]:
        usage = response.get("usage") or {}
        return {
            "input_tokens": int(usage.get("input_tokens") or 0)
            + int(usage.get("cache_read_input_tokens") or 0)
            + int(usage.get("cache_creation_input_tokens") or 0),
            "output_tokens": int(usage.get("output_tokens") or 0),
            "stop_reason": response.get("stop_reason"),
            "message_id": response.get("id"),
            "tool_use_ids": [
                b.get("id") for b in response.get("content") or [] if b.get("type") == "tool_use"
            ],
        }


ANTHROPIC = AnthropicMessages()
