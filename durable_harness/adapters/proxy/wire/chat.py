"""The OpenAI Chat Completions API as the journaling proxy sees it (``POST
/v1/chat/completions``).

A streamed completion is ``data: {chunk}`` blocks with no ``event:`` name
(``chat.completion.chunk`` objects: a role chunk, content and tool-call deltas, a chunk
carrying the ``finish_reason``, then with ``stream_options.include_usage`` a usage chunk
with no choices) ending with ``data: [DONE]``.

What is held back: everything from the first chunk that carries a ``finish_reason`` to
``[DONE]``. A client library ends its answer on that chunk, or on the end of the stream,
not only on ``[DONE]`` (the OpenAI SDK stops reading at the end of the body, and a usage
chunk may follow the finish); holding back only ``[DONE]`` would hand the CLI a finished
answer the journal might not hold. Before that chunk the CLI has only deltas of an
unfinished answer, which a crash of the proxy cuts off with the connection (no chunked
terminator: the client sees a broken stream, not an end).

A ``data: {"error": …}`` block ends a stream as a failure (passed on, never recorded), as
does a stream that ends before ``[DONE]``. The key goes upstream as ``Authorization:
Bearer``.
"""

from __future__ import annotations

from typing import Any

from durable_harness.adapters.proxy.sse import MalformedStream, SseEvent, text_pieces
from durable_harness.adapters.proxy.wire.base import (
    WireFormat,
    WireTable,
    add_block,
    content_text,
)
from durable_harness.core.canonical import dumps_compact, parse_json
from durable_harness.core.usage import chat_usage, model_of

__all__ = ["CHAT", "OpenAIChatCompletions", "assemble_completion"]

#: What OpenCode and Pi send on Chat Completions (logged from their e2e tests), and the
#: plain sampling fields. Left out on purpose: ``audio``/``modalities``, ``prediction``,
#: ``metadata`` and a true ``store`` (completions stored on the harness's account),
#: ``service_tier``, ``n`` (one answer per call is what the journal records);
#: ``web_search_options`` is a provider-side search.
TABLE = WireTable(
    fields=frozenset(
        [
            "model",
            "messages",
            "store",
            "tools",
            "tool_choice",
            "stream",
            "stream_options",
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "stop",
            "parallel_tool_calls",
            "reasoning_effort",
            "response_format",
            "seed",
            "frequency_penalty",
            "presence_penalty",
            "user",
        ]
    ),
    token_fields=("max_tokens", "max_completion_tokens"),
    client_tools=frozenset({"function"}),
    off_fields=frozenset({"store"}),
    server_fields={"web_search_options": "web_search"},
    refused_headers=frozenset({"openai-organization", "openai-project"}),
)

DONE = "[DONE]"
CHUNK = "chat.completion.chunk"


