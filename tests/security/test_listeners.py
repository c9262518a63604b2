"""Every listener of the harness (the journaling proxy, the signal server, `serve`, the fake model)
refuses malformed framing, oversize bodies, slow clients and malformed credentials the
same way (harness/listener.py), keeps serving afterwards, and holds 200 idle connections
open while it goes on answering authenticated requests with bounded memory.

Each attack is raw bytes on a socket, as a hostile process in the sandbox would send them.
The same attacks from inside the sandbox (through the Docker bridge and relay, and on a
host folder) run in test_proxy_escape.py's turns. The relay that carries a container's
connections to the proxy (UnixRelay) is bounded too: a cap, a deadline for a connection's
first bytes, no thread per connection.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from durable_harness.adapters.claude_code.canonical import ClaudeCodeCanonicalizer
from durable_harness.adapters.cli.relay import UnixRelay
from durable_harness.adapters.proxy.server import JournalingProxy, ProxyCallbacks, Upstream
from durable_harness.core.settings import Settings
from durable_harness.harness.journal import Journal
from durable_harness.harness.listener import Limits
from durable_harness.runtime.signals import SignalServer
from durable_harness.server import ApiServer
from durable_harness.server.auth import create_token
from durable_harness.testing.fake_model import FakeModelServer, parse_script
from durable_harness.worlds import open_world

TOKEN = "proxy-token-for-the-test"
SECRET = "signal-secret-for-the-test"
READ_TIMEOUT = 2.0
MAX_BODY = 64 * 1024
LIMITS = Limits(max_body=MAX_BODY, read_timeout=READ_TIMEOUT)
#: Bytes no token is made of: invalid UTF-8 and Latin-1 letters.
NON_ASCII = b"\xff\xfe\xc3\xa9t\xc3\xa9"
SCRIPT = '[[rule]]\nreply.text = "hello"\n'


@dataclass
class Target:
    """A running listener: how to ask it something it must answer, and with a bad token."""

    name: str
    port: int
    #: An authenticated request (raw bytes) and the status it must get.
    good: Callable[[], tuple[bytes, int]]
    #: Requests carrying a malformed credential, each with the status it must get.
    bad_tokens: list[tuple[bytes, int]]
    #: The path whose body limits are probed (a POST path of this listener).
    post_path: str
    served: list[int] = field(default_factory=list)


def request(
    method: str, path: str, headers: dict[str, bytes] | None = None, body: bytes = b""
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1"]
    for name, value in (headers or {}).items():
        lines.append(name.encode() + b": " + value)
    if body or method == "POST":
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _open_target(name: str, tmp_path: Path, limits: Limits) -> Iterator[Target]:
    world = open_world("local", data_dir=tmp_path / "world")
    world.create_session("ses_l", {})
    world.create_turn("ses_l", "turn_l", "p", {"agent": "claude-code", "signal_secret": SECRET})
    try:
        if name == "proxy":
            yield from _proxy(world, limits)
        elif name == "signal-server":
            yield from _signals(world, limits)
        elif name == "serve":
            yield from _serve(world, limits)
        else:
            with FakeModelServer(parse_script(SCRIPT), limits=limits) as fake:
                messages = json.dumps(
                    {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
                ).encode()
                yield Target(
                    "fake-model",
                    fake.port,
                    lambda: (request("POST", "/v1/messages", body=messages), 200),
                    # The fake model has no credential: a malformed one is no reason to fail.
                    [(request("POST", "/v1/messages", {"x-api-key": NON_ASCII}, messages), 200)],
                    "/v1/messages",
                )
    finally:
        world.close()


def _proxy(world: Any, limits: Limits) -> Iterator[Target]:
    lease = world.claim_turn("turn_l", "test", 60)
    journal = Journal(world, lease)
    callbacks = ProxyCallbacks(control=lambda name, body: {"pong": name})
    count = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
    with FakeModelServer(parse_script(SCRIPT), limits=limits) as fake:
        upstream = Upstream(fake.url, "provider-key", send_key=True)
        canonicalizer = ClaudeCodeCanonicalizer()
        with JournalingProxy(
            journal, canonicalizer, upstream, TOKEN, callbacks, limits=limits, models=("m",)
        ) as proxy:
            port = int(proxy.url.rsplit(":", 1)[1])
            key = {"x-api-key": TOKEN.encode()}
            yield Target(
                "proxy",
                port,
                lambda: (request("POST", "/v1/messages/count_tokens", key, count), 200),
                [
                    (request("POST", "/v1/messages", {"x-api-key": NON_ASCII}, count), 401),
                    (
                        request("POST", "/v1/responses", {"Authorization": b"Bearer " + NON_ASCII}),
                        401,
                    ),
                    (request("POST", "/_dh/ping", {"X-Durable-Harness-Token": NON_ASCII}), 401),
                    (request("POST", "/mcp", {"Authorization": b"Bearer " + NON_ASCII}), 401),
                    (request("GET", "/v1/models", {"x-api-key": NON_ASCII}), 401),
                ],
                "/v1/messages",
            )


def _signals(world: Any, limits: Limits) -> Iterator[Target]:
    server = SignalServer(world, "127.0.0.1", 0, quiet=True, limits=limits).start()
    numbers = iter(range(10**6))
    auth = {"Authorization": b"Bearer " + SECRET.encode()}

    def good() -> tuple[bytes, int]:
        path = f"/v1/turns/turn_l/signals/s{next(numbers)}"
        return request("POST", path, auth, b'{"ok": true}'), 200

    bearer = {"Authorization": b"Bearer " + NON_ASCII}
    try:
        yield Target(
            "signal-server",
            int(server.url.rsplit(":", 1)[1]),
            good,
            [
                (request("POST", "/v1/turns/turn_l/signals/x", bearer, b"{}"), 401),
                # An unknown turn is answered as a wrong secret is.
                (request("POST", "/v1/turns/turn_nope/signals/x", auth, b"{}"), 401),
                (request("POST", "/v1/turns/turn_nope/signals/x", bearer, b"{}"), 401),
                # The turn's secret is not the right to cancel it (the harness's own name).
                (request("POST", "/v1/turns/turn_l/signals/dh.cancel", auth, b"{}"), 400),
            ],
            "/v1/turns/turn_l/signals/big",
        )
    finally:
        server.stop()


def _serve(world: Any, limits: Limits) -> Iterator[Target]:
    operator = create_token(world, "ops", operator=True)[1]
    with ApiServer(world, Settings.load(), caps=limits) as server:
        auth = {"Authorization": b"Bearer " + operator.encode()}
        token_id = operator.split("_")[1]
        yield Target(
            "serve",
            int(server.url.rsplit(":", 1)[1]),
            lambda: (request("GET", "/v1/turns/turn_l", auth), 200),
            [
                (
                    request("GET", "/v1/turns/turn_l", {"Authorization": b"Bearer " + NON_ASCII}),
                    401,
                ),
                (
                    request(
                        "GET", "/v1/turns/turn_l", {"Authorization": b"Bearer dh_" + NON_ASCII}
                    ),
                    401,
                ),
                # A real token id with a wrong secret, and a token-shaped unknown id.
                (
                    request(
                        "GET",
                        "/v1/turns/turn_l",
                        {"Authorization": f"Bearer dh_{token_id}_{'x' * 43}".encode()},
                    ),
                    401,
                ),
                (
                    request(
                        "POST",
                        "/v1/sessions",
                        {"Authorization": b"Bearer dh_" + b"0" * 16 + b"_" + b"y" * 43},
                        b"{}",
                    ),
                    401,
                ),
                # The turn's signal secret is no API token.
                (
                    request(
                        "GET", "/v1/turns/turn_l", {"Authorization": b"Bearer " + SECRET.encode()}
                    ),
                    401,
                ),
            ],
            "/v1/sessions",
        )


# -- talking to a listener -----------------------------------------------------------------
@dataclass
class Reply:
    status: int | None  # None: closed without an answer
    raw: bytes
    seconds: float


def send(
    port: int, data: bytes, *, per_byte: float = 0.0, then: bytes = b"", wait: float = 10.0
) -> Reply:
    """Send ``data`` (a byte at a time, ``per_byte`` apart, if given), then ``then`` without
    waiting for it to be taken, and read the answer until the listener closes or ``wait``."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        try:
            if per_byte:
                for byte in data:
                    sock.send(bytes([byte]))
                    time.sleep(per_byte)
            else:
                sock.sendall(data)
            if then:
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    sock.send(then)
                sock.setblocking(True)
                sock.settimeout(wait)
        except OSError:
            pass  # the listener hung up on us
        raw = b""
        try:
            while b"\r\n\r\n" not in raw or not _whole(raw):
                piece = sock.recv(65536)
                if not piece:
                    break
                raw += piece
        except OSError:
            pass
    status = int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else None
    return Reply(status, raw, time.monotonic() - started)


