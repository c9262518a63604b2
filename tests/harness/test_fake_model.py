"""The scripted fake model server, driven over real HTTP by the real ``anthropic`` SDK."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types import MessageParam

from durable_harness.core.errors import ConfigError
from durable_harness.testing.fake_model import FakeModelServer, load_script, parse_script
from durable_harness.testing.fake_model_script import Reply, Rule, Script, ToolUse

MODEL = "claude-fake-1"

REFUND_SCRIPT = """
[[rule]]
name = "check first"
when.last_user_text = "Refund order"
reply.text = "Let me check that order for you before refunding anything."
[[rule.reply.tool_use]]
name = "check_refund"
input.order = 42
input.note = "héllo \\"q\\""
input.tags = ["a", "b"]
input.nested = { ok = true, ratio = 0.5 }

[[rule]]
name = "refund"
when.last_tool_name = "check_refund"
when.last_tool_result = "not refunded"
reply.tool_use = [ { name = "refund", input = { order = 42 } }, { name = "notify", input = {} } ]

[[rule]]
name = "overloaded"
when.last_user_text = "overload me"
reply.error = { status = 529, type = "overloaded_error", message = "Overloaded" }

[[rule]]
name = "slow"
when.last_user_text = "slow stream"
reply.text = "one two three four five six seven eight"
reply.chunk_delay_ms = 150
"""

Serve = Callable[..., FakeModelServer]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """Start a server from TOML text; every server is stopped at the end of the test."""
    servers: list[FakeModelServer] = []

    def start(script: str, log: bool = False) -> FakeModelServer:
        path = tmp_path / f"script{len(servers)}.toml"
        path.write_text(script, encoding="utf-8")
        log_path = tmp_path / f"log{len(servers)}.jsonl" if log else None
        server = FakeModelServer(path, log_path=log_path).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def client_for(server: FakeModelServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="test", max_retries=0)


def user(text: str) -> list[MessageParam]:
    return [{"role": "user", "content": text}]


def tool_conversation(tool_name: str, result: Any) -> list[MessageParam]:
    """A user turn, an assistant tool call, and the user's tool_result for it."""
    return [
        {"role": "user", "content": "Refund order 42"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_abc", "name": tool_name, "input": {"order": 42}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_abc", "content": result}],
        },
    ]


def without_parsed(message: anthropic.types.Message) -> dict[str, Any]:
    # The stream helper returns ParsedMessage / ParsedTextBlock, which add `parsed_output`.
    data = message.model_dump()
    for block in data["content"]:
        block.pop("parsed_output", None)
    return data


# --- JSON and streaming give the same message ----------------------------------------------


def test_json_and_both_streaming_apis_give_the_same_message(serve: Serve) -> None:
    client = client_for(serve(REFUND_SCRIPT))
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 256,
        "messages": user("Refund order 42"),
    }

    plain = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()

    events = list(client.messages.create(**kwargs, stream=True))
    types = [event.type for event in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    assert types.count("content_block_start") == 2 == types.count("content_block_stop")
    text_pieces = [
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    ]
    json_pieces = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(text_pieces) > 1, "text should arrive in several deltas"
    assert json_pieces[0] == "" and len(json_pieces) > 2
    assert "".join(text_pieces) == plain.content[0].text
    assert json.loads("".join(json_pieces)) == plain.content[1].input

    assert without_parsed(streamed) == plain.model_dump()
    assert plain.id.startswith("msg_") and len(plain.id) == 4 + 24
    assert plain.stop_reason == "tool_use"
    assert plain.model == MODEL
    assert plain.usage.input_tokens >= 1 and plain.usage.output_tokens >= 1


def test_tool_use_input_round_trips_through_input_json_delta(serve: Serve) -> None:
    client = client_for(serve(REFUND_SCRIPT))
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 256,
        "messages": user("Refund order 42"),
    }
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    tool = final.content[1]
    assert tool.type == "tool_use" and tool.name == "check_refund"
    assert tool.input == {
        "order": 42,
        "note": 'héllo "q"',
        "tags": ["a", "b"],
        "nested": {"ok": True, "ratio": 0.5},
    }
    assert tool.id.startswith("toolu_") and len(tool.id) == 6 + 24

    # Two tool calls, one with empty input; ids differ per block.
    follow_up = dict(kwargs, messages=tool_conversation("check_refund", "order 42: not refunded"))
    with client.messages.stream(**follow_up) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        ("tool_use", {"order": 42}),
        ("tool_use", {}),
    ]
    assert final.content[0].id != final.content[1].id  # type: ignore[union-attr]
    assert final.stop_reason == "tool_use"


