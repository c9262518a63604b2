"""The pi agent's ``--agent-config`` and the wire API its provider speaks (``[provider]
api``: ``anthropic``, ``openai-completions`` or ``openai-responses``), with that API's
canonicalizer (see :mod:`.cli.provider_api`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from durable_harness.adapters.cli.hooks import AgentConfig
from durable_harness.adapters.cli.provider_api import with_text_rules
from durable_harness.adapters.pi.canonical import PiCanonicalizer
from durable_harness.adapters.proxy.canonical import Canonicalizer

PiApi = Literal["anthropic", "openai-completions", "openai-responses"]


_PI_API_NAMES = {
    "anthropic": "anthropic-messages",
    "openai-completions": "openai-completions",
    "openai-responses": "openai-responses",
}


class _PiProvider(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api: PiApi = "anthropic"


class PiConfig(AgentConfig):
    """The pi agent's ``--agent-config``: ``[replay]`` as for Claude Code, ``[provider]``."""

    provider: _PiProvider = Field(default_factory=_PiProvider)


def pi_provider(api: str, url: str) -> dict[str, str]:
    """``baseUrl`` and ``api`` of Pi's provider entry for the proxy at ``url``."""
    # Pi's Anthropic client adds /v1/messages itself; the OpenAI clients add only the
    # API's own path (/chat/completions, /responses) to a base that ends in /v1.
    base = url if api == "anthropic" else f"{url}/v1"
    return {"baseUrl": base, "api": _PI_API_NAMES[api]}


def pi_canonicalizer(api: str, package_dir: str | None) -> Canonicalizer:
    rules = PiCanonicalizer(package_dir)
    return with_text_rules(api, rules, rules.normalize_text, "pi")
