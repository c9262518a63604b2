"""Token usage as a provider reported it, in the one shape every model step's meta keeps.

A model step's ``meta`` holds ``model`` (the model the response names, else the
request's) and four ints, 0 when the provider did not report them:

======================  ==============================================================
``input_tokens``        input neither read from nor written to a prompt cache
``cache_read_tokens``   input read from the cache (billed at the cache-read price)
``cache_write_tokens``  input written to the cache (billed at the cache-write price)
``output_tokens``       output, reasoning included
======================  ==============================================================

The three APIs count differently, which is why this is one place: Anthropic's
``input_tokens`` already excludes ``cache_read_input_tokens`` and
``cache_creation_input_tokens``; OpenAI's Chat ``prompt_tokens`` and Responses
``input_tokens`` include the cached part (``*_tokens_details.cached_tokens``), which is
subtracted here, and OpenAI reports no cache writes. :mod:`.pricing` prices this shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The token counts of a model step's meta, in the order ``show`` prints them.
TOKEN_KEYS = ("input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens")


def _int(value: Any) -> int:
    # A provider's usage is untrusted input: a missing, null or odd count is 0.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(int(value), 0)


def _details(usage: Mapping[str, Any], name: str) -> int:
    details = usage.get(name)
    return _int(details.get("cached_tokens")) if isinstance(details, Mapping) else 0


def anthropic_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    """Messages API ``usage``: its input count already leaves the cached parts out."""
    return {
        "input_tokens": _int(usage.get("input_tokens")),
        "cache_read_tokens": _int(usage.get("cache_read_input_tokens")),
        "cache_write_tokens": _int(usage.get("cache_creation_input_tokens")),
        "output_tokens": _int(usage.get("output_tokens")),
    }


def chat_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    """Chat Completions ``usage``: ``prompt_tokens`` counts the cached tokens too."""
    cached = _details(usage, "prompt_tokens_details")
    return {
        "input_tokens": max(_int(usage.get("prompt_tokens")) - cached, 0),
        "cache_read_tokens": cached,
        "cache_write_tokens": 0,
        "output_tokens": _int(usage.get("completion_tokens")),
    }


def responses_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    """Responses API ``usage``: ``input_tokens`` counts the cached tokens too."""
    cached = _details(usage, "input_tokens_details")
    return {
        "input_tokens": max(_int(usage.get("input_tokens")) - cached, 0),
        "cache_read_tokens": cached,
        "cache_write_tokens": 0,
        "output_tokens": _int(usage.get("output_tokens")),
    }


def usage_meta(reply: Any, requested_model: str | None) -> dict[str, Any]:
    """``model`` and the token counts of a model reply of any of the three APIs (told
    apart by their usage's own field names), for a step whose caller does not know
    which API answered (a program's own loop: ``runtime/custom_turn.py``)."""
    body = reply if isinstance(reply, Mapping) else {}
    usage = body.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        counts = chat_usage(usage)
    elif "input_tokens_details" in usage or body.get("object") == "response":
        counts = responses_usage(usage)
    else:
        counts = anthropic_usage(usage)
    return {"model": model_of(body, requested_model), **counts}


def model_of(response: Mapping[str, Any], requested_model: str | None) -> str | None:
    """The model a response names (a dated snapshot of an alias), else the request's."""
    named = response.get("model")
    if isinstance(named, str) and named:
        return named
    return requested_model or None
