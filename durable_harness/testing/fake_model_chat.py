"""The fake model's OpenAI Chat Completions API: the same rules, a third wire format.

``POST /v1/chat/completions`` is answered from the same TOML scripts as the Messages API.
The request's ``messages`` are read as the Messages conversation they are equivalent to,
so every ``when`` condition means the same thing for every API:

* ``system``/``developer`` messages are the system prompt; ``user`` and ``assistant``
  messages are messages (a string content, or ``text`` parts);
* an assistant's ``tool_calls`` are ``tool_use`` blocks whose id is the call's ``id`` and
  whose input is its parsed ``function.arguments``; a ``tool`` message is a user
  ``tool_result`` for its ``tool_call_id``;
* consecutive messages of one role are one message (tool results and a new prompt after
  them are the last user message, as in the Messages API).

A reply is one ``choices[0].message``: its text is ``content``, each ``tool_use`` a
``tool_calls`` entry (``type: function``, the input as JSON ``arguments``), and
``finish_reason`` is ``tool_calls`` or ``stop``. Streamed, it is ``data: {chunk}`` lines
(``chat.completion.chunk``: a role chunk, content deltas, tool-call deltas, a chunk with
the ``finish_reason``, a usage chunk when ``stream_options.include_usage`` asks for one)
ending with ``data: [DONE]``. Ids come from the request's hash, which ignores what a
client changes between two sends of one question (``stream``, ``stream_options``,
``metadata``, ``prompt_cache_key``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from durable_harness.adapters.proxy.wire.chat import as_messages_request
from durable_harness.testing.fake_model_script import (
    RequestView,
    Rule,
    canonical_json,
    openai_counts,
    stable_digest,
)

__all__ = [
    "CHAT_PATH",
    "build_completion",
    "chat_request_hash",
    "chat_view",
]

CHAT_PATH = "/v1/chat/completions"
_VOLATILE_FIELDS = ("stream", "stream_options", "metadata", "prompt_cache_key")
_CREATED = 1_700_000_000  # fixed, so a re-sent request gets byte-identical chunks


def chat_view(request: dict[str, Any]) -> RequestView:
    return RequestView.of(as_messages_request(request))


def chat_request_hash(request: dict[str, Any]) -> str:
    """sha256 of the request without what changes between two sends of one question."""
    return stable_digest(request, _VOLATILE_FIELDS)


def build_completion(request: dict[str, Any], rule: Rule, digest: str) -> dict[str, Any]:
    """The ``chat.completion`` ``rule`` gives to ``request`` (ids seeded by ``digest``)."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": rule.reply.content_text,
        "refusal": None,
    }
    calls = []
    for index, tool in enumerate(rule.reply.tool_use):
        seed = hashlib.sha256(f"{digest}{index}".encode()).hexdigest()
        calls.append(
            {
                "id": "call_" + seed[:24],
                "type": "function",
                "function": {
                    "name": tool.name,
                    "arguments": json.dumps(tool.input, ensure_ascii=False),
                },
            }
        )
    if calls:
        message["tool_calls"] = calls
    prompt_tokens, cached, completion_tokens = openai_counts(
        rule.reply.usage, canonical_json(request.get("messages")), canonical_json(message)
    )
    model = request.get("model")
    return {
        "id": "chatcmpl-" + digest[:24],
        "object": "chat.completion",
        "created": _CREATED,
        "model": model if isinstance(model, str) else "fake-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
        "system_fingerprint": None,
    }
