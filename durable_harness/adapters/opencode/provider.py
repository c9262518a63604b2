"""The opencode agent's ``--agent-config`` and the wire API its provider speaks
(``[provider] api``: ``anthropic`` or ``openai-compatible``), with that API's
canonicalizer (see :mod:`.cli.provider_api`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from durable_harness.adapters.cli.hooks import AgentConfig
from durable_harness.adapters.cli.provider_api import with_text_rules
from durable_harness.adapters.opencode.canonical import OpenCodeCanonicalizer
from durable_harness.adapters.proxy.canonical import Canonicalizer

OpenCodeApi = Literal["anthropic", "openai-compatible"]


class _OpenCodeProvider(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api: OpenCodeApi = "anthropic"


class OpenCodeConfig(AgentConfig):
    """The opencode agent's ``--agent-config``: ``[replay]`` as for Claude Code,
    ``[provider]``."""

    provider: _OpenCodeProvider = Field(default_factory=_OpenCodeProvider)


def opencode_npm(api: str) -> str:
    """The bundled AI SDK provider package for ``api``."""
    return "@ai-sdk/openai-compatible" if api == "openai-compatible" else "@ai-sdk/anthropic"


def opencode_canonicalizer(api: str, home: str | None) -> Canonicalizer:
    rules = OpenCodeCanonicalizer(home=home)
    return with_text_rules(api, rules, rules.normalize_text, "opencode")
