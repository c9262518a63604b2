"""Claude Code's canonical request form. It lives in the proxy layer
(:mod:`~durable_harness.adapters.proxy.canonical_claude_code`) because the ACP preset for
``claude-code-acp``, which drives the same Claude Code, keys its model calls the same way
and one agent package never imports another's."""

from __future__ import annotations

from durable_harness.adapters.proxy.canonical_claude_code import ClaudeCodeCanonicalizer

__all__ = ["ClaudeCodeCanonicalizer"]