def test_sse_wire_format_is_anthropics(serve: Serve) -> None:
    server = serve('[[rule]]\nreply.text = "hello there"\n')
    body = {"model": MODEL, "max_tokens": 10, "stream": True, "messages": user("hi")}
    response = httpx2.post(server.url + "/v1/messages?beta=true", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = response.text.split("\n\n")
    assert frames[-1] == ""
    names = []
    for frame in frames[:-1]:
        event_line, data_line = frame.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        name = event_line.removeprefix("event: ")
        assert json.loads(data_line.removeprefix("data: "))["type"] == name
        names.append(name)
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-4:] == [
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = json.loads(frames[0].split("\n")[1].removeprefix("data: "))["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert response.headers["request-id"].startswith("req_")


# --- Matching -----------------------------------------------------------------------------


MATCH_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    # (when line, request that matches, request that does not)
    (
        'when.last_user_text = "order 42"',
        {"messages": user("Refund order 42 now")},
        {"messages": [*user("order 42"), {"role": "assistant", "content": "ok"}, *user("no")]},
    ),
    (
        'when.last_user_text = "block text"',
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a block text"}]}]},
        {"messages": user("plain")},
    ),
    (
        'when.last_tool_name = "check_refund"',
        {"messages": tool_conversation("check_refund", "done")},
        {"messages": tool_conversation("other_tool", "done")},
    ),
    (
        'when.last_tool_result = "not refunded"',
        {"messages": tool_conversation("t", [{"type": "text", "text": "order not refunded"}])},
        {"messages": tool_conversation("t", "refunded already")},
    ),
    (
        'when.conversation = "order 42"',
        {"messages": [*user("order 42"), {"role": "assistant", "content": "ok"}, *user("go")]},
        {"messages": user("order 43")},
    ),
    (
        'when.not_conversation = "secret"',
        {"messages": user("hello")},
        {"messages": [*user("the secret"), {"role": "assistant", "content": "ok"}, *user("go")]},
    ),
    (
        'when.system = "pirate"',
        {"messages": user("hi"), "system": [{"type": "text", "text": "You are a pirate."}]},
        {"messages": user("hi"), "system": "You are a clerk."},
    ),
    (
        'when.has_tool = "refund"',
        {
            "messages": user("hi"),
            "tools": [{"name": "refund", "input_schema": {"type": "object"}}],
        },
        {
            "messages": user("hi"),
            "tools": [{"name": "refund_status", "input_schema": {"type": "object"}}],
        },
    ),
    (
        'when.model = "claude-special"',
        {"messages": user("hi"), "model": "claude-special"},
        {"messages": user("hi"), "model": "claude-special-2"},
    ),
]


@pytest.mark.parametrize(("when", "hit", "miss"), MATCH_CASES, ids=[c[0] for c in MATCH_CASES])
def test_each_when_condition(
    serve: Serve, when: str, hit: dict[str, Any], miss: dict[str, Any]
) -> None:
    server = serve(f'[[rule]]\nname = "r"\n{when}\nreply.text = "matched"\n')
    client = client_for(server)
    message = client.messages.create(**{"model": MODEL, "max_tokens": 10, **hit})
    assert message.content[0].text == "matched"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(**{"model": MODEL, "max_tokens": 10, **miss})
    assert server.stats() == {
        "requests": 2,
        "by_rule": {"r": 1},
        "unmatched": 1,
        "count_tokens": 0,
    }


def test_all_conditions_of_a_rule_must_hold_and_first_rule_wins(serve: Serve) -> None:
    server = serve(
        """
        [[rule]]
        when.last_user_text = "refund"
        when.system = "strict"
        reply.text = "both"

        [[rule]]
        when.last_user_text = "refund"
        reply.text = "first of the rest"

        [[rule]]
        when.last_user_text = "refund"
        reply.text = "never reached"

        [[rule]]
        reply.text = "catch-all"
        """
    )
    client = client_for(server)

    def ask(text: str, system: str = "") -> str:
        message = client.messages.create(
            model=MODEL, max_tokens=10, messages=user(text), system=system
        )
        return message.content[0].text  # type: ignore[union-attr]

    assert ask("refund", system="be strict") == "both"
    assert ask("refund") == "first of the rest"
    assert ask("anything else") == "catch-all"
    assert server.stats()["by_rule"] == {"#1": 1, "#2": 1, "#4": 1}


def test_unmatched_request_is_a_400_naming_the_last_user_text(serve: Serve) -> None:
    server = serve('[[rule]]\nwhen.last_user_text = "x-only"\nreply.text = "x"\n', log=True)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client_for(server).messages.create(model=MODEL, max_tokens=10, messages=user("please do y"))
    error = caught.value
    assert error.status_code == 400
    assert error.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "fake model: no rule matches the request (last user text: 'please do y')",
        },
    }
    assert server.stats()["unmatched"] == 1


