"""Codex's canonical request form, measured on the traffic of ``@openai/codex`` 0.171.0.

On top of the Responses API's structural rules (:mod:`.proxy.canonical_responses`: session
fields, item ids and call ids), what Codex changes between runs and launches without
changing the question (docs/codex.md has the evidence):

* ``<current_date>…</current_date>`` in the environment context: a resumed turn may run on
  another day;
* the private ``HOME``/``CODEX_HOME`` folder's path (the skills list names it), new for
  every launch;
* in a tool's output, the ``Chunk ID: …`` and ``Wall time: … seconds`` lines Codex adds to
  every ``exec_command`` result;
* the headers (``session-id``, ``thread-id``, ``x-client-request-id``,
  ``x-codex-window-id``, ``x-codex-turn-metadata``): none counts.

The working directory stays: it is the turn's configured workspace. ``codex-acp`` 0.16.0
(the ``acp:codex`` preset; it embeds Codex core 0.137.0) changes the same fields and no
others (docs/acp.md).
"""

from __future__ import annotations

import re

from durable_harness.adapters.proxy.canonical_responses import ResponsesCanonicalizer

__all__ = ["CodexCanonicalizer"]


class CodexCanonicalizer(ResponsesCanonicalizer):
    name = "codex"

    text_rules: tuple[tuple[re.Pattern[str], str], ...] = (
        (re.compile(r"<current_date>[^<]*</current_date>"), "<current_date>*</current_date>"),
    )
    _OUTPUT_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
        (re.compile(r"^Chunk ID: \S*$", re.M), "Chunk ID: *"),
        (re.compile(r"^Wall time: [0-9.]+ seconds$", re.M), "Wall time: *"),
    )

    def normalize_output(self, text: str) -> str:
        for pattern, replacement in self._OUTPUT_RULES:
            text = pattern.sub(replacement, text)
        return self.normalize_text(text)
