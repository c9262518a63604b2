"""The canonical form of an OpenAI Responses API request (any client).

Structural rules, true of the API whatever the client:

* ``stream``, ``metadata``, ``client_metadata`` and ``prompt_cache_key`` are dropped: they
  name the session or the transport, not the question;
* every input item's ``id`` is dropped (``store: false`` clients mint them per request);
* ``call_id`` values become their order of appearance (``call#1``, ``call#2``…): they are
  tokens the model minted, and only which output answers which call matters;
* a ``function_call_output`` whose call has a recorded outcome becomes a reference to it;
* text (``input_text``/``output_text`` parts, string contents, tool outputs) passes through
  :meth:`normalize_text` (no change here);
* of the headers, only ``openai-beta`` counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durable_harness.adapters.proxy.canonical import Canonicalizer, ToolOutcomes

__all__ = ["ResponsesCanonicalizer"]

_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")


class ResponsesCanonicalizer(Canonicalizer):
    name = "openai-responses"
    dropped_fields: tuple[str, ...] = ("stream", "metadata", "client_metadata", "prompt_cache_key")
    counted_headers: tuple[str, ...] = ("openai-beta",)

    def canonical(
        self,
        path: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        tool_outcomes: ToolOutcomes,
    ) -> dict[str, Any]:
        lowered = {k.lower(): v for k, v in headers.items()}
        form: dict[str, Any] = {k: v for k, v in body.items() if k not in self.dropped_fields}
        if isinstance(body.get("instructions"), str):
            form["instructions"] = self.normalize_text(body["instructions"])
        items = body.get("input")
        if isinstance(items, str):
            form["input"] = self.normalize_text(items)
        elif isinstance(items, list):
            calls: dict[str, str] = {}
            form["input"] = [self._item(i, calls, tool_outcomes) for i in items]
        return {
            "path": path.split("?", 1)[0],
            "headers": {n: lowered[n].strip() for n in self.counted_headers if n in lowered},
            "body": form,
        }

    def normalize_output(self, text: str) -> str:
        """Rewrite the volatile parts of a tool's output (by default as any text)."""
        return self.normalize_text(text)

    def _item(self, item: Any, calls: dict[str, str], tool_outcomes: ToolOutcomes) -> Any:
        if not isinstance(item, dict):
            return item
        out = {k: v for k, v in item.items() if k != "id"}
        call_id = out.get("call_id")
        if isinstance(call_id, str):
            out["call_id"] = calls.setdefault(call_id, f"call#{len(calls) + 1}")
        if out.get("type") in _OUTPUT_ITEMS:
            digest = tool_outcomes(call_id) if isinstance(call_id, str) else None
            if digest is not None:
                return {"type": out["type"], "call_id": out.get("call_id"), "journal": digest}
            if isinstance(out.get("output"), str):
                out["output"] = self.normalize_output(out["output"])
            elif isinstance(out.get("output"), list):
                out["output"] = [self._part(p) for p in out["output"]]
        elif isinstance(out.get("content"), str):
            out["content"] = self.normalize_text(out["content"])
        elif isinstance(out.get("content"), list):
            out["content"] = [self._part(p) for p in out["content"]]
        return out

    def _part(self, part: Any) -> Any:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            return {**part, "text": self.normalize_text(part["text"])}
        return part