# --- Determinism --------------------------------------------------------------------------


def test_same_request_gives_byte_identical_responses(serve: Serve) -> None:
    server = serve(REFUND_SCRIPT)
    body = {"model": MODEL, "max_tokens": 50, "messages": user("Refund order 42")}
    with httpx2.Client(base_url=server.url) as http:
        first = http.post("/v1/messages", json=body).content
        again = http.post("/v1/messages", json=body).content
        # metadata and stream are not part of the request's identity
        with_metadata = http.post(
            "/v1/messages", json={**body, "metadata": {"user_id": "session-9"}}
        ).content
        stream_a = http.post("/v1/messages", json={**body, "stream": True}).content
        stream_b = http.post("/v1/messages", json={**body, "stream": True}).content
    assert first == again == with_metadata
    assert stream_a == stream_b
    message = json.loads(first)
    assert message["id"].encode() in stream_a
    assert message["content"][1]["id"].encode() in stream_a


def test_different_requests_get_different_ids(serve: Serve) -> None:
    client = client_for(serve('[[rule]]\nreply.tool_use = [{ name = "t" }]\n'))
    one = client.messages.create(model=MODEL, max_tokens=10, messages=user("a"))
    two = client.messages.create(model=MODEL, max_tokens=10, messages=user("b"))
    three = client.messages.create(model=MODEL, max_tokens=11, messages=user("a"))
    assert len({one.id, two.id, three.id}) == 3
    assert len({one.content[0].id, two.content[0].id, three.content[0].id}) == 3  # type: ignore[union-attr]
    assert one.stop_reason == "tool_use"


def test_script_built_in_python(serve: Serve) -> None:
    script = Script(
        rules=[Rule(reply=Reply(text="hi", tool_use=[ToolUse(name="t", input={"a": 1})]))]
    )
    with FakeModelServer(script) as server:
        message = client_for(server).messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    assert [b.type for b in message.content] == ["text", "tool_use"]


# --- Errors -------------------------------------------------------------------------------


def test_error_reply_surfaces_as_the_sdk_exception(serve: Serve) -> None:
    client = client_for(serve(REFUND_SCRIPT))
    for stream in (False, True):
        with pytest.raises(anthropic.InternalServerError) as caught:
            client.messages.create(
                model=MODEL, max_tokens=10, messages=user("overload me"), stream=stream
            )
        assert isinstance(caught.value, anthropic.APIStatusError)
        assert caught.value.status_code == 529
        assert caught.value.body == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "Overloaded"},
        }


def test_error_status_defaults_from_the_type(serve: Serve) -> None:
    client = client_for(serve('[[rule]]\nreply.error = { type = "rate_limit_error" }\n'))
    with pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    assert caught.value.status_code == 429


