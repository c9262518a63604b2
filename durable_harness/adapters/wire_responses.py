"""The OpenAI Responses API as the journaling proxy sees it (``POST /v1/responses``).

A streamed response is ``response.created``, ``response.in_progress``, per output item
``response.output_item.added`` … deltas … ``response.output_item.done``, and finally
``response.completed`` carrying the whole response object: that last event is held back
until the outcome is recorded. ``response.failed`` and ``error`` end a stream as a failure
(passed on, never recorded); a stream that ends on ``response.incomplete`` or without
``response.completed`` is not recorded either. The key goes upstream as ``Authorization:
Bearer``.
"""

from __future__ import annotations

from typing import Any

from durable_harness.adapters.wire import WireFormat
from durable_harness.harness.fake_model_responses import response_events
from durable_harness.harness.fake_model_script import sse_frame

__all__ = ["RESPONSES", "OpenAIResponses"]


class OpenAIResponses(WireFormat):
    name = "openai-responses"
    path = "/v1/responses"
    final_event = "response.completed"
    error_events = frozenset({"error", "response.failed"})

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"}

    def error_body(self, kind: str, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": None, "code": kind}}

    def error_event(self, kind: str, message: str) -> str:
        data = {
            "type": "response.failed",
            "response": {
                "object": "response",
                "status": "failed",
                "error": {"code": kind, "message": message},
            },
        }
        return sse_frame("response.failed", data).decode()

    def assemble(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        response: dict[str, Any] = {}
        items: dict[int, dict[str, Any]] = {}
        for event in events:
            kind = event.get("type")
            if kind in ("response.created", "response.in_progress", "response.completed"):
                response = dict(event.get("response") or {})
            elif kind == "response.output_item.done":
                items[int(event.get("output_index") or 0)] = dict(event.get("item") or {})
        if not response.get("output") and items:
            response["output"] = [items[i] for i in sorted(items)]
        return response

    def is_response(self, body: Any) -> bool:
        return isinstance(body, dict) and body.get("object") == "response"

    def events_for(self, response: dict[str, Any]) -> list[str]:
        return [sse_frame(name, data).decode() for name, data in response_events(response)]

    def meta(self, response: dict[str, Any]) -> dict[str, Any]:
        usage = response.get("usage") or {}
        output = [i for i in response.get("output") or [] if isinstance(i, dict)]
        calls = [i for i in output if i.get("type") in ("function_call", "custom_tool_call")]
        return {
            "input_tokens": int(usage.get("input_tokens") or 0),
            "output_tokens": int(usage.get("output_tokens") or 0),
            "stop_reason": "tool_use" if calls else response.get("status"),
            "message_id": response.get("id"),
            "tool_use_ids": [i.get("call_id") for i in calls],
        }


RESPONSES = OpenAIResponses()
