"""Request canonicalizers: the form of a model request whose hash keys its journal step.

A CLI re-sends the whole conversation with every request, and re-sends it again, slightly
changed, after a crash and resume. The journaling proxy finds a recorded answer by the
hash of the request's **canonical form**: the request with everything stripped that
changes between runs, or between two requests of one run, without changing what the
model is asked. Two rules decide what may be stripped:

* it must not change the question: a recorded answer is only ever given to a request
  asking the same thing;
* what is *stripped* must not come from the journal (invariant 6): the date and the
  machine are volatile and go; the working directory comes from the turn's configuration
  and stays; a tool result the journal holds is replaced by a reference to its journal
  outcome, so the CLI's rendering of it (which differs when a replay denies a tool that
  already ran) does not matter.

Per-CLI rules live in one subclass each; the rules for Claude Code were measured on its
real traffic (``tests/adapters/test_canonical_claude.py`` runs the real CLI twice).
Renaming a rule's output changes every hash: turns in flight would no longer find their
recorded answers, so a change here is a change of the journal format.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Mapping
from typing import Any

from durable_harness.core.keys import input_digest

__all__ = [
    "AnthropicMessagesCanonicalizer",
    "Canonicalizer",
    "ToolOutcomes",
]

#: ``tool_use_id -> digest of its recorded outcome``, or None when the journal has none.
ToolOutcomes = Callable[[str], str | None]


class Canonicalizer(abc.ABC):
    """Maps a request (path, headers, JSON body) to its canonical form and key.

    A CLI's volatile text (dates, token counters, its private HOME's path) is rewritten by
    :meth:`normalize_text`: the subclass's :attr:`text_rules` in order, then ``home`` as
    ``$HOME``. Changing a rule's output changes every key it touches.
    """

    name: str
    #: ``(pattern, replacement)`` pairs applied in order by :meth:`normalize_text`.
    text_rules: tuple[tuple[re.Pattern[str], str], ...] = ()

    def __init__(self, home: str | None = None) -> None:
        # A bare "/" would rewrite every path; only a real folder is worth replacing.
        self.home = home.rstrip("/") if home and len(home.rstrip("/")) > 1 else None

    def normalize_text(self, text: str) -> str:
        """Rewrite the volatile parts of a text (see the class docstring)."""
        for pattern, replacement in self.text_rules:
            text = pattern.sub(replacement, text)
        if self.home is not None:
            text = text.replace(self.home, "$HOME")
        return text

    @abc.abstractmethod
    def canonical(
        self,
        path: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        tool_outcomes: ToolOutcomes,
    ) -> dict[str, Any]:
        """The canonical form: plain JSON, deterministic for equal questions."""

    def key(
        self,
        path: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        tool_outcomes: ToolOutcomes,
    ) -> str:
        """sha256 hex of the canonical form's canonical JSON."""
        form = self.canonical(path, headers, body, tool_outcomes)
        return input_digest(form)


class AnthropicMessagesCanonicalizer(Canonicalizer):
    """Structural rules for any client of the Anthropic Messages API.

    * ``metadata`` (per-session user ids) and ``stream`` (the same question asked
      streaming or not) are dropped;
    * every ``cache_control`` marker is dropped (clients move it to the newest message);
    * a string ``system``, message content or tool_result content becomes the one-text-
      block list it is equivalent to;
    * a tool_result whose tool call has a recorded outcome becomes a reference to it;
    * text is passed through :meth:`normalize_text` (no change here);
    * of the headers, only the API version and the beta flags (sorted) count; the query
      string of the path does not.
    """

    name = "anthropic-messages"
    dropped_fields: tuple[str, ...] = ("metadata", "stream")
    counted_headers: tuple[str, ...] = ("anthropic-version", "anthropic-beta")

    def canonical(
        self,
        path: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        tool_outcomes: ToolOutcomes,
    ) -> dict[str, Any]:
        lowered = {k.lower(): v for k, v in headers.items()}
        form: dict[str, Any] = {
            k: v for k, v in body.items() if k not in self.dropped_fields and k != "system"
        }
        if "system" in body:
            form["system"] = [self._block(b, tool_outcomes) for b in _as_blocks(body["system"])]
        if isinstance(body.get("messages"), list):
            form["messages"] = [self._message(m, tool_outcomes) for m in body["messages"]]
        if isinstance(body.get("tools"), list):
            form["tools"] = [_without_cache_control(t) for t in body["tools"]]
        return {
            "path": path.split("?", 1)[0],
            "headers": {
                name: _header_value(name, lowered[name])
                for name in self.counted_headers
                if name in lowered
            },
            "body": form,
        }

    def _message(self, message: Any, tool_outcomes: ToolOutcomes) -> Any:
        if not isinstance(message, dict):
            return message
        out = dict(message)
        if "content" in message:
            out["content"] = [self._block(b, tool_outcomes) for b in _as_blocks(message["content"])]
        return out

    def _block(self, block: Any, tool_outcomes: ToolOutcomes) -> Any:
        if not isinstance(block, dict):
            return block
        out = _without_cache_control(block)
        kind = out.get("type")
        if kind == "text" and isinstance(out.get("text"), str):
            out["text"] = self.normalize_text(out["text"])
        elif kind == "tool_result":
            tool_use_id = out.get("tool_use_id")
            digest = tool_outcomes(tool_use_id) if isinstance(tool_use_id, str) else None
            if digest is not None:
                return {"type": "tool_result", "tool_use_id": tool_use_id, "journal": digest}
            if "content" in out:
                out["content"] = [self._block(b, tool_outcomes) for b in _as_blocks(out["content"])]
        return out


def _as_blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return content
    return [content]


def _without_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "cache_control"}
    return value


def _header_value(name: str, value: str) -> str:
    if name == "anthropic-beta":
        return ",".join(sorted(part.strip() for part in value.split(",") if part.strip()))
    return value.strip()
