"""The canonical form of an OpenAI Chat Completions request (any client).

Structural rules, true of the API whatever the client:

* ``stream``, ``stream_options``, ``metadata``, ``prompt_cache_key`` and ``user`` are
  dropped: they name the session or the transport, not the question;
* tool-call ids (an assistant's ``tool_calls[].id``, a ``tool`` message's
  ``tool_call_id``) become their order of appearance (``call#1``, ``call#2``…): they are
  tokens the model minted, and only which result answers which call matters;
* a ``tool`` message whose call has a recorded outcome becomes a reference to it
  (``{"role": "tool", "tool_call_id": "call#N", "journal": <digest>}``);
* text (string contents, ``text`` parts, tool results) passes through ``normalize``, the
  CLI's rules for its volatile text (a date, an install folder), the same rules as for its
  Anthropic requests;
* of the headers, none counts (OpenCode's ``x-session-*`` headers name its session).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from durable_harness.adapters.proxy.canonical import Canonicalizer, ToolOutcomes

__all__ = ["ChatCanonicalizer"]


class ChatCanonicalizer(Canonicalizer):
    dropped_fields: tuple[str, ...] = (
        "stream",
        "stream_options",
        "metadata",
        "prompt_cache_key",
        "user",
    )

    def __init__(self, name: str, normalize: Callable[[str], str] | None = None) -> None:
        super().__init__()
        #: The CLI's name with the API's (``pi/openai-completions``): what keyed the call.
        self.name = name
        self._normalize = normalize or (lambda text: text)

    def canonical(
        self,
        path: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        tool_outcomes: ToolOutcomes,
    ) -> dict[str, Any]:
        form: dict[str, Any] = {k: v for k, v in body.items() if k not in self.dropped_fields}
        messages = body.get("messages")
        if isinstance(messages, list):
            calls: dict[str, str] = {}
            form["messages"] = [self._message(m, calls, tool_outcomes) for m in messages]
        return {"path": path.split("?", 1)[0], "headers": {}, "body": form}

    def normalize_text(self, text: str) -> str:
        return self._normalize(text)

    def _message(self, message: Any, calls: dict[str, str], tool_outcomes: ToolOutcomes) -> Any:
        if not isinstance(message, dict):
            return message
        out = dict(message)
        tool_calls = out.get("tool_calls")
        if isinstance(tool_calls, list):
            out["tool_calls"] = [self._call(c, calls) for c in tool_calls]
        call_id = out.get("tool_call_id")
        if isinstance(call_id, str):
            out["tool_call_id"] = calls.setdefault(call_id, f"call#{len(calls) + 1}")
            if out.get("role") == "tool":
                digest = tool_outcomes(call_id)
                if digest is not None:
                    return {"role": "tool", "tool_call_id": out["tool_call_id"], "journal": digest}
        content = out.get("content")
        if isinstance(content, str):
            out["content"] = self.normalize_text(content)
        elif isinstance(content, list):
            out["content"] = [self._part(p) for p in content]
        return out

    def _call(self, call: Any, calls: dict[str, str]) -> Any:
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            return call
        return {**call, "id": calls.setdefault(call["id"], f"call#{len(calls) + 1}")}

    def _part(self, part: Any) -> Any:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            return {**part, "text": self.normalize_text(part["text"])}
        return part