def test_unknown_path_is_a_404_in_anthropic_shape(serve: Serve) -> None:
    server = serve('[[rule]]\nreply.text = "x"\n')
    response = httpx2.post(server.url + "/v1/complete", json={})
    assert response.status_code == 404
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "not_found_error"
    assert httpx2.get(server.url + "/v1/models").status_code == 404
    bad = httpx2.post(server.url + "/v1/messages", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


# --- Counting and logging -----------------------------------------------------------------


def test_stats_and_log_count_every_request(serve: Serve, tmp_path: Path) -> None:
    server = serve(REFUND_SCRIPT, log=True)
    client = client_for(server)
    client.messages.create(model=MODEL, max_tokens=10, messages=user("Refund order 42"))
    with client.messages.stream(
        model=MODEL, max_tokens=10, messages=user("Refund order 42")
    ) as stream:
        stream.get_final_message()
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=10, messages=user("nothing"))
    with pytest.raises(anthropic.InternalServerError):
        client.messages.create(model=MODEL, max_tokens=10, messages=user("overload me"))
    counted = client.messages.count_tokens(model=MODEL, messages=user("Refund order 42"))
    assert counted.input_tokens >= 1
    # No API key at all is accepted too; the log says so.
    anonymous = httpx2.post(
        server.url + "/v1/messages",
        json={"model": MODEL, "max_tokens": 10, "messages": user("Refund order 42")},
    )
    assert anonymous.status_code == 200

    stats = httpx2.get(server.url + "/_fake/stats").json()
    assert stats == {
        "requests": 5,
        "by_rule": {"check first": 3, "overloaded": 1},
        "unmatched": 1,
        "count_tokens": 1,
    }
    assert server.request_count == 5

    lines = [json.loads(line) for line in (tmp_path / "log0.jsonl").read_text().splitlines()]
    assert [line["n"] for line in lines] == [1, 2, 3, 4, 5, 6]
    assert [line["status"] for line in lines] == [200, 200, 400, 529, 200, 200]
    assert [line["stream"] for line in lines] == [False, True, False, False, False, False]
    assert [line["rule"] for line in lines] == [
        "check first",
        "check first",
        None,
        "overloaded",
        None,
        "check first",
    ]
    assert [line["api_key_sent"] for line in lines] == [True] * 5 + [False]
    assert lines[4]["path"] == "/v1/messages/count_tokens"
    assert lines[2]["last_user_text"] == "nothing"
    # The same request streamed or not has the same hash.
    assert lines[0]["request_hash"] == lines[1]["request_hash"] == lines[5]["request_hash"]
    assert lines[0]["request_key"] is None  # only a journaling proxy sends one
    assert set(lines[0]) == {
        "n",
        "time",
        "path",
        "stream",
        "rule",
        "request_hash",
        "last_user_text",
        "status",
        "api_key_sent",
        "request_key",
    }


def test_client_killed_mid_stream_is_still_counted(serve: Serve, tmp_path: Path) -> None:
    server = serve(REFUND_SCRIPT, log=True)
    body = {"model": MODEL, "max_tokens": 10, "stream": True, "messages": user("slow stream")}
    with (
        httpx2.Client(base_url=server.url) as http,
        http.stream("POST", "/v1/messages", json=body) as response,
    ):
        first = next(response.iter_raw())
        assert first.startswith(b"event: message_start")
        # Leaving the block closes the connection mid-stream.
    log_lines = (tmp_path / "log0.jsonl").read_text().splitlines()
    assert len(log_lines) == 1 and json.loads(log_lines[0])["rule"] == "slow"
    assert server.request_count == 1
    # The server survives the broken stream and keeps answering.
    message = client_for(server).messages.create(
        model=MODEL, max_tokens=10, messages=user("Refund order 42")
    )
    assert message.stop_reason == "tool_use"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_client_killed_mid_send_is_not_a_request(
    serve: Serve, tmp_path: Path, framing: str
) -> None:
    """Half a body (the sender died mid-send) is neither answered nor logged nor counted."""
    server = serve(REFUND_SCRIPT, log=True)
    body = json.dumps({"model": MODEL, "max_tokens": 10, "messages": user("Refund order 42")})
    half = body[: len(body) // 2].encode()
    if framing == "chunked":
        head, payload = "Transfer-Encoding: chunked", f"{len(body):x}\r\n".encode() + half
    else:
        head, payload = f"Content-Length: {len(body)}", half
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\n{head}\r\n\r\n".encode()
            + payload
        )
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1024) == b""  # closed without an answer
    assert server.request_count == 0
    assert (tmp_path / "log0.jsonl").read_text() == ""


def test_delay_ms_waits_before_answering(serve: Serve) -> None:
    client = client_for(serve('[[rule]]\nreply.text = "late"\nreply.delay_ms = 300\n'))
    started = time.monotonic()
    client.messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    assert time.monotonic() - started >= 0.3


# --- The command line ---------------------------------------------------------------------


