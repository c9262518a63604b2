"""Golden spellings of the journal's stored format (durable_harness/core/keys.py).

If one of these fails, the change renamed something stored turns depend on: a turn
journaled before it would miss its finished steps on resume (paying its model calls
again) or not find its CLI's session record. Keep the old spelling, or migrate the
stored rows and say so; never just update the expected value here.
"""

from __future__ import annotations

from durable_harness.adapters.proxy.canonical import AnthropicMessagesCanonicalizer
from durable_harness.core import keys
from durable_harness.core.canonical import canonical_json

TOOL_USE_ID = "toolu_01ABC"
TURN = "turn_0123456789abcdef0123"


def test_step_keys() -> None:
    assert keys.model_key("ab" * 32) == "model:" + "ab" * 32
    assert keys.ordinal_model_key(3) == "model:3"
    assert keys.tool_key(TOOL_USE_ID) == "tool:toolu_01ABC"
    assert keys.ordinal_tool_key(2, TOOL_USE_ID) == "tool:2:toolu_01ABC"
    assert keys.ordinal_tool_key(5) == "tool:5"
    assert keys.tool_use_id_of("tool:toolu_01ABC") == TOOL_USE_ID
    assert keys.launch_key(1) == "launch:1"
    assert keys.is_launch_key("launch:7") and not keys.is_launch_key("tool:launch:7")
    assert keys.acp_request_key("fs/write_text_file", "ab12", 0) == "acp:fs/write_text_file:ab12:0"
    assert keys.acp_request_key("terminal/create", "cd34", 2) == "acp:terminal/create:cd34:2"


def test_record_names_blobs_and_idempotency_keys() -> None:
    assert keys.session_record_name("claude-code", TURN, 2) == f"claude-code/{TURN}/2"
    assert keys.session_record_name("codex", TURN, 0) == f"codex/{TURN}/0"
    assert keys.session_record_name("opencode", TURN, 1) == f"opencode/{TURN}/1"
    assert keys.session_record_name("pi", TURN, 1) == f"pi/{TURN}/1"
    assert keys.blob_ref("cd" * 32) == "blob:" + "cd" * 32
    assert keys.idempotency_key(TURN, 4) == f"{TURN}:4"


def test_hash_spellings() -> None:
    value = {"b": [1, 2.5, None, True], "a": "é ☃", "c": {"z": 1, "y": ""}}
    assert canonical_json(value) == '{"a":"é ☃","b":[1,2.5,null,true],"c":{"y":"","z":1}}'
    assert keys.input_digest(value) == (
        "8759b1f7e1f8428cf41b984e52a2f1dfc4ff7ab793aedf572b5352e2d7bbe06a"
    )


def test_a_model_request_key() -> None:
    """A Messages request's key: the structural rules (cache markers and stream flags
    dropped) and the hash together, as the proxy computes it."""
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "stream": True,
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hello"}],
    }
    key = AnthropicMessagesCanonicalizer().key("/v1/messages", {}, body, lambda _id: None)
    # computed by the code of e4dc768, before the journal format had a module of its own
    assert key == "42596ab1967c849b3640f18d5e7302be911f3337fbaae3fb6e6e64a17025f4b0"
