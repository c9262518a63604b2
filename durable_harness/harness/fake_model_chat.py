"""The fake model's OpenAI Chat Completions API: the same rules, a third wire format.

``POST /v1/chat/completions`` is answered from the same TOML scripts as the Messages API.
The request's ``messages`` are read as the Messages conversation they are equivalent to,
so every ``when`` condition means the same thing for every API:

* ``system``/``developer`` messages are the system prompt; ``user`` and ``assistant``
  messages are messages (a string content, or ``text`` parts);
* an assistant's ``tool_calls`` are ``tool_use`` blocks whose id is the call's ``id`` and
  whose input is its parsed ``function.arguments``; a ``tool`` message is a user
  ``tool_result`` for its ``tool_call_id``;
* consecutive messages of one role are one message (tool results and a new prompt after
  them are the last user message, as in the Messages API).

A reply is one ``choices[0].message``: its text is ``content``, each ``tool_use`` a
``tool_calls`` entry (``type: function``, the input as JSON ``arguments``), and
``finish_reason`` is ``tool_calls`` or ``stop``. Streamed, it is ``data: {chunk}`` lines
(``chat.completion.chunk``: a role chunk, content deltas, tool-call deltas, a chunk with
the ``finish_reason``, a usage chunk when ``stream_options.include_usage`` asks for one)
ending with ``data: [DONE]``. Ids come from the request's hash, which ignores what a
client changes between two sends of one question (``stream``, ``stream_options``,
``metadata``, ``prompt_cache_key``).
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
    "CHAT_PATH",
    "DONE_FRAME",
    "as_messages_request",
    "build_completion",
    "chat_frame",
    "chat_request_hash",
    "chat_view",
    "completion_chunks",
]

CHAT_PATH = "/v1/chat/completions"
DONE_FRAME = b"data: [DONE]\n\n"
_VOLATILE_FIELDS = ("stream", "stream_options", "metadata", "prompt_cache_key")
_CREATED = 1_700_000_000  # fixed, so a re-sent request gets byte-identical chunks


def as_messages_request(request: dict[str, Any]) -> dict[str, Any]:
    """The Messages API request a Chat Completions request is equivalent to."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})

    given = request.get("messages")
    for message in given if isinstance(given, list) else []:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role") or "user")
        text = _text(message.get("content"))
        if role in ("system", "developer"):
            system.append(text)
        elif role == "tool":
            add(
                "user",
                {
                    "type": "tool_result",
                    "tool_use_id": str(message.get("tool_call_id") or ""),
                    "content": [{"type": "text", "text": text}],
                },
            )
        elif role == "assistant":
            if text:
                add("assistant", {"type": "text", "text": text})
            calls = message.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict):
                    continue
                add(
                    "assistant",
                    {
                        "type": "tool_use",
                        "id": str(call.get("id") or ""),
                        "name": str(function.get("name") or ""),
                        "input": _arguments(function.get("arguments")),
                    },
                )
        else:
            add("user", {"type": "text", "text": text})
    tools = request.get("tools")
    names = [
        t["function"]["name"]
        for t in (tools if isinstance(tools, list) else [])
        if isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    ]
    return {
        "model": request.get("model"),
        "system": "\n".join(system),
        "messages": messages,
        "tools": [{"name": name} for name in names],
    }


def chat_view(request: dict[str, Any]) -> RequestView:
    return RequestView.of(as_messages_request(request))


def chat_request_hash(request: dict[str, Any]) -> str:
    """sha256 of the request without what changes between two sends of one question."""
    stable = {k: v for k, v in request.items() if k not in _VOLATILE_FIELDS}
    return hashlib.sha256(canonical_json(stable).encode("utf-8")).hexdigest()


def build_completion(request: dict[str, Any], rule: Rule, digest: str) -> dict[str, Any]:
    """The ``chat.completion`` ``rule`` gives to ``request`` (ids seeded by ``digest``)."""
    message: dict[str, Any] = {"role": "assistant", "content": rule.reply.text, "refusal": None}
    calls = []
    for index, tool in enumerate(rule.reply.tool_use):
        seed = hashlib.sha256(f"{digest}{index}".encode()).hexdigest()
        calls.append(
            {
                "id": "call_" + seed[:24],
                "type": "function",
                "function": {
                    "name": tool.name,
                    "arguments": json.dumps(tool.input, ensure_ascii=False),
                },
            }
        )
    if calls:
        message["tool_calls"] = calls
    prompt_tokens = max(1, len(canonical_json(request.get("messages"))) // 4)
    completion_tokens = max(1, len(canonical_json(message)) // 4)
    model = request.get("model")
    return {
        "id": "chatcmpl-" + digest[:24],
        "object": "chat.completion",
        "created": _CREATED,
        "model": model if isinstance(model, str) else "fake-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "system_fingerprint": None,
    }


def completion_chunks(completion: dict[str, Any], usage: bool = True) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects OpenAI streams for ``completion``, in order
    (a last usage chunk with ``usage``, as ``stream_options.include_usage`` asks)."""
    head = {
        "id": completion.get("id"),
        "object": "chat.completion.chunk",
        "created": completion.get("created"),
        "model": completion.get("model"),
        "system_fingerprint": completion.get("system_fingerprint"),
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice]}

    choices = completion.get("choices") or [{}]
    message = choices[0].get("message") or {}
    chunks = [chunk({"role": "assistant", "content": "", "refusal": None})]
    text = message.get("content")
    if isinstance(text, str) and text:
        chunks.extend(chunk({"content": piece}) for piece in _text_pieces(text))
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        arguments = str(function.get("arguments", ""))
        opening = {
            "index": index,
            "id": call.get("id"),
            "type": "function",
            "function": {"name": function.get("name"), "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [opening]}))
        size = max(1, -(-len(arguments) // 3))
        chunks.extend(
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in (arguments[i : i + size] for i in range(0, len(arguments), size))
        )
    chunks.append(chunk({}, choices[0].get("finish_reason") or "stop"))
    if usage and completion.get("usage") is not None:
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return chunks


def chat_frame(data: dict[str, Any]) -> bytes:
    """One SSE frame of the Chat Completions API: a ``data:`` line, no event name."""
    return b"data: " + dumps_compact(data) + b"\n\n"


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
            return json.loads(value) if value.strip() else {}
        except ValueError:
            return value
    return value if value is not None else {}