def _whole(raw: bytes) -> bool:
    head, _, body = raw.partition(b"\r\n\r\n")
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return body.endswith(b"0\r\n\r\n")


def assert_serves(target: Target) -> None:
    data, expected = target.good()
    reply = send(target.port, data)
    assert reply.status == expected, reply.raw[:300]
    target.served.append(expected)


def assert_clean(reply: Reply, allowed: set[int | None]) -> None:
    assert reply.status in allowed, reply.raw[:300]
    assert b"Traceback" not in reply.raw and reply.status != 500


# -- the attacks ---------------------------------------------------------------------------
@pytest.fixture(params=["proxy", "signal-server", "serve", "fake-model"])
def listener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    yield from _open_target(request.param, tmp_path, LIMITS)


def test_every_attack_is_refused_and_the_listener_still_serves(
    listener: Target, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    port, path = listener.port, listener.post_path
    assert_serves(listener)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    chunked = head + b"Transfer-Encoding: chunked\r\n\r\n"
    with ThreadPoolExecutor(4) as pool:
        # Slow clients, meanwhile: headers, then a body, one byte a second.
        slow_head = pool.submit(send, port, head + b"X-Slow: " + b"a" * 20, per_byte=1.0)
        slow_body = pool.submit(
            send, port, head + b"Content-Length: 100\r\n\r\n" + b"{" * 20, per_byte=0.15
        )
        attacks = {
            # "Until EOF" framings: the parser refuses them before any body is read.
            "negative Content-Length": send(port, head + b"Content-Length: -1\r\n\r\n{}"),
            "a -1 chunk": send(port, chunked + b"-1\r\n{}\r\n0\r\n\r\n"),
            "a non-number Content-Length": send(port, head + b"Content-Length: 1e3\r\n\r\n"),
            # Over the cap: answered before the rest is sent (``then`` is never all taken).
            "oversize Content-Length": send(
                port, head + b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1), then=b"x" * 4096
            ),
            "oversize chunked body": send(
                port,
                chunked + (b"4000\r\n" + b"x" * 0x4000 + b"\r\n") * 5,
                then=b"4000\r\n" + b"x" * 0x4000,
            ),
            # A chunk declared endless: counted as it arrives, refused once past the cap.
            "oversize chunk size": send(
                port, chunked + b"fffffffffff\r\n" + b"x" * (MAX_BODY + 1), then=b"x" * 4096
            ),
        }
        for name, reply in attacks.items():
            expected = {413} if "oversize" in name else {400}
            assert_clean(reply, expected)
            assert reply.seconds < READ_TIMEOUT, name  # refused at once, not timed out
            assert_serves(listener)
        for data, status in listener.bad_tokens:
            reply = send(port, data)
            assert_clean(reply, {status})
            assert_serves(listener)
        for slow in (slow_head.result(), slow_body.result()):
            assert_clean(slow, {408, None})
            assert slow.seconds < 3 * READ_TIMEOUT + 1  # cut off, not served forever
        assert slow_head.result().status == 408
        assert slow_body.result().status == 408
    assert_serves(listener)
    # Nothing was logged with a traceback: every refusal was an answer, not a crash.
    assert [r for r in caplog.records if r.exc_info] == []
    print(f"{listener.name}: {len(attacks) + 2 + len(listener.bad_tokens)} attacks refused")


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(params=["proxy", "signal-server", "serve", "fake-model"])
def patient_listener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    # Idle connections are cut after the read timeout: long enough here to outlast the test.
    yield from _open_target(request.param, tmp_path, Limits(max_body=MAX_BODY, read_timeout=60))


