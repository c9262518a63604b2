"""Model client for the built-in agent: Anthropic Messages through the ``anthropic`` SDK.

The endpoint comes from ``ANTHROPIC_BASE_URL`` (or the turn's ``base_url``), the key from
``ANTHROPIC_API_KEY``; the key is never stored in the World. SDK errors are mapped to
:class:`ModelError` (retryable: the step stays an intent and is asked again).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import anthropic
import httpx2

from durable_harness.core.canonical import without_surrogates
from durable_harness.core.errors import ConfigError, ModelError

DEFAULT_BASE_URL = "https://api.anthropic.com"
#: Placeholder key for loopback endpoints (the bundled fake model accepts any key).
LOOPBACK_KEY = "durable-harness-local"


def is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_endpoint(
    base_url: str | None, api: str = "ANTHROPIC", default: str = DEFAULT_BASE_URL
) -> tuple[str, str]:
    """Return ``(base_url, api_key)`` of the upstream: ``base_url``, else ``{api}_BASE_URL``,
    else ``default``; the key from ``{api}_API_KEY`` (the harness's own, never a
    sandbox's). ConfigError when a real endpoint has no key."""
    url = base_url or os.environ.get(f"{api}_BASE_URL") or default
    key = os.environ.get(f"{api}_API_KEY", "")
    if not key:
        if not is_loopback(url):
            raise ConfigError(
                f"no API key for {url}: set {api}_API_KEY, or point {api}_BASE_URL "
                "at a local endpoint (e.g. `durable-harness fake-model`)"
            )
        key = LOOPBACK_KEY
    return url, key


class ModelClient:
    """Sends one Messages request and returns the reply as plain JSON."""

    def __init__(self, base_url: str | None = None, timeout: float = 600.0) -> None:
        url, key = resolve_endpoint(base_url)
        self.base_url = url
        # Retries happen at the journal level (the step stays an intent); one SDK retry
        # smooths over a dropped connection without hiding a dead endpoint for long.
        self._client = anthropic.Anthropic(
            base_url=url, api_key=key, timeout=timeout, max_retries=1
        )

    def create(
        self, request: dict[str, Any], on_text: Callable[[str], None] | None = None
    ) -> dict[str, Any]:
        """The reply to ``request`` as JSON. With ``on_text``, the reply is streamed and
        each piece of its text given to ``on_text`` as it arrives (the turn's live text);
        the JSON returned is the same message, assembled by the SDK from the stream."""
        try:
            # A provider refuses a lone surrogate (a model's cut-off pair, a shell's byte
            # that is not UTF-8, both kept exactly in the journal): it is sent as U+FFFD.
            sent = without_surrogates(request)
            if on_text is None:
                message = self._client.messages.create(**sent)
            else:
                with self._client.messages.stream(**sent) as stream:
                    for event in stream:
                        if event.type == "text":
                            on_text(event.text)
                    message = stream.get_final_message()
        except anthropic.APIStatusError as exc:
            raise ModelError(
                f"model endpoint {self.base_url} answered {exc.status_code}: {exc.message}"
            ) from exc
        except anthropic.APIError as exc:
            raise ModelError(f"model endpoint {self.base_url} failed: {exc}") from exc
        except (httpx2.HTTPError, httpx2.StreamError) as exc:
            # A stream cut off mid-way: the SDK lets its HTTP client's error through.
            raise ModelError(f"model endpoint {self.base_url} broke off: {exc}") from exc

        reply: dict[str, Any] = message.model_dump(mode="json", exclude_none=True)
        return reply

    def close(self) -> None:
        self._client.close()
