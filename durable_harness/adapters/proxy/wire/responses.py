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

from durable_harness.adapters.proxy.sse import SseEvent, sse_frame, text_pieces
from durable_harness.adapters.proxy.wire.base import (
    WireFormat,
    WireTable,
    add_block,
    content_text,
)
from durable_harness.core.canonical import parse_json
from durable_harness.core.usage import model_of, responses_usage

#: What Codex and Pi send on the Responses API (logged from their e2e tests), and the
#: plain sampling fields. Left out on purpose: ``previous_response_id``, ``conversation``
#: and ``prompt`` (they read state stored on the harness's account), ``background`` (an
#: answer fetched later, outside the journal), ``service_tier``; tools the provider runs
#: (web_search*, file_search, code_interpreter, computer_use*, image_generation, mcp,
#: local_shell...). Codex 0.171 declares ``web_search`` in every request: stripped.
TABLE = WireTable(
    fields=frozenset(
        [
            "model",
            "input",
            "instructions",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "reasoning",
            "store",
            "stream",
            "include",
            "prompt_cache_key",
            "text",
            "max_output_tokens",
            "temperature",
            "top_p",
            "client_metadata",
            "truncation",
            "stream_options",
        ]
    ),
    token_fields=("max_output_tokens",),
    client_tools=frozenset({"function", "custom"}),
    # codex-acp (Codex core 0.137.0, acp:codex) declares it for every model it knows.
    client_executed=frozenset({"tool_search"}),
    off_fields=frozenset({"store"}),
    group_tool="namespace",
    stripped_tools=frozenset({"web_search"}),
    refused_headers=frozenset({"openai-organization", "openai-project"}),
)

__all__ = ["RESPONSES", "OpenAIResponses"]


class OpenAIResponses(WireFormat):
    name = "openai-responses"
    path = "/v1/responses"
    final_event = "response.completed"
    error_events = frozenset({"error", "response.failed"})
    table = TABLE

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

    def text_delta(self, event: SseEvent) -> str | None:
        if event.type != "response.output_text.delta":
            return None
        delta = event.data.get("delta")
        return delta if isinstance(delta, str) else None

    def meta(self, response: dict[str, Any]) -> dict[str, Any]:
        usage = response.get("usage") or {}
        output = [i for i in response.get("output") or [] if isinstance(i, dict)]
        calls = [i for i in output if i.get("type") in ("function_call", "custom_tool_call")]
        return {
            "model": model_of(response, None),
            **responses_usage(usage if isinstance(usage, dict) else {}),
            "stop_reason": "tool_use" if calls else response.get("status"),
            "message_id": response.get("id"),
            "tool_use_ids": [i.get("call_id") for i in calls],
        }


RESPONSES = OpenAIResponses()


def as_messages_request(request: dict[str, Any]) -> dict[str, Any]:
    """The Messages API request a Responses request is equivalent to (for matching)."""
    items = request.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    system: list[str] = []
    if isinstance(request.get("instructions"), str):
        system.append(request["instructions"])
    messages: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any]) -> None:
        add_block(messages, role, block)

    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role = str(item.get("role") or "user")
            text = content_text(item.get("content"))
            if role in ("developer", "system"):
                system.append(text)
            else:
                add("assistant" if role == "assistant" else "user", {"type": "text", "text": text})
        elif kind in ("function_call", "custom_tool_call"):
            add(
                "assistant",
                {
                    "type": "tool_use",
                    "id": str(item.get("call_id") or ""),
                    "name": str(item.get("name") or ""),
                    "input": _arguments(item.get("arguments", item.get("input"))),
                },
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            add(
                "user",
                {
                    "type": "tool_result",
                    "tool_use_id": str(item.get("call_id") or ""),
                    "content": [{"type": "text", "text": content_text(item.get("output"))}],
                },
            )
    tools = request.get("tools")
    return {
        "model": request.get("model"),
        "system": "\n".join(system),
        "messages": messages,
        "tools": [
            {"name": t["name"]}
            for t in (tools if isinstance(tools, list) else [])
            if isinstance(t, dict) and isinstance(t.get("name"), str)
        ],
    }


def response_events(response: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events OpenAI sends for ``response``, in order, as (type, data)."""
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for index, item in enumerate(response.get("output") or []):
        item_id = item.get("id")
        if item.get("type") == "message":
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "content": []},
                }
            )
            for part_index, part in enumerate(item.get("content") or []):
                where = {"item_id": item_id, "output_index": index, "content_index": part_index}
                text = str(part.get("text", ""))
                events.append(
                    {"type": "response.content_part.added", **where, "part": {**part, "text": ""}}
                )
                events.extend(
                    {"type": "response.output_text.delta", **where, "delta": piece}
                    for piece in text_pieces(text)
                )
                events.append({"type": "response.output_text.done", **where, "text": text})
                events.append({"type": "response.content_part.done", **where, "part": part})
        elif item.get("type") == "function_call":
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            arguments = str(item.get("arguments", ""))
            size = max(1, -(-len(arguments) // 3))
            where = {"item_id": item_id, "output_index": index}
            events.extend(
                {"type": "response.function_call_arguments.delta", **where, "delta": piece}
                for piece in (arguments[i : i + size] for i in range(0, len(arguments), size))
            )
            events.append(
                {"type": "response.function_call_arguments.done", **where, "arguments": arguments}
            )
        else:
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": item}
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    return [(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events)]


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return parse_json(value)
        except ValueError:
            return value
    return value if value is not None else {}
