"""The fake model's OpenAI Chat Completions API: the same TOML rules read a Chat request
as the Messages conversation it is equivalent to; replies stream as ``data:`` chunks
ending with ``data: [DONE]``."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from durable_harness.testing.fake_model import FakeModelServer, parse_script

SCRIPT = """
[[rule]]
name = "after-tool"
when.last_tool_name = "bash"
when.last_tool_result = "BASH-42"
reply.text = "Done."

[[rule]]
name = "system"
when.system = "be terse"
when.last_user_text = "hi"
reply.text = "Hi."

[[rule]]
name = "busy"
when.last_user_text = "busy"
reply.error = { type = "rate_limit_error", message = "slow down" }

[[rule]]
name = "tool"
when.last_user_text = "make a file"
when.has_tool = "bash"
reply.text = "On it."
reply.tool_use = [ { name = "bash", input = { command = "echo BASH-42" } } ]
"""

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeModelServer]:
    with FakeModelServer(parse_script(SCRIPT), log_path=tmp_path / "log.jsonl") as server:
        yield server


def post(server: FakeModelServer, body: dict[str, Any]) -> tuple[int, bytes]:
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(body),
        {"Authorization": "Bearer k", "X-Durable-Harness-Key": "model:abc"},
    )
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def chunks(data: bytes) -> list[Any]:
    return [
        line.removeprefix("data: ")
        if line == "data: [DONE]"
        else json.loads(line.removeprefix("data: "))
        for line in data.decode().splitlines()
        if line.startswith("data: ")
    ]


def test_tool_call_streams_and_a_resend_is_byte_identical(fake: FakeModelServer) -> None:
    body = {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "make a file"}],
    }
    status, data = post(fake, body)
    assert status == 200 and b"event:" not in data
    stream = chunks(data)
    assert stream[-1] == "[DONE]"
    assert all(c["object"] == "chat.completion.chunk" for c in stream[:-1])
    assert stream[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in stream[1:-2])
    assert text == "On it."
    calls = [d for c in stream[:-2] for d in c["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "bash"
    arguments = "".join(d["function"]["arguments"] for d in calls)
    assert json.loads(arguments) == {"command": "echo BASH-42"}
    assert stream[-3]["choices"][0]["finish_reason"] == "tool_calls"
    assert stream[-2]["choices"] == [] and stream[-2]["usage"]["total_tokens"] > 0
    # Another transport (no usage asked): the same question, the same ids.
    again = {**body, "stream_options": None}
    assert chunks(post(fake, again)[1])[0]["id"] == stream[0]["id"]
    assert post(fake, body) == (status, data)


def test_tool_message_is_a_tool_result(fake: FakeModelServer, tmp_path: Path) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    body = {
        "model": "m",
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "make a file"}]},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "BASH-42\n"},
        ],
    }
    status, data = post(fake, body)
    reply = json.loads(data)
    assert status == 200 and reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["content"] == "Done."
    assert reply["choices"][0]["finish_reason"] == "stop"
    line = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[-1])
    assert line["path"] == "/v1/chat/completions" and line["rule"] == "after-tool"
    assert line["request_key"] == "model:abc" and line["api_key_sent"] is True
    assert fake.request_count == 1


def test_non_streamed_tool_calls(fake: FakeModelServer) -> None:
    body = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "make a file"}]}
    choice = json.loads(post(fake, body)[1])["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "bash"


def test_system_messages_are_the_system_prompt(fake: FakeModelServer) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"}],
    }
    assert json.loads(post(fake, body)[1])["choices"][0]["message"]["content"] == "Hi."


def test_errors_are_openai_shaped(fake: FakeModelServer) -> None:
    status, data = post(fake, {"model": "m", "messages": [{"role": "user", "content": "busy"}]})
    assert status == 429 and json.loads(data)["error"]["type"] == "rate_limit_error"
    status, data = post(fake, {"model": "m", "messages": [{"role": "user", "content": "nope"}]})
    assert status == 400 and "no rule matches" in json.loads(data)["error"]["message"]
    status, data = post(fake, {"model": "m"})
    assert status == 400 and "messages" in json.loads(data)["error"]["message"]
