"""``dh-mcp.js`` (adapters/cli/node.py ``MCP``), the stdio MCP server Claude Code uses in
Docker, against a real HTTP server standing in for the worker behind the bridge: a call
whose connection dies before its reply is posted again, an HTTP error becomes the call's
JSON-RPC error, a notification gets no line. (The whole path, with the real CLI and a
SIGKILLed worker: test_claude_host_tool_interrupted.py.)"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from durable_harness.adapters.cli.node import MCP


class _Worker(BaseHTTPRequestHandler):
    """The first ``tools/call`` dies with its connection (the worker was killed while the
    tool ran); everything after is answered."""

    posts: list[tuple[dict[str, str], dict[str, Any]]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.posts.append((dict(self.headers), body))
        if self.headers["Authorization"] != "Bearer tok":
            self._send(401, b'{"error": "invalid durable-harness token"}')
        elif "id" not in body:
            self._send(202, b"")
        elif [b.get("method") for _, b in self.posts].count("tools/call") == 1:
            self.connection.shutdown(socket.SHUT_RDWR)  # no reply: a reset, as ECONNRESET
        else:
            reply = {"jsonrpc": "2.0", "id": body["id"], "result": {"content": []}}
            self._send(200, json.dumps(reply, indent=2).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def worker() -> Iterator[tuple[str, list[tuple[dict[str, str], dict[str, Any]]]]]:
    posts: list[tuple[dict[str, str], dict[str, Any]]] = []
    handler = type("Handler", (_Worker,), {"posts": posts})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", posts
    finally:
        server.shutdown()
        server.server_close()


def _relay(tmp_path: Path, url: str, token: str, messages: list[dict[str, Any]]) -> list[Any]:
    (tmp_path / "dh-mcp.js").write_text(MCP)
    (tmp_path / "endpoint.json").write_text(json.dumps({"url": url, "token": token}))
    out = subprocess.run(
        ["node", str(tmp_path / "dh-mcp.js"), str(tmp_path / "endpoint.json")],
        input="".join(json.dumps(m) + "\n" for m in messages),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_a_call_cut_off_is_posted_again_and_errors_are_replies(
    tmp_path: Path, worker: tuple[str, list[tuple[dict[str, str], dict[str, Any]]]]
) -> None:
    url, posts = worker
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "charge"}}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert _relay(tmp_path, url, "tok", [call, note]) == [
        {"jsonrpc": "2.0", "id": 7, "result": {"content": []}}  # one line, compact
    ]
    calls = [body for _, body in posts if body.get("id") == 7]
    assert calls == [call, call]  # the same message again: the journal keys it by its id
    assert len(posts) == 3  # the notification once, answered 202 and not written
    headers = posts[0][0]
    assert headers["Accept"] == "application/json, text/event-stream"

    (refused,) = _relay(tmp_path, url, "wrong", [call])
    assert refused["id"] == 7 and refused["error"]["code"] == -32603
    assert "durable-harness answered 401" in refused["error"]["message"]
