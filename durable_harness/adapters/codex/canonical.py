"""Codex's canonical request form. It lives in the proxy layer
(:mod:`~durable_harness.adapters.proxy.canonical_codex`) because the ACP preset for
``codex-acp``, which embeds the Codex core, keys its model calls the same way and one
agent package never imports another's."""

from __future__ import annotations

from durable_harness.adapters.proxy.canonical_codex import CodexCanonicalizer

__all__ = ["CodexCanonicalizer"]