def test_200_idle_connections_do_not_stop_authenticated_requests(
    patient_listener: Target,
) -> None:
    target = patient_listener
    assert_serves(target)
    threads_before, rss_before = threading.active_count(), _rss_kib()
    idle = [socket.create_connection(("127.0.0.1", target.port)) for _ in range(200)]
    try:
        for sock in idle[::2]:
            sock.sendall(b"POST / HTTP/1.1\r\n")  # half a request line, then nothing
        started = time.monotonic()
        for _ in range(30):
            assert_serves(target)
        seconds = time.monotonic() - started
        rss_after, threads_after = _rss_kib(), threading.active_count()
        # Every idle connection is still open (nothing to read, no EOF).
        for sock in idle:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
    finally:
        for sock in idle:
            sock.close()
    print(
        f"{target.name}: 30 authenticated requests in {seconds:.2f} s beside 200 idle"
        f" connections; RSS {rss_before} -> {rss_after} KiB; threads"
        f" {threads_before} -> {threads_after}"
    )
    assert seconds < 15
    assert rss_after - rss_before < 32 * 1024  # no thread or buffer per idle connection
    assert threads_after - threads_before < 10


# -- the relay in front of the proxy -------------------------------------------------------
def _ask_unix(path: str, data: bytes) -> int | None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(data)
        raw = b""
        while b"\r\n\r\n" not in raw or not _whole(raw):
            piece = sock.recv(65536)
            if not piece:
                break
            raw += piece
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else None


