"""Model client for the built-in agent: Anthropic Messages through the ``anthropic`` SDK.

The endpoint comes from ``ANTHROPIC_BASE_URL`` (or the turn's ``base_url``), the key from
``ANTHROPIC_API_KEY``; the key is never stored in the World. SDK errors are mapped to
:class:`ModelError` (retryable: the step stays an intent and is asked again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx2

from durable_harness.core.canonical import without_surrogates
from durable_harness.core.errors import ModelError
from durable_harness.harness.endpoint import DEFAULT_BASE_URL, LOOPBACK_KEY, resolve_endpoint

__all__ = ["DEFAULT_BASE_URL", "LOOPBACK_KEY", "ModelClient", "resolve_endpoint"]


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
