"""What a tenant holding a valid token cannot take from the others (security review of
issue 15): open streams per tenant, a stream's lifetime, a revoked token's open stream,
signals' size and rate, sessions per minute, and seqs or cursors that are not numbers."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx2
from serve_cases import error_of, token, world_of
from support import Harness, start_serve, wait_for

from durable_harness.server.auth import create_token
from durable_harness.server.context import encode_cursor


def _hold(serve_url: str, secret: str, path: str, out: list[Any]) -> None:
    """Open a stream and keep it until the server ends it; note how it ended."""
    headers = {"Authorization": f"Bearer {secret}"}
    try:
        with (
            httpx2.Client(base_url=serve_url, headers=headers, timeout=30) as http,
            http.stream("GET", path) as response,
        ):
            out.append(("status", response.status_code))
            for _ in response.iter_bytes():
                pass
            out.append(("ended", time.monotonic()))
    except httpx2.HTTPError as exc:
        out.append(("error", repr(exc)))


def test_a_tenant_cannot_hold_the_server_or_the_world(harness: Harness) -> None:
    with world_of(harness) as world:
        a, b, d = (token(world, f"tenant-{n}") for n in "abd")
        c_token, c_secret = _token_and_id(world, "tenant-c")
    serve = start_serve(
        harness,
        DURABLE_HARNESS_API_MAX_STREAMS_PER_TENANT="2",
        DURABLE_HARNESS_API_STREAM_MAX_S="3",
        DURABLE_HARNESS_API_HEARTBEAT_S="0.3",
        DURABLE_HARNESS_API_MAX_SIGNAL_BYTES="100",
        DURABLE_HARNESS_API_SIGNALS_PER_MINUTE="2",
        DURABLE_HARNESS_API_SESSIONS_PER_MINUTE="3",
    )
    try:
        with (
            serve.http(a) as api_a,
            serve.http(b) as api_b,
            serve.http(c_secret) as api_c,
            serve.http(d) as api_d,
        ):
            sid = api_a.post("/v1/sessions", json={"agent": "builtin"}).json()["session_id"]
            # No worker runs: the turn stays queued, its stream never reaches turn.ended.
            tid = api_a.post(f"/v1/sessions/{sid}/turns", json={"prompt": "wait"}).json()["turn_id"]
            path = f"/v1/turns/{tid}/events"

            # Two open streams are A's share; a third is 429, and B is served meanwhile.
            held: list[list[Any]] = [[], []]
            threads = [
                threading.Thread(target=_hold, args=(serve.url, a, path, out)) for out in held
            ]
            opened = time.monotonic()
            for thread in threads:
                thread.start()
            wait_for(lambda: all(out and out[0] == ("status", 200) for out in held), 20)
            assert error_of(api_a.get(path))[:2] == (429, "too_many_streams")
            assert api_b.get("/v1/sessions").status_code == 200
            # The server ends each after its lifetime; the slots are given back.
            for thread in threads:
                thread.join(timeout=30)
            for out in held:
                assert out[-1][0] == "ended", out
                assert out[-1][1] - opened >= 2.5, out
            with serve.http(a) as again, again.stream("GET", path) as response:
                assert response.status_code == 200

            # A revoked token's open stream ends at its next check, not at turn.ended.
            c_sid = api_c.post("/v1/sessions", json={"agent": "builtin"}).json()["session_id"]
            c_tid = api_c.post(f"/v1/sessions/{c_sid}/turns", json={"prompt": "w"}).json()[
                "turn_id"
            ]
            revoked: list[Any] = []
            watcher = threading.Thread(
                target=_hold, args=(serve.url, c_secret, f"/v1/turns/{c_tid}/events", revoked)
            )
            watcher.start()
            wait_for(lambda: revoked[:1] == [("status", 200)], 20)
            assert harness.cli("token", "revoke", c_token).returncode == 0
            cut = time.monotonic()
            watcher.join(timeout=30)
            assert revoked[-1][0] == "ended" and revoked[-1][1] - cut < 2.5, revoked

            # Signals: at most API_MAX_SIGNAL_BYTES each, API_SIGNALS_PER_MINUTE a minute.
            _clear_of_a_minute_boundary()
            signal = f"/v1/turns/{tid}/signals/go"
            assert error_of(api_a.post(signal, json={"pad": "x" * 200}))[0] == 413
            assert api_a.post(signal, json={"n": 1}).status_code == 200
            assert api_a.post(signal, json={"n": 2}).status_code == 200
            assert error_of(api_a.post(signal, json={"n": 3}))[:2] == (429, "rate_limited")

            # Sessions: three a minute, then 429; B is untouched.
            made = [api_d.post("/v1/sessions", json={"agent": "builtin"}) for _ in range(4)]
            assert [r.status_code for r in made] == [201, 201, 201, 429]
            assert api_b.post("/v1/sessions", json={"agent": "builtin"}).status_code == 201

            # Seqs and cursors that are not this API's: 400 or 422, never a 500.
            for bad in (b"\xb2", b"9" * 5000, b"-1", b"1e3"):  # \xb2: latin-1 superscript 2
                got = api_a.get(path, headers={"Last-Event-ID": bad})
                assert error_of(got)[0] == 400, (bad, got.text)
            assert error_of(api_a.get(path, params={"after": str(10**30)}))[0] == 422
            for cursor in ('[{"a":1},"x"]', '["abc","x"]', '[true,"x"]'):
                encoded = encode_cursor(json.loads(cursor))  # a value it never gives out
                got = api_a.get("/v1/sessions", params={"cursor": encoded})
                assert error_of(got)[:2] == (400, "bad_cursor"), (cursor, got.text)
    finally:
        serve.stop()


def _clear_of_a_minute_boundary() -> None:
    """Wait until the next per-minute window has at least 10 s to run (the local World's
    clock is this machine's), so the counts below land in one window."""
    if time.time() % 60 > 50:
        time.sleep(61 - time.time() % 60)


def _token_and_id(world: Any, tenant: str) -> tuple[str, str]:
    made, secret = create_token(world, tenant)
    return made.token_id, secret
