"""Codex's pin and its upstream (see :mod:`.codex.spec`): the one pinned version
(scripts/setup); :func:`resolve_openai_endpoint` and :func:`codex_model`, the
OpenAI-compatible upstream (the harness's own key, never the CLI's) and the model a turn
asks for.
"""

from __future__ import annotations

from typing import Any

from durable_harness.core.settings import Settings
from durable_harness.harness.endpoint import resolve_endpoint

__all__ = [
    "BIN_ENV",
    "CODEX_VERSION",
    "codex_model",
    "resolve_openai_endpoint",
]

#: The one Codex version this adapter's rules were measured on (scripts/setup).
CODEX_VERSION = "0.171.0"
BIN_ENV = "DURABLE_HARNESS_CODEX_BIN"
DEFAULT_BASE_URL = "https://api.openai.com"
#: The model a turn asks for when it names none but the harness-wide default (a Claude
#: model, which no OpenAI-compatible endpoint serves).
DEFAULT_MODEL = "gpt-5-codex"


def resolve_openai_endpoint(base_url: str | None) -> tuple[str, str]:
    """``(base_url, api_key)`` of the OpenAI-compatible upstream (the harness's own key)."""
    url, key = resolve_endpoint(base_url, "OPENAI", DEFAULT_BASE_URL)
    return url.rstrip("/").removesuffix("/v1"), key


def codex_model(config: dict[str, Any]) -> str:
    """The turn's model; the harness-wide default (a Claude model) means Codex's default."""
    model = str(config.get("model") or "")
    return DEFAULT_MODEL if model in ("", Settings.model_fields["model"].default) else model
