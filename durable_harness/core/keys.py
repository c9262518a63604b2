"""The journal's stored format: every spelling a stored turn depends on, in one place.

A turn journaled today is resumed by tomorrow's code: a worker finds a finished step by
its key and a model call by the hash of its canonical request. Changing any spelling here
(a key's prefix, a record's name, the JSON used for hashing) makes stored turns miss their
steps: their model calls are paid again and their session records are not found.
``tests/harness/test_keys.py`` pins each spelling; a failure there means exactly that.

=====================  =============================================  =====================
step kind               key                                            who writes it
=====================  =============================================  =====================
``model``               ``model:<n>`` (the n-th call, or step n)       built-in, custom
``model``               ``model:<sha256 of the canonical request>``    journaling proxy
``tool``                ``tool:<n>:<tool_use_id>`` or ``tool:<n>``     built-in, custom
``tool``                ``tool:<tool_use_id>``                         CLI hooks, MCP, waits
``agent``               ``launch:<n>`` (the n-th CLI run of the turn)  CLI adapters
=====================  =============================================  =====================

A CLI's session record (transcript, rollout, session file, store) is saved under the name
``<agent>/<turn_id>/<epoch>``; an output too large for its row is a blob, stored as
``blob:<sha256>``; a tool's idempotency key is ``<turn_id>:<seq>``.
"""

from __future__ import annotations

from typing import Any, Literal

from durable_harness.core.canonical import canonical_json, sha256_hex

StepKind = Literal["model", "tool", "agent"]

MODEL_PREFIX = "model:"
TOOL_PREFIX = "tool:"
LAUNCH_PREFIX = "launch:"
BLOB_PREFIX = "blob:"
ACP_PREFIX = "acp:"


def model_key(request_digest: str) -> str:
    """A CLI's model call, keyed by the hash of its canonical request (:func:`input_digest`)."""
    return f"{MODEL_PREFIX}{request_digest}"


def ordinal_model_key(n: int) -> str:
    """A model call numbered by its place in a deterministic loop: the built-in agent's
    ``n``-th call, or a custom harness's call at step ``n``."""
    return f"{MODEL_PREFIX}{n}"


def tool_key(tool_use_id: str) -> str:
    """A CLI's tool call (its own tools, host tools over MCP, waits), by the model's id."""
    return f"{TOOL_PREFIX}{tool_use_id}"


def ordinal_tool_key(n: int, tool_use_id: str | None = None) -> str:
    """A tool call of the built-in agent's ``n``-th model reply, or a custom harness's tool
    call at step ``n`` (with the model's tool-use id when it gave one)."""
    return f"{TOOL_PREFIX}{n}:{tool_use_id}" if tool_use_id else f"{TOOL_PREFIX}{n}"


def tool_use_id_of(key: str) -> str:
    """The model's tool-use id in a CLI tool step's key (:func:`tool_key`)."""
    return key.removeprefix(TOOL_PREFIX)


def launch_key(number: int) -> str:
    """The ``number``-th run of a CLI within its turn."""
    return f"{LAUNCH_PREFIX}{number}"


def is_launch_key(key: str) -> bool:
    return key.startswith(LAUNCH_PREFIX)


def acp_request_key(method: str, request_digest: str, occurrence: int) -> str:
    """An ACP agent's request the client serves (``fs/read_text_file``, ``terminal/create``,
    ...): its method, the hash of its parameters without the session id
    (:func:`input_digest`), and how many such requests came before it in the turn, so
    the same request asked again after a resume finds its step."""
    return f"{ACP_PREFIX}{method}:{request_digest}:{occurrence}"


def session_record_name(agent: str, turn_id: str, epoch: int) -> str:
    """Where a CLI's session record saved under lease ``epoch`` of a turn is found."""
    return f"{agent}/{turn_id}/{epoch}"


def idempotency_key(turn_id: str, seq: int) -> str:
    """The key a tool hands to its downstream API: the same on every retry of the step."""
    return f"{turn_id}:{seq}"


def blob_ref(digest: str) -> str:
    """A step output stored as a blob, as the row holds it."""
    return f"{BLOB_PREFIX}{digest}"


def input_digest(value: Any) -> str:
    """The hash of a JSON value's canonical spelling: a step's input (compared on replay: a
    mismatch is a divergence) and a model request's canonical form (its step's key)."""
    return sha256_hex(canonical_json(value).encode("utf-8"))
