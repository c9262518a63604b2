"""Which wire API a CLI's provider speaks to the journaling proxy: ``[provider] api``.

Pi and OpenCode can each reach a model through more than one API; the agent config
chooses (the default, ``anthropic``, is the Anthropic Messages API):

* pi: ``api = "anthropic" | "openai-completions" | "openai-responses"`` (Pi's
  ``models.json`` ``api`` values ``anthropic-messages``, ``openai-completions``,
  ``openai-responses``);
* opencode: ``api = "anthropic" | "openai-compatible"`` (the ``@ai-sdk/anthropic`` or
  ``@ai-sdk/openai-compatible`` provider; both are bundled in its binary, nothing is
  fetched).

Each choice brings its canonicalizer: the API's structural rules
(:mod:`.proxy.canonical`, :mod:`.proxy.canonical_chat`, :mod:`.proxy.canonical_responses`)
with the CLI's rules for its volatile text (:mod:`.pi.canonical`, :mod:`.opencode.canonical`,
put together by :mod:`.pi.provider` and :mod:`.opencode.provider`), the same
whatever the API, and a view of a request as an Anthropic one for the tool hooks'
:meth:`~.hooks.ToolHooks.close_from_request`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from durable_harness.adapters.proxy.canonical import Canonicalizer, ToolOutcomes
from durable_harness.adapters.proxy.canonical_chat import ChatCanonicalizer
from durable_harness.adapters.proxy.canonical_responses import ResponsesCanonicalizer
from durable_harness.adapters.proxy.wire import anthropic, chat, responses

__all__ = [
    "anthropic_view",
    "api_wire",
]


def anthropic_view(body: dict[str, Any]) -> dict[str, Any]:
    """A model request as the Anthropic Messages request it is equivalent to (tool
    results as ``tool_result`` blocks of the last user message), whatever its API."""
    if isinstance(body.get("input"), list | str):
        return responses.as_messages_request(body)
    messages = body.get("messages")
    if isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") in ("tool", "system", "developer") for m in messages
    ):
        return chat.as_messages_request(body)
    return body


def api_wire(api: str) -> str:
    """The journaled path of the model API ``api`` names (what the launch's proxy takes)."""
    if api in ("openai-completions", "openai-compatible"):
        return chat.CHAT.path
    if api == "openai-responses":
        return responses.RESPONSES.path
    return anthropic.ANTHROPIC.path


def with_text_rules(
    api: str, anthropic: Canonicalizer, normalize: Callable[[str], str], cli: str
) -> Canonicalizer:
    if api in ("openai-completions", "openai-compatible"):
        return ChatCanonicalizer(f"{cli}/chat-completions", normalize)
    if api == "openai-responses":
        return _PiResponses(f"{cli}/openai-responses", normalize)
    return anthropic


class _PiResponses(ResponsesCanonicalizer):
    """Responses rules with the CLI's text rules, and Pi's tool-call ids: Pi names a call
    ``<call_id>|<item id>`` (what its hooks report, so what the journal holds) but sends
    a ``function_call_output`` with the ``call_id`` alone; the item id is found on the
    ``function_call`` it answers."""

    def __init__(self, name: str, normalize: Callable[[str], str]) -> None:
        self.name = name
        self._normalize = normalize

    def canonical(
        self,
        path: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        tool_outcomes: ToolOutcomes,
    ) -> dict[str, Any]:
        items = body.get("input")
        paired = {
            item["call_id"]: f"{item['call_id']}|{item['id']}"
            for item in (items if isinstance(items, list) else [])
            if isinstance(item, dict)
            and isinstance(item.get("call_id"), str)
            and isinstance(item.get("id"), str)
        }

        def outcomes(call_id: str) -> str | None:
            found = tool_outcomes(paired[call_id]) if call_id in paired else None
            return found if found is not None else tool_outcomes(call_id)

        return super().canonical(path, headers, body, outcomes)

    def normalize_text(self, text: str) -> str:
        return self._normalize(text)
