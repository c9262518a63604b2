"""The JSON spellings: canonical (for hashes and stored inputs) and compact (as providers
send it). Changing :func:`canonical_json` changes every hash: see :mod:`.keys`."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """The one JSON spelling used for hashing and storing inputs and outputs."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dumps_compact(value: Any) -> bytes:
    # Compact JSON, as Anthropic sends it; insertion order is fixed, so bytes are stable.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
