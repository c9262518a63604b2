"""The proxy's client of the model endpoint (``durable_harness/adapters/proxy/upstream.py``)
against a raw socket server that misbehaves on cue: the one retry on a stale kept-alive
connection, no retry on a new one, and the headers that go upstream."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from durable_harness.adapters.proxy.upstream import Upstream, UpstreamClient, UpstreamUnreachable
from durable_harness.adapters.proxy.wire.anthropic import ANTHROPIC

#: What the server does with each request, in order, across connections: "ok" answers
#: (and keeps the connection), "hang up" closes the connection without an answer.
Script = list[str]
#: Starts the server on a script: (base URL, each request's head, each one's connection).
Serve = Callable[[Script], tuple[str, list[bytes], list[int]]]


def _read_request(conn: socket.socket) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return None
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head


@pytest.fixture
def server() -> Iterator[Serve]:
    listener = socket.create_server(("127.0.0.1", 0))

    def start(script: Script) -> tuple[str, list[bytes], list[int]]:
        heads: list[bytes] = []
        connections: list[int] = []  # the connection number each request came on

        def serve() -> None:
            steps = iter(script)
            number = 0
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                number += 1
                with conn:
                    while (head := _read_request(conn)) is not None:
                        heads.append(head)
                        connections.append(number)
                        if next(steps, "hang up") == "hang up":
                            break
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        host, port = listener.getsockname()
        return f"http://{host}:{port}/base", heads, connections

    yield start
    listener.close()


def test_a_stale_kept_alive_connection_is_retried_once_on_a_new_one(server: Serve) -> None:
    url, _, connections = server(["ok", "hang up", "ok"])
    client = UpstreamClient(Upstream(url, "provider-key"))
    for _ in range(2):
        reply = client.send("POST", "/v1/messages", {}, b"{}", ANTHROPIC)
        assert (reply.status, reply.read()) == (200, b"ok")
    assert connections == [1, 1, 2]  # the second request hit a hang-up, then ran again
    client.close()


def test_a_new_connection_that_fails_is_not_retried(server: Serve) -> None:
    url, _, connections = server(["hang up", "ok"])
    client = UpstreamClient(Upstream(url, "provider-key"))
    with pytest.raises(UpstreamUnreachable, match="disconnected"):
        client.send("POST", "/v1/messages", {}, b"{}", ANTHROPIC)
    assert connections == [1]
    client.close()


def test_upstream_gets_the_cli_headers_and_the_harness_key_only(server: Serve) -> None:
    url, heads, _ = server(["ok"])
    client = UpstreamClient(Upstream(url, "provider-key", send_key=True))
    headers = {"x-api-key": "per-turn-token", "anthropic-version": "2023-06-01", "Host": "x"}
    reply = client.send("POST", "/v1/messages?beta=true", headers, b"{}", ANTHROPIC, "model:k")
    assert reply.read() == b"ok"
    (head,) = heads
    request_line, *lines = head.decode().split("\r\n")
    sent = {name.lower(): value.strip() for name, _, value in (x.partition(":") for x in lines)}
    assert request_line == "POST /base/v1/messages?beta=true HTTP/1.1"
    assert sent["x-api-key"] == "provider-key" and sent["accept-encoding"] == "identity"
    assert sent["anthropic-version"] == "2023-06-01" and sent["x-durable-harness-key"] == "model:k"
    assert "user-agent" not in sent and "cookie" not in sent and "accept" not in sent
    client.close()
