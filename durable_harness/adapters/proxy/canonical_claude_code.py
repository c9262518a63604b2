"""Claude Code's canonical request form: the Anthropic Messages rules plus its volatile
text (the hash of the result keys each model step: changing a rule changes the keys)."""

from __future__ import annotations

import re

from durable_harness.adapters.proxy.canonical import AnthropicMessagesCanonicalizer


class ClaudeCodeCanonicalizer(AnthropicMessagesCanonicalizer):
    """Claude Code's volatile text, measured on its 2.1.332 traffic (docs/claude-code.md):

    * ``<total_tokens>N tokens left</total_tokens>`` reminders: N restarts on every
      launch and shrinks with every answer;
    * ``Today's date is YYYY-MM-DD``: a resumed turn may run on another day;
    * the environment lines ``OS Version`` and ``Is a git repository``, and the
      ``# gitStatus`` snapshot (branch, status and commit hashes at launch): they describe
      the machine and the workspace *when the CLI started*, which a resumed or replayed
      launch sees changed by the turn itself;
    * the isolated HOME folder's path (auto-memory is switched off, but any path below
      HOME is per launch).

    The working directory stays: it is the turn's configured workspace. The same rules
    hold for ``claude-code-acp`` 0.16.2 (the ``acp:claude-code`` preset), which drives the
    same Claude Code binary: two of its runs differ only in ``metadata`` and the session
    header (docs/acp.md).
    """

    name = "claude-code"

    text_rules: tuple[tuple[re.Pattern[str], str], ...] = (
        (re.compile(r"<total_tokens>[^<]*</total_tokens>"), "<total_tokens>*</total_tokens>"),
        (re.compile(r"(Today's date is (?:now )?)\d{4}-\d{2}-\d{2}"), r"\1*"),
        (re.compile(r"(\n - OS Version: )[^\n]*"), r"\1*"),
        (re.compile(r"(\n - Is a git repository: )(?:true|false)"), r"\1*"),
        (re.compile(r"(# gitStatus\n).*?(?=\n# |\n\nClaude Code attached|\Z)", re.S), r"\1*"),
    )