class OpenAIChatCompletions(WireFormat):
    name = "openai-chat-completions"
    path = "/v1/chat/completions"
    final_event = DONE
    error_events = frozenset({"error"})
    table = TABLE

    def parse_event(self, raw: str) -> SseEvent | None:
        data_lines = [
            line[5:].removeprefix(" ")
            for line in raw.splitlines()
            if line.startswith("data:")  # event:, id:, retry: and comments carry nothing
        ]
        if not data_lines:
            return None
        text = "\n".join(data_lines)
        if text.strip() == DONE:
            return SseEvent(raw, DONE, {})
        try:
            data = parse_json(text)
        except ValueError:
            raise MalformedStream(f"chunk data is not JSON: {text[:120]!r}") from None
        if not isinstance(data, dict):
            raise MalformedStream(f"chunk data is not an object: {text[:120]!r}")
        if "error" in data:
            return SseEvent(raw, "error", data)
        if not isinstance(data.get("choices"), list):
            raise MalformedStream(f"chunk has no choices: {text[:120]!r}")
        return SseEvent(raw, str(data.get("object") or CHUNK), data)

    def holds_back(self, event: SseEvent) -> bool:
        if event.type == DONE:
            return True
        choices = event.data.get("choices") or []
        return any(isinstance(c, dict) and c.get("finish_reason") for c in choices)

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"}

    def error_body(self, kind: str, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": None, "code": kind}}

    def error_event(self, kind: str, message: str) -> str:
        return chat_frame({"error": self.error_body(kind, message)["error"]}).decode()

    def assemble(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        return assemble_completion(events)

    def is_response(self, body: Any) -> bool:
        return isinstance(body, dict) and body.get("object") == "chat.completion"

    def events_for(self, response: dict[str, Any]) -> list[str]:
        frames = [chat_frame(chunk) for chunk in completion_chunks(response)]
        return [frame.decode() for frame in frames] + [f"data: {DONE}\n\n"]

    def text_delta(self, event: SseEvent) -> str | None:
        pieces = [
            choice["delta"]["content"]
            for choice in event.data.get("choices") or ()
            if isinstance(choice, dict)
            and isinstance(choice.get("delta"), dict)
            and isinstance(choice["delta"].get("content"), str)
        ]
        return "".join(pieces) or None

    def meta(self, response: dict[str, Any]) -> dict[str, Any]:
        usage = response.get("usage") or {}
        choices = [c for c in response.get("choices") or [] if isinstance(c, dict)]
        calls = [
            call
            for choice in choices
            for call in (choice.get("message") or {}).get("tool_calls") or []
            if isinstance(call, dict)
        ]
        finish = choices[0].get("finish_reason") if choices else None
        return {
            "model": model_of(response, None),
            **chat_usage(usage if isinstance(usage, dict) else {}),
            "stop_reason": "tool_use" if calls else finish,
            "message_id": response.get("id"),
            "tool_use_ids": [call.get("id") for call in calls],
        }


def assemble_completion(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``chat.completion`` a stream of chunks describes (``[DONE]`` data is empty)."""
    completion: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    calls: dict[int, dict[int, dict[str, Any]]] = {}
    for chunk in chunks:
        if not chunk.get("choices") and "usage" not in chunk:
            continue  # [DONE]
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in chunk and key not in completion:
                completion[key] = chunk[key]
        if chunk.get("usage") is not None:
            completion["usage"] = chunk["usage"]
        for part in chunk.get("choices") or []:
            index = int(part.get("index") or 0)
            choice = choices.setdefault(
                index, {"index": index, "message": {"role": "assistant", "content": None}}
            )
            delta = part.get("delta") or {}
            message = choice["message"]
            if isinstance(delta.get("role"), str):
                message["role"] = delta["role"]
            for field in ("content", "reasoning_content", "refusal"):
                if isinstance(delta.get(field), str):
                    message[field] = (message.get(field) or "") + delta[field]
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(index, {}).setdefault(
                    int(call.get("index") or 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                function = call.get("function") or {}
                if function.get("name"):
                    slot["function"]["name"] = function["name"]
                slot["function"]["arguments"] += str(function.get("arguments") or "")
            if part.get("finish_reason"):
                choice["finish_reason"] = part["finish_reason"]
    for index, by_position in calls.items():
        choices[index]["message"]["tool_calls"] = [by_position[i] for i in sorted(by_position)]
    completion["object"] = "chat.completion"
    completion["choices"] = [{"finish_reason": None, **choices[i]} for i in sorted(choices)]
    return completion


CHAT = OpenAIChatCompletions()


DONE_FRAME = b"data: [DONE]\n\n"


def as_messages_request(request: dict[str, Any]) -> dict[str, Any]:
    """The Messages API request a Chat Completions request is equivalent to."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any]) -> None:
        add_block(messages, role, block)

    given = request.get("messages")
    for message in given if isinstance(given, list) else []:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role") or "user")
        text = content_text(message.get("content"))
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
        chunks.extend(chunk({"content": piece}) for piece in text_pieces(text))
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


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return parse_json(value) if value.strip() else {}
        except ValueError:
            return value
    return value if value is not None else {}
