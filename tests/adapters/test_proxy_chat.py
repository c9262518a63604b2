"""The journaling proxy on the OpenAI Chat Completions API alone: what is recorded is a
whole ``chat.completion``, tool calls with their arguments. (What the proxy promises on
every API: test_proxy_contract.py; the wire format without a proxy: test_wire_chat.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_cases import CHAT_CASE, Rig, open_rig

from durable_harness.adapters.proxy.server import message_of
from durable_harness.adapters.proxy.wire.chat import CHAT
from durable_harness.harness.journal import decode_output


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with open_rig(tmp_path, CHAT_CASE) as rig:
        yield rig


def test_a_streamed_answer_is_recorded_as_a_completion_with_usage(rig: Rig) -> None:
    rig.ask("hello")
    (step,) = rig.steps()
    completion = message_of(decode_output(rig.world, step), CHAT)
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"] == "Hello there."
    assert completion["usage"]["total_tokens"] > 0


def test_tool_calls_are_assembled_with_their_arguments(rig: Rig) -> None:
    rig.ask("use a tool")
    (step,) = rig.steps()
    completion = message_of(decode_output(rig.world, step), CHAT)
    (call,) = completion["choices"][0]["message"]["tool_calls"]
    assert call["id"] == step.meta["tool_use_ids"][0]
    assert call["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
