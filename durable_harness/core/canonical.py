"""The JSON spellings: canonical (for hashes and stored inputs) and compact (as providers
send it). Changing :func:`canonical_json` changes every hash: see :mod:`.keys`.

Both are lossless for every Python string, not only for valid Unicode. A model may stream
a lone surrogate (``"\\ud83d"`` cut from its pair), and bytes that are not UTF-8 travel in
this package as the surrogates U+DC80..U+DCFF that ``errors="surrogateescape"`` decodes
them to (a shell's stdout, an upstream's stream). ``json.dumps(ensure_ascii=False)`` would
leave such a surrogate raw, and raw it cannot be encoded as UTF-8: the step could not be
stored or hashed at all. So a lone surrogate is written as its ``\\uXXXX`` escape, which
``json.loads`` reads back as the same code point. Everything else keeps the spelling it
always had (non-ASCII raw), so every value that was storable before hashes the same.

A high surrogate followed by a low one (two code points, e.g. two deltas joined) is the
character the pair encodes: that is how JSON (RFC 8259 §7), UTF-16 and every JavaScript
CLI read it, and the one spelling both forms get, so they hash the same and a replay reads
back the character.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
_PAIR_OR_LONE = re.compile("[\ud800-\udbff][\udc00-\udfff]|[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    text = match.group()
    if len(text) == 2:  # a pair: the character it encodes, raw like any other
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    return f"\\u{ord(text):04x}"


def escape_surrogates(text: str) -> str:
    """``text`` (JSON written with ``ensure_ascii=False``) with its surrogates escaped as
    above: the result always encodes as UTF-8. A surrogate can only be inside a JSON string
    there, where its escape means the same code point."""
    if _SURROGATE.search(text) is None:  # the common case: nothing to do, no copy
        return text
    return _PAIR_OR_LONE.sub(_escape, text)


def without_surrogates(value: Any) -> Any:
    """``value`` (a JSON value) with each lone surrogate in its strings replaced by U+FFFD
    (a pair by its character). Lossy, so never for what the journal records: for what
    leaves the package as text, where a lone surrogate cannot go (a request to a model
    provider, which refuses one; a turn's final reply, a text column)."""
    if isinstance(value, str):
        if _SURROGATE.search(value) is None:
            return value
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if isinstance(value, dict):
        return {without_surrogates(k): without_surrogates(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_surrogates(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """The one JSON spelling used for hashing and storing inputs and outputs."""
    return escape_surrogates(
        json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    )


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dumps_compact(value: Any) -> bytes:
    # Compact JSON, as Anthropic sends it; insertion order is fixed, so bytes are stable.
    return escape_surrogates(json.dumps(value, separators=(",", ":"), ensure_ascii=False)).encode(
        "utf-8"
    )


def parse_json(data: str | bytes) -> Any:
    """``json.loads`` for a document from an untrusted side (an agent's stdout, its session
    record, a CLI's hook or model request, a webhook): a nesting too deep for the parser
    (``[[[[…``, a RecursionError) is a ValueError, as any other bad JSON is, so the
    caller's ``except ValueError`` refuses it instead of dying of it."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("the JSON document is nested too deeply") from None
