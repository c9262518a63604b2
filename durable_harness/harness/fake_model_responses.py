"""The fake model's OpenAI Responses API: the same rules, another wire format.

``POST /v1/responses`` is answered from the same TOML scripts as the Messages API. The
request's ``input`` items are read as the Messages conversation they are equivalent to, so
every ``when`` condition means the same thing for both APIs:

* ``message`` items of role ``user``/``assistant`` are messages (``input_text`` /
  ``output_text`` parts are text blocks); ``developer``/``system`` items and
  ``instructions`` are the system prompt;
* a ``function_call`` (or ``custom_tool_call``) is an assistant ``tool_use`` whose id is
  the ``call_id``; a ``function_call_output`` is a user ``tool_result`` for it;
* consecutive items of one role are one message (so the last user message after a tool
  call holds the tool's output and any new prompt, as in the Messages API).

A reply's text becomes a ``message`` output item, each ``tool_use`` a ``function_call``
with its input as JSON ``arguments``. Ids are derived from the request's hash, which
ignores what a client changes between two sends of one question (``stream``,
``prompt_cache_key``, ``client_metadata``, ``metadata``, every input item's ``id``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from durable_harness.harness.fake_model_script import (
    RequestView,
    Rule,
    _text_pieces,
    canonical_json,
    dumps_compact,
)

__all__ = [
    "as_messages_request",
    "build_response",
    "response_error_body",
    "response_events",
    "responses_request_hash",
]

RESPONSES_PATH = "/v1/responses"
_VOLATILE_FIELDS = ("stream", "metadata", "prompt_cache_key", "client_metadata")
_CREATED_AT = 1_700_000_000  # fixed, so a re-sent request gets byte-identical events


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
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})

    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role = str(item.get("role") or "user")
            text = _text(item.get("content"))
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
                    "content": [{"type": "text", "text": _text(item.get("output"))}],
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


def responses_view(request: dict[str, Any]) -> RequestView:
    return RequestView.of(as_messages_request(request))


def responses_request_hash(request: dict[str, Any]) -> str:
    """sha256 of the request without what changes between two sends of one question."""
    stable = {k: v for k, v in request.items() if k not in _VOLATILE_FIELDS}
    if isinstance(stable.get("input"), list):
        stable["input"] = [
            {k: v for k, v in item.items() if k != "id"} if isinstance(item, dict) else item
            for item in stable["input"]
        ]
    return hashlib.sha256(canonical_json(stable).encode("utf-8")).hexdigest()


def build_response(request: dict[str, Any], rule: Rule, digest: str) -> dict[str, Any]:
    """The Responses API response ``rule`` gives to ``request`` (ids seeded by ``digest``)."""
    output: list[dict[str, Any]] = []
    if rule.reply.text is not None:
        output.append(
            {
                "id": "msg_" + digest[:24],
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": rule.reply.text, "annotations": []}],
            }
        )
    for index, tool in enumerate(rule.reply.tool_use):
        seed = hashlib.sha256(f"{digest}{index}".encode()).hexdigest()
        output.append(
            {
                "id": "fc_" + seed[:24],
                "type": "function_call",
                "status": "completed",
                "arguments": json.dumps(tool.input, ensure_ascii=False),
                "call_id": "call_" + seed[24:48],
                "name": tool.name,
                **({"namespace": tool.namespace} if tool.namespace else {}),
            }
        )
    input_tokens = max(1, len(canonical_json(request.get("input"))) // 4)
    output_tokens = max(1, len(canonical_json(output)) // 4)
    model = request.get("model")
    return {
        "id": "resp_" + digest[:24],
        "object": "response",
        "created_at": _CREATED_AT,
        "status": "completed",
        "model": model if isinstance(model, str) else "fake-model",
        "output": output,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
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
                    for piece in _text_pieces(text)
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


def response_error_body(error_type: str, message: str) -> bytes:
    """An error body shaped as OpenAI's."""
    return dumps_compact(
        {"error": {"message": message, "type": error_type, "param": None, "code": error_type}}
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text"))
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value if value is not None else {}
