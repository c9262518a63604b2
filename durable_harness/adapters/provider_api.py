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
(:mod:`.canonical`, :mod:`.canonical_chat`, :mod:`.canonical_responses`) with the CLI's
rules for its volatile text (:mod:`.canonical_pi`, :mod:`.canonical_opencode`), the same
whatever the API, and a view of a request as an Anthropic one for the tool hooks'
:meth:`~.hooks.ToolHooks.close_from_request`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from durable_harness.adapters.canonical import Canonicalizer, ToolOutcomes
from durable_harness.adapters.canonical_chat import ChatCanonicalizer
from durable_harness.adapters.canonical_opencode import OpenCodeCanonicalizer
from durable_harness.adapters.canonical_pi import PiCanonicalizer
from durable_harness.adapters.canonical_responses import ResponsesCanonicalizer
from durable_harness.adapters.hooks import ClaudeCodeConfig
from durable_harness.harness import fake_model_chat, fake_model_responses

__all__ = [
    "OpenCodeConfig",
    "PiConfig",
    "anthropic_view",
    "opencode_canonicalizer",
    "opencode_npm",
    "pi_canonicalizer",
    "pi_provider",
]

PiApi = Literal["anthropic", "openai-completions", "openai-responses"]
OpenCodeApi = Literal["anthropic", "openai-compatible"]
_PI_API_NAMES = {
    "anthropic": "anthropic-messages",
    "openai-completions": "openai-completions",
    "openai-responses": "openai-responses",
}


class _PiProvider(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api: PiApi = "anthropic"


class _OpenCodeProvider(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api: OpenCodeApi = "anthropic"


class PiConfig(ClaudeCodeConfig):
    """The pi agent's ``--agent-config``: ``[replay]`` as for Claude Code, ``[provider]``."""

    provider: _PiProvider = Field(default_factory=_PiProvider)

    @classmethod
    def parse(cls, data: Any, source: str) -> PiConfig:
        config = super().parse(data, source)
        assert isinstance(config, PiConfig)
        return config


class OpenCodeConfig(ClaudeCodeConfig):
    """The opencode agent's ``--agent-config``: ``[replay]`` as for Claude Code,
    ``[provider]``."""

    provider: _OpenCodeProvider = Field(default_factory=_OpenCodeProvider)

    @classmethod
    def parse(cls, data: Any, source: str) -> OpenCodeConfig:
        config = super().parse(data, source)
        assert isinstance(config, OpenCodeConfig)
        return config


def pi_provider(api: str, url: str) -> dict[str, str]:
    """``baseUrl`` and ``api`` of Pi's provider entry for the proxy at ``url``."""
    # Pi's Anthropic client adds /v1/messages itself; the OpenAI clients add only the
    # API's own path (/chat/completions, /responses) to a base that ends in /v1.
    base = url if api == "anthropic" else f"{url}/v1"
    return {"baseUrl": base, "api": _PI_API_NAMES[api]}


def pi_canonicalizer(api: str, package_dir: str | None) -> Canonicalizer:
    rules = PiCanonicalizer(package_dir)
    return _with_text_rules(api, rules, rules.normalize_text, "pi")


def opencode_npm(api: str) -> str:
    """The bundled AI SDK provider package for ``api``."""
    return "@ai-sdk/openai-compatible" if api == "openai-compatible" else "@ai-sdk/anthropic"


def opencode_canonicalizer(api: str, home: str | None) -> Canonicalizer:
    rules = OpenCodeCanonicalizer(home=home)
    return _with_text_rules(api, rules, rules.normalize_text, "opencode")


def anthropic_view(body: dict[str, Any]) -> dict[str, Any]:
    """A model request as the Anthropic Messages request it is equivalent to (tool
    results as ``tool_result`` blocks of the last user message), whatever its API."""
    if isinstance(body.get("input"), list | str):
        return fake_model_responses.as_messages_request(body)
    messages = body.get("messages")
    if isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") in ("tool", "system", "developer") for m in messages
    ):
        return fake_model_chat.as_messages_request(body)
    return body


def _with_text_rules(
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
