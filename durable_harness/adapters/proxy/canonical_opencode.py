"""The canonical form of OpenCode's model requests (``opencode-ai`` 1.18.33).

OpenCode talks to the journaling proxy through its bundled ``@ai-sdk/anthropic`` provider,
so its requests are plain Anthropic Messages requests and the structural rules of
:class:`~.proxy.canonical.AnthropicMessagesCanonicalizer` apply (``cache_control`` markers move
to the newest message; ``metadata`` and ``stream`` dropped; tool results the journal
holds replaced by a reference to their outcome; only ``anthropic-version`` and
``anthropic-beta`` of the headers count, so ``x-session-id`` and ``x-session-affinity``,
which carry OpenCode's per-run session id, do not).

Measured on its real traffic against the fake model (two runs of one prompt in two
private HOMEs, ``tests/adapters/test_canonical_opencode.py``; the kill matrix's replays
check resumed launches), the volatile text is in the ``<env>`` block of the system
prompt:

* ``Today's date: Sun Nov 29 2026``: a resumed turn may run on another day;
* ``Is directory a git repo: yes|no``: a turn that runs ``git init`` changes it for
  every later launch (a resume, a replay);
* the private HOME folder's path, which is per launch (none appeared in the measured
  requests, but a skill or instruction file from the config folder would show it).

The working directory and workspace root stay: they come from the turn's configuration.
Each run starts with a title request (the small model, no tools, the prompt quoted); it
is a model call like the others, keyed by its content, so a relaunch finds its answer.
"""

from __future__ import annotations

import re

from durable_harness.adapters.proxy.canonical import AnthropicMessagesCanonicalizer

__all__ = ["OpenCodeCanonicalizer"]


class OpenCodeCanonicalizer(AnthropicMessagesCanonicalizer):
    """See the module docstring. Renaming a rule's output changes every hash."""

    name = "opencode"

    _RULES: tuple[tuple[re.Pattern[str], str], ...] = (
        (re.compile(r"(\n\s*Today's date: )[^\n]*"), r"\1*"),
        (re.compile(r"(\n\s*Is directory a git repo: )(?:yes|no)"), r"\1*"),
    )

    def __init__(self, home: str | None = None) -> None:
        # A bare "/" would rewrite every path; only a real folder is worth replacing.
        self.home = home.rstrip("/") if home and len(home.rstrip("/")) > 1 else None

    def normalize_text(self, text: str) -> str:
        for pattern, replacement in self._RULES:
            text = pattern.sub(replacement, text)
        if self.home is not None:
            text = text.replace(self.home, "$HOME")
        return text
