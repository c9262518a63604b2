"""Where a model endpoint is and which key it takes, without any SDK (the CLI adapters
ask this at every launch, and importing the ``anthropic`` SDK costs more than the rest of
an adapter together: only the built-in agent's :mod:`.model` needs it).
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlparse

from durable_harness.core.errors import ConfigError

__all__ = ["DEFAULT_BASE_URL", "LOOPBACK_KEY", "is_loopback", "resolve_endpoint"]

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
