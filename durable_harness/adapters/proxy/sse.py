"""Server-sent events of the Anthropic Messages API: split, check, assemble, synthesize.

The journaling proxy records a streamed response as the list of its events, each kept as
the exact text the provider sent (``event: …\\ndata: …\\n\\n``), so a replay is byte for
byte what the CLI first saw. This module cuts a byte stream into those events as they
arrive (:class:`EventSplitter`), checks each one (:func:`parse_event`), and turns a
finished list of events into the JSON message a non-streaming request expects
(:func:`assemble_message`), or the reverse (:func:`events_for_message`).

Why the splitting and parsing are written here, not taken from ``httpx-sse`` (or the
``EventSource`` that ``httpx2`` ships, derived from it): those read the response
themselves and yield *parsed* events (``event``, ``data``, ``id``, ``retry``), with line
endings normalized, comments dropped and the terminator consumed. The proxy needs the
opposite: the exact bytes of each event, to pass on at once and to record, so that a
replay is byte for byte what upstream sent (``\\r\\n`` framing and keep-alive comments
included), while the tee reads the raw body itself (:meth:`.upstream.UpstreamReply.chunks`).
A library event cannot be turned back into its bytes, so using one would mean parsing
twice and splitting by hand anyway. What is left here is small: cut at the first blank
line (:class:`EventSplitter`), read ``event:``/``data:`` lines (:func:`parse_event`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from durable_harness.core.canonical import dumps_compact, parse_json

__all__ = [
    "EventSplitter",
    "MalformedStream",
    "SseEvent",
    "assemble_message",
    "error_event",
    "event_bytes",
    "events_for_message",
    "parse_event",
]


class MalformedStream(ValueError):
    """An event that is not ``event:``/``data:`` lines holding a JSON object with a type."""


@dataclass(frozen=True)
class SseEvent:
    raw: str  # the event exactly as received, blank-line terminator included
    type: str
    data: dict[str, Any]


class EventSplitter:
    """Cuts a byte stream into complete SSE events (text), keeping partial ones for later.

    Bytes may split a UTF-8 character or an event anywhere; only whole events come out.
    A byte that is not part of valid UTF-8 comes out as the surrogate ``surrogateescape``
    maps it to (U+DC80..U+DCFF): the event is still recorded and passed on, and
    :func:`event_bytes` gives back exactly the bytes received (the journal's canonical
    JSON keeps such a surrogate as its ``\\udcXX`` escape, so a replay sends them too).
    """

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[str]:
        self._pending += chunk
        events: list[str] = []
        while True:
            cut = _event_end(self._pending)
            if cut < 0:
                return events
            raw, self._pending = self._pending[:cut], self._pending[cut:]
            events.append(raw.decode("utf-8", "surrogateescape"))

    @property
    def leftover(self) -> bytes:
        """Bytes of an event that never ended (non-empty only for a cut-off stream)."""
        return self._pending


def event_bytes(text: str) -> bytes:
    """The bytes of an event text from :class:`EventSplitter` (or one made here)."""
    return text.encode("utf-8", "surrogateescape")


def _event_end(buffer: bytes) -> int:
    """Index just past the first blank line (``\\n\\n`` or ``\\r\\n\\r\\n``), or -1."""
    ends = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n") if (i := buffer.find(sep)) >= 0]
    return min(ends) if ends else -1


def parse_event(raw: str) -> SseEvent | None:
    """The event in ``raw``; None for a comment-only or empty block (a keep-alive).

    MalformedStream when the data is not a JSON object with a ``type``, or when the
    ``event:`` name disagrees with it.
    """
    name = ""
    data_lines: list[str] = []
    for line in raw.splitlines():
        if not line or line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data_lines.append(value)
    if not data_lines:
        if name:
            raise MalformedStream(f"event {name!r} has no data")
        return None
    text = "\n".join(data_lines)
    try:
        data = parse_json(text)
    except ValueError:
        raise MalformedStream(f"event data is not JSON: {text[:120]!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise MalformedStream(f"event data has no type: {text[:120]!r}")
    if name and name != data["type"]:
        raise MalformedStream(f"event {name!r} carries data of type {data['type']!r}")
    return SseEvent(raw, data["type"], data)


def assemble_message(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The message a stream describes (``events`` are parsed event data, in order)."""
    message: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    partial_json: dict[int, str] = {}
    for event in events:
        kind = event.get("type")
        if kind == "message_start":
            message = dict(event.get("message") or {})
            message["usage"] = dict(message.get("usage") or {})
        elif kind == "content_block_start":
            index = int(event["index"])
            blocks[index] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            _apply_delta(blocks.setdefault(int(event["index"]), {}), event, partial_json)
        elif kind == "content_block_stop":
            index = int(event["index"])
            if index in partial_json:
                text = partial_json.pop(index)
                blocks[index]["input"] = parse_json(text) if text.strip() else {}
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            for key in ("stop_reason", "stop_sequence"):
                if key in delta:
                    message[key] = delta[key]
            message.setdefault("usage", {}).update(event.get("usage") or {})
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return message


def _apply_delta(block: dict[str, Any], event: dict[str, Any], partial: dict[int, str]) -> None:
    delta = event.get("delta") or {}
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + str(delta.get("text", ""))
    elif kind == "input_json_delta":
        index = int(event["index"])
        partial[index] = partial.get(index, "") + str(delta.get("partial_json", ""))
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature", "")
    elif kind == "citations_delta":
        block.setdefault("citations", []).append(delta.get("citation"))


def events_for_message(message: dict[str, Any]) -> list[str]:
    """SSE event texts for a finished JSON message (when a stream replays a JSON answer)."""
    usage = {"input_tokens": 0, "output_tokens": 0, **(message.get("usage") or {})}
    full = {"stop_reason": None, "content": [], **message, "usage": usage}
    return [sse_frame(name, data).decode() for name, data in stream_events(full)]


def error_event(error_type: str, message: str) -> str:
    """An in-stream error event, as Anthropic sends one when a stream fails midway."""
    data = {"type": "error", "error": {"type": error_type, "message": message}}
    return sse_frame("error", data).decode()


def stream_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events Anthropic would send for ``message``, in order, as (type, data)."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    # message_start carries a token-so-far count; the real total comes in message_delta.
    start["usage"] = {**message["usage"], "output_tokens": 1}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in text_pieces(block["text"])]
        else:
            opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            # Anthropic opens a tool's input with an empty partial_json, then cuts the JSON
            # anywhere (mid-string too): clients must join the pieces before parsing.
            raw = json.dumps(block["input"], ensure_ascii=False)
            deltas = [
                {"type": "input_json_delta", "partial_json": piece} for piece in ["", *_cut(raw, 3)]
            ]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
        )
        if index == 0:
            events.append(("ping", {"type": "ping"}))  # where Anthropic sends its first ping
        events.extend(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def sse_frame(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + dumps_compact(data) + b"\n\n"


def text_pieces(text: str, count: int = 4) -> list[str]:
    """Up to ``count`` pieces cut at word starts, so deltas look like a model's."""
    words = re.findall(r"\s*\S+\s*|\s+", text) or [text]
    target = max(1, -(-len(text) // count))
    pieces, current = [], ""
    for word in words:
        current += word
        if len(current) >= target:
            pieces.append(current)
            current = ""
    if current:
        pieces.append(current)
    return pieces


def _cut(text: str, count: int) -> list[str]:
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)]
