"""The fake model's OpenAI Responses API: the same TOML rules read a Responses request as
the Messages conversation it is equivalent to; replies stream as ``response.*`` events."""

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
when.last_tool_name = "exec_command"
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
name = "namespaced"
when.last_user_text = "tell the team"
reply.tool_use = [{ name = "notify", namespace = "mcp__durable_harness", input = { text = "hi" } }]

[[rule]]
name = "tool"
when.last_user_text = "make a file"
when.has_tool = "exec_command"
reply.text = "On it."
reply.tool_use = [ { name = "exec_command", input = { cmd = "echo BASH-42" } } ]
"""


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeModelServer]:
    with FakeModelServer(parse_script(SCRIPT), log_path=tmp_path / "log.jsonl") as server:
        yield server


def post(server: FakeModelServer, body: dict[str, Any]) -> tuple[int, bytes]:
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.request(
        "POST",
        "/v1/responses",
        json.dumps(body),
        {"Authorization": "Bearer k", "X-Durable-Harness-Key": "model:abc"},
    )
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def message(role: str, text: str, item_id: str = "m1") -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {
        "type": "message",
        "id": item_id,
        "role": role,
        "content": [{"type": kind, "text": text}],
    }


def events(data: bytes) -> list[dict[str, Any]]:
    return [
        json.loads(line.removeprefix("data: "))
        for line in data.decode().splitlines()
        if line.startswith("data: ")
    ]


TOOLS = [{"type": "function", "name": "exec_command", "parameters": {}}]


def test_tool_call_streams_and_a_resend_is_byte_identical(fake: FakeModelServer) -> None:
    body = {"model": "m", "stream": True, "tools": TOOLS, "input": [message("user", "make a file")]}
    status, data = post(fake, body)
    assert status == 200
    stream = events(data)
    assert [e["sequence_number"] for e in stream] == list(range(len(stream)))
    assert stream[0]["type"] == "response.created" and stream[-1]["type"] == "response.completed"
    output = stream[-1]["response"]["output"]
    assert [i["type"] for i in output] == ["message", "function_call"]
    assert json.loads(output[1]["arguments"]) == {"cmd": "echo BASH-42"}
    # Another cache key and other item ids: the same question, the same bytes.
    again = {**body, "prompt_cache_key": "x", "input": [message("user", "make a file", "m2")]}
    assert post(fake, again) == (status, data)


def test_a_namespaced_tool_use_is_a_function_call_with_its_namespace(
    fake: FakeModelServer,
) -> None:
    """Codex offers MCP tools as a namespace: the model's call names it (and the tool)."""
    body = {"model": "m", "stream": True, "input": [message("user", "tell the team")]}
    status, data = post(fake, body)
    assert status == 200
    (call,) = events(data)[-1]["response"]["output"]
    assert (call["namespace"], call["name"]) == ("mcp__durable_harness", "notify")
    # Without a namespace the item has none (the plain tools of every other test).
    plain = {**body, "tools": TOOLS, "input": [message("user", "make a file")]}
    output = events(post(fake, plain)[1])[-1]["response"]["output"]
    assert "namespace" not in output[1]


def test_function_call_output_is_a_tool_result(fake: FakeModelServer, tmp_path: Path) -> None:
    call = {"type": "function_call", "name": "exec_command", "arguments": "{}", "call_id": "c1"}
    result = {"type": "function_call_output", "call_id": "c1", "output": "Output:\nBASH-42\n"}
    body = {"model": "m", "input": [message("user", "make a file"), call, result]}
    status, data = post(fake, body)
    reply = json.loads(data)
    assert status == 200 and reply["object"] == "response" and reply["status"] == "completed"
    assert reply["output"][0]["content"][0]["text"] == "Done."
    line = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[-1])
    assert line["path"] == "/v1/responses" and line["rule"] == "after-tool"
    assert line["request_key"] == "model:abc" and line["api_key_sent"] is True
    assert fake.request_count == 1


def test_developer_messages_are_the_system_prompt(fake: FakeModelServer) -> None:
    body = {"model": "m", "input": [message("developer", "be terse"), message("user", "hi")]}
    assert json.loads(post(fake, body)[1])["output"][0]["content"][0]["text"] == "Hi."


def test_errors_are_openai_shaped(fake: FakeModelServer) -> None:
    status, data = post(fake, {"model": "m", "input": "busy"})
    assert status == 429 and json.loads(data)["error"]["type"] == "rate_limit_error"
    status, data = post(fake, {"model": "m", "input": "nothing matches"})
    assert status == 400 and "no rule matches" in json.loads(data)["error"]["message"]
    status, data = post(fake, {"model": "m"})
    assert status == 400 and "input" in json.loads(data)["error"]["message"]