def _closed(sock: socket.socket, wait: float) -> bool:
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_the_relay_bounds_its_connections_and_their_silence(tmp_path: Path) -> None:
    """UnixRelay (the Docker container's way to the proxy): one event loop for every
    connection, a cap, and a deadline for a connection's first bytes; after them the
    proxy's own limits hold the connection."""
    cap = 260
    for target in _open_target("proxy", tmp_path, Limits(max_body=MAX_BODY, read_timeout=60)):
        path = str(tmp_path / "proxy.sock")
        relay = UnixRelay(
            path, f"http://127.0.0.1:{target.port}", max_connections=cap, read_timeout=READ_TIMEOUT
        ).start()
        data, expected = target.good()
        assert _ask_unix(path, data) == expected
        # A body the proxy refuses half-way: its 413 still reaches the client.
        head = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunks = (b"4000\r\n" + b"x" * 0x4000 + b"\r\n") * (MAX_BODY // 0x4000 + 2)
        assert _ask_unix(path, head + chunks) == 413
        threads_before = threading.active_count()
        idle = []
        try:
            for i in range(250):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(path)
                if i % 2:
                    sock.sendall(b"POST / HTTP/1.1\r\n")  # relayed: the proxy holds it now
                idle.append(sock)
            extra = []
            for _ in range(15):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(path)
                extra.append(sock)
            time.sleep(0.3)
            over = sum(_closed(sock, 0.01) for sock in extra)
            threads_held = threading.active_count()
            stats = (relay.stats.peak, relay.stats.over_cap)
            for sock in extra:
                sock.close()
            time.sleep(0.2)
            started = time.monotonic()
            for _ in range(20):
                assert _ask_unix(path, data) == expected
            seconds = time.monotonic() - started
            time.sleep(READ_TIMEOUT + 1)
            silent_closed = sum(_closed(sock, 0.01) for sock in idle[::2])
            speaking_open = sum(not _closed(sock, 0.01) for sock in idle[1::2])
        finally:
            for sock in idle:
                sock.close()
            relay.close()
        print(
            f"relay: cap {cap}: {over} of 15 connections past 250 idle closed at once "
            f"(peak {stats[0]}, {stats[1]} over the cap); 20 authenticated requests in "
            f"{seconds:.2f} s beside them; threads {threads_before} -> {threads_held}; "
            f"{silent_closed}/125 silent ones closed after {READ_TIMEOUT} s, "
            f"{speaking_open}/125 that had spoken left to the proxy"
        )
        assert over == 5 and stats == (cap, 5)
        assert threads_held - threads_before < 3  # no thread per connection
        assert seconds < 10
        assert silent_closed == 125 and speaking_open == 125
        assert not os.path.exists(path)