def test_cli_serves_until_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "script.toml"
    script.write_text(REFUND_SCRIPT, encoding="utf-8")
    log_path = tmp_path / "cli.jsonl"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "durable_harness.testing.fake_model",
            "--script",
            str(script),
            "--port",
            "0",
            "--log",
            str(log_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        prefix = "fake model listening on "
        assert line.startswith(prefix), line
        url = line.removeprefix(prefix).split(" ")[0]
        assert line.endswith(f"(script: {script}, 4 rules)")
        assert url.startswith("http://127.0.0.1:")
        client = anthropic.Anthropic(base_url=url, api_key="test", max_retries=0)
        message = client.messages.create(
            model=MODEL, max_tokens=10, messages=user("Refund order 42")
        )
        assert message.content[1].name == "check_refund"  # type: ignore[union-attr]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert len(log_path.read_text().splitlines()) == 1


def test_cli_rejects_a_bad_script(tmp_path: Path) -> None:
    script = tmp_path / "bad.toml"
    script.write_text('[[rule]]\nwhen.colour = "red"\nreply.text = "x"\n', encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "durable_harness.testing.fake_model", "--script", str(script)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "when.colour: unknown key" in result.stderr
    assert result.stdout == ""


# --- Bad scripts --------------------------------------------------------------------------


BAD_SCRIPTS = [
    (
        '[[rule]]\nname = "greet"\nwhen.last_user_txt = "hi"\nreply.text = "x"\n',
        "rule #1 ('greet'): when.last_user_txt: unknown key (allowed: last_user_text,",
    ),
    ('[[rule]\nreply.text = "x"\n', "not valid TOML"),
    (
        '[[rule]]\nreply.text = "x"\n[[rule]]\nreply.tool_use = [{ input = { a = 1 } }]\n',
        "rule #2: reply.tool_use.0.name: Field required",
    ),
    (
        '[[rule]]\nreply.text = "x"\nreply.error = { type = "api_error" }\n',
        "rule #1: reply: give either error or text/tool_use, not both",
    ),
    ('[[rule]]\nname = "empty"\nreply.delay_ms = 5\n', "rule #1 ('empty'): reply: give text"),
    ('[[rule]]\nwhen.system = "x"\n', "rule #1: reply: Field required"),
    ("", "the script has no [[rule]] tables"),
    ('[rule]\nreply.text = "x"\n', "[[rule]]: Input should be a valid list"),
    ('colour = 1\n[[rule]]\nreply.text = "x"\n', "colour: unknown key (allowed: rule)"),
    ('[[rule]]\nbogus = 1\nreply.text = "x"\n', "rule #1: bogus: unknown key (allowed: name,"),
    (
        '[[rule]]\nname = "a"\nreply.text = "x"\n[[rule]]\nname = "a"\nreply.text = "y"\n',
        "two rules are named 'a'",
    ),
    (
        '[[rule]]\nreply.error = { type = "teapot_error" }\n',
        "give a status for the unknown error type 'teapot_error'",
    ),
    (
        '[[rule]]\nreply.error = { type = "api_error", status = 200 }\n',
        "reply.error.status: Input should be greater than or equal to 400",
    ),
    (
        '[[rule]]\nreply.tool_use = [{ name = "t", input = { when = 1979-05-27 } }]\n',
        "input must hold only JSON values",
    ),
    ('[[rule]]\nwhen.last_user_text = 3\nreply.text = "x"\n', "when.last_user_text: Input"),
    ('[[rule]]\nreply.text = "x"\nreply.tool_use = [{ name = "t", colour = 1 }]\n', "colour"),
]


@pytest.mark.parametrize(("text", "expected"), BAD_SCRIPTS, ids=[b[1][:40] for b in BAD_SCRIPTS])
def test_bad_scripts_raise_config_error(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_script(text, source="s.toml")
    assert str(caught.value).startswith("fake model script s.toml: ")
    assert expected in str(caught.value)


def test_load_script_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read fake model script"):
        load_script(tmp_path / "missing.toml")
    path = tmp_path / "bad.toml"
    path.write_text("[[rule]]\nreply = 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=str(path)):
        load_script(path)
    with pytest.raises(ConfigError):
        FakeModelServer(path)


def test_busy_port_is_a_config_error(serve: Serve) -> None:
    server = serve('[[rule]]\nreply.text = "x"\n')
    script = Script(rules=[Rule(reply=Reply(text="x"))])
    with pytest.raises(ConfigError, match="pick another --port"):
        FakeModelServer(script, port=server.port)
