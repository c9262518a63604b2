"""Pi's request canonicalization (``@mariozechner/pi-coding-agent`` 0.73.1, Anthropic API).

Measured on its real traffic against the fake model (``tests/adapters/
test_canonical_pi.py`` runs the CLI twice): Pi sends no session header, no ``metadata``
and no random id in a Messages body; ``cache_control`` moves to the newest message, which
the structural rules of :class:`~.proxy.canonical.AnthropicMessagesCanonicalizer` already drop.
What is left changes with the day and the machine, both in the system prompt:

* ``Current date: YYYY-MM-DD``: a resumed turn may run on another day;
* the folder Pi is installed in (its "Pi documentation" paths): another worker, or the
  Docker image, may install it elsewhere.

The working directory stays: it is the turn's configured workspace. Tool results the
journal holds become references to their outcome (the base class), so a call blocked on
replay ("already ran") keys like the run that made it.
"""

from __future__ import annotations

import re

from durable_harness.adapters.proxy.canonical import AnthropicMessagesCanonicalizer

__all__ = ["PiCanonicalizer"]


class PiCanonicalizer(AnthropicMessagesCanonicalizer):
    """The volatile text of Pi's requests (see the module docstring)."""

    name = "pi"

    _DATE = re.compile(r"(\nCurrent date: )\d{4}-\d{2}-\d{2}")

    def __init__(self, package_dir: str | None = None) -> None:
        super().__init__()
        # A bare "/" would rewrite every path; only a real folder is worth replacing.
        folder = package_dir.rstrip("/") if package_dir else ""
        self.package_dir = folder if len(folder) > 1 else None

    def normalize_text(self, text: str) -> str:
        text = self._DATE.sub(r"\1*", text)
        if self.package_dir is not None:
            text = text.replace(self.package_dir, "$PI_PACKAGE")
        return text
