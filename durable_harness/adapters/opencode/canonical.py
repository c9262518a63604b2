"""OpenCode's canonical request form. It lives in the proxy layer
(:mod:`~durable_harness.adapters.proxy.canonical_opencode`) because the ``acp:opencode``
preset, which runs the same OpenCode as an ACP agent, keys its model calls the same way
and one agent package never imports another's."""

from __future__ import annotations

from durable_harness.adapters.proxy.canonical_opencode import OpenCodeCanonicalizer

__all__ = ["OpenCodeCanonicalizer"]
