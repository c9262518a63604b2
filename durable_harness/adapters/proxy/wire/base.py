"""The wire-format seam of the journaling proxy: what differs between model APIs.

The proxy's contract (journal each call by its canonical hash, replay a recorded answer
byte for byte, hold the stream's final event back until the outcome is recorded, pass
upstream errors through and never record them) is the same for every API. What differs is
described by one :class:`WireFormat` per API, one module each:

* :class:`~.wire.anthropic.AnthropicMessages`: ``POST /v1/messages``, ``x-api-key``,
  events ending in ``message_stop``;
* :class:`~.wire.responses.OpenAIResponses`: ``POST /v1/responses``, ``Authorization:
  Bearer``, events ending in ``response.completed``;
* :class:`~.wire.chat.OpenAIChatCompletions`: ``POST /v1/chat/completions``,
  ``Authorization: Bearer``, ``data:`` chunks ending in ``data: [DONE]``.

Every format uses SSE framing (blocks split by :mod:`.proxy.sse`); how a block is read
(:meth:`WireFormat.parse_event`) and what an event means is the format's.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_harness.adapters.proxy.sse import SseEvent, parse_event
from durable_harness.core.canonical import parse_json

__all__ = ["WireFormat", "WireTable"]


@dataclass(frozen=True)
class WireTable:
    """What a CLI's model call of one API may hold: the allow-lists the proxy's policy
    (:mod:`.proxy.policy`) checks before a request is journaled or forwarded. Anything
    not named here is refused: a new field of an API is a feature someone must look at
    (does it reach the network, read the account's data, cost more?) before it passes."""

    #: Top-level request fields a model call may carry.
    fields: frozenset[str]
    #: The request fields that cap the answer's length (each checked against the ceiling).
    token_fields: tuple[str, ...]
    #: ``tools[i].type`` values of tools the client runs itself (``None``: no type given).
    client_tools: frozenset[str | None]
    #: Tool types that run at the provider unless the tool says ``"execution": "client"``,
    #: which the client then runs itself (the Responses API's ``tool_search``: Codex
    #: searches its own deferred tools with it).
    client_executed: frozenset[str] = frozenset()
    #: Fields allowed only when false (``store``: nothing kept on the harness's account).
    off_fields: frozenset[str] = frozenset()
    #: A tool type that groups tools (each checked as a tool): Codex's ``namespace``.
    group_tool: str | None = None
    #: Provider-side tools a CLI declares in every request whatever it is told (Codex's
    #: ``web_search``): unless the operator enabled them they are taken out of the
    #: request forwarded upstream, instead of refusing the CLI's every call. The journal
    #: key stays the one of the request the CLI sent.
    stripped_tools: frozenset[str] = frozenset()
    #: Query parameters the API's clients send (Claude Code: ``?beta=true``).
    query: frozenset[str] = frozenset()
    #: The header that switches on beta features, and the betas the CLIs send.
    beta_header: str | None = None
    betas: frozenset[str] = frozenset()
    #: Request fields that are provider-side tools -> the server tool family (as the
    #: operator enables it) they belong to.
    server_fields: Mapping[str, str] = field(default_factory=dict)
    #: Headers that select another account scope for the harness's key.
    refused_headers: frozenset[str] = frozenset()


class WireFormat(abc.ABC):
    """One model API as the proxy sees it."""

    name: str
    #: The journaled path (query string ignored).
    path: str
    #: Other POST paths forwarded upstream unjournaled (they cost nothing, change nothing).
    plain_paths: tuple[str, ...] = ()
    #: The event that ends a good stream: held back until the outcome is recorded.
    final_event: str
    #: Events that end a stream as a failure: passed on, never recorded.
    error_events: frozenset[str] = frozenset({"error"})
    #: What a request of this API may hold (:mod:`.proxy.policy`).
    table: WireTable

    def parse_event(self, raw: str) -> SseEvent | None:
        """The event in ``raw`` (None for a keep-alive); MalformedStream if it is none."""
        return parse_event(raw)

    def holds_back(self, event: SseEvent) -> bool:
        """Whether ``event`` is the first one the CLI may not see before the outcome is
        recorded: it and every later event are held back until then."""
        return event.type == self.final_event

    @abc.abstractmethod
    def auth_headers(self, api_key: str) -> dict[str, str]:
        """The headers that carry the harness's key upstream."""

    @abc.abstractmethod
    def error_body(self, kind: str, message: str) -> dict[str, Any]:
        """An error response body in this API's shape (the proxy's own errors)."""

    @abc.abstractmethod
    def error_event(self, kind: str, message: str) -> str:
        """An in-stream error event (the proxy's report of a malformed upstream stream)."""

    @abc.abstractmethod
    def assemble(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        """The JSON response a stream describes (parsed event data, final event included)."""

    @abc.abstractmethod
    def is_response(self, body: Any) -> bool:
        """Whether a non-streamed JSON reply is a whole response of this API."""

    @abc.abstractmethod
    def events_for(self, response: dict[str, Any]) -> list[str]:
        """SSE event texts for a JSON response (a streaming request replaying a JSON answer)."""

    @abc.abstractmethod
    def text_delta(self, event: SseEvent) -> str | None:
        """The piece of model text ``event`` carries (what the turn's event log streams
        live), or None: tool input, reasoning and bookkeeping events carry none."""

    @abc.abstractmethod
    def meta(self, response: dict[str, Any]) -> dict[str, Any]:
        """Journal metadata of a response: ``model`` (the response's; None when it names
        none, and the proxy then records the request's), the token counts of
        :mod:`durable_harness.core.usage`, ``stop_reason``, ``message_id``,
        ``tool_use_ids``."""


def error_text(data: bytes | str) -> str:
    """A short ``type: message`` of an error body or event, whatever the API's shape."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    for line in text.splitlines() or [text]:
        payload = line.removeprefix("data: ")
        try:
            value = parse_json(payload)
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        error = value.get("error")
        if not isinstance(error, dict) and isinstance(value.get("response"), dict):
            error = value["response"].get("error")  # Responses: response.failed
        if not isinstance(error, dict) and value.get("type") == "error":
            error = value  # Responses: a bare error event
        if isinstance(error, dict):
            kind = error.get("type") or error.get("code") or "error"
            return f"{kind}: {error.get('message', '')}".strip()
    return text[:300]


def content_text(content: Any) -> str:
    """The text of an OpenAI message's ``content``: a string, or the ``text`` of its parts
    joined by newlines (other parts carry no text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text"))
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def add_block(messages: list[dict[str, Any]], role: str, block: dict[str, Any]) -> None:
    """Append ``block`` to a Messages API message list: to the last message if it has
    ``role`` (the Messages API alternates roles), else as a new message."""
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].append(block)
    else:
        messages.append({"role": role, "content": [block]})
