"""The fake model's OpenAI Responses API: the same rules, another wire format.

``POST /v1/responses`` is answered from the same TOML scripts as the Messages API. The
request's ``input`` items are read as the Messages conversation they are equivalent to, so
every ``when`` condition means the same thing for both APIs:

* ``message`` items of role ``user``/``assistant`` are messages (``input_text`` /
  ``output_text`` parts are text blocks); ``developer``/``system`` items and
  ``instructions`` are the system prompt;
* a ``function_call`` (or ``custom_tool_call``) is an assistant ``tool_use`` whose id is
  the ``call_id``; a ``function_call_output`` is a user ``tool_result`` for it;
* consecutive items of one role are one message (so the last user message after a tool
  call holds the tool's output and any new prompt, as in the Messages API).

A reply's text becomes a ``message`` output item, each ``tool_use`` a ``function_call``
with its input as JSON ``arguments``. Ids are derived from the request's hash, which
ignores what a client changes between two sends of one question (``stream``,
``prompt_cache_key``, ``client_metadata``, ``metadata``, every input item's ``id``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from durable_harness.adapters.proxy.wire.responses import as_messages_request
from durable_harness.core.canonical import dumps_compact
from durable_harness.testing.fake_model_script import (
    RequestView,
    Rule,
    canonical_json,
    openai_counts,
    stable_digest,
)

__all__ = [
    "build_response",
    "response_error_body",
    "responses_request_hash",
]

RESPONSES_PATH = "/v1/responses"
_VOLATILE_FIELDS = ("stream", "metadata", "prompt_cache_key", "client_metadata")
_CREATED_AT = 1_700_000_000  # fixed, so a re-sent request gets byte-identical events


def responses_view(request: dict[str, Any]) -> RequestView:
    return RequestView.of(as_messages_request(request))


def responses_request_hash(request: dict[str, Any]) -> str:
    """sha256 of the request without what changes between two sends of one question."""
    if isinstance(request.get("input"), list):
        request = {
            **request,
            "input": [
                {k: v for k, v in item.items() if k != "id"} if isinstance(item, dict) else item
                for item in request["input"]
            ],
        }
    return stable_digest(request, _VOLATILE_FIELDS)


def build_response(request: dict[str, Any], rule: Rule, digest: str) -> dict[str, Any]:
    """The Responses API response ``rule`` gives to ``request`` (ids seeded by ``digest``)."""
    output: list[dict[str, Any]] = []
    if rule.reply.content_text is not None:
        output.append(
            {
                "id": "msg_" + digest[:24],
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": rule.reply.content_text, "annotations": []}
                ],
            }
        )
    for index, tool in enumerate(rule.reply.tool_use):
        seed = hashlib.sha256(f"{digest}{index}".encode()).hexdigest()
        output.append(
            {
                "id": "fc_" + seed[:24],
                "type": "function_call",
                "status": "completed",
                "arguments": json.dumps(tool.input, ensure_ascii=False),
                "call_id": "call_" + seed[24:48],
                "name": tool.name,
                **({"namespace": tool.namespace} if tool.namespace else {}),
            }
        )
    input_tokens, cached, output_tokens = openai_counts(
        rule.reply.usage, canonical_json(request.get("input")), canonical_json(output)
    )
    model = request.get("model")
    return {
        "id": "resp_" + digest[:24],
        "object": "response",
        "created_at": _CREATED_AT,
        "status": "completed",
        "model": model if isinstance(model, str) else "fake-model",
        "output": output,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
    }


def response_error_body(error_type: str, message: str) -> bytes:
    """An error body shaped as OpenAI's."""
    return dumps_compact(
        {"error": {"message": message, "type": error_type, "param": None, "code": error_type}}
    )
