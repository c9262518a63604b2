"""`durable-harness serve` as a subprocess on the local World: what it refuses, and what
one tenant can reach of another's (nothing: each a 404, the same as an unknown id)."""

from __future__ import annotations

import hashlib
import hmac
import json

from serve_cases import error_of, token, world_of
from support import Harness, start_serve

HOOK_SECRET = "github-hook-secret-for-the-test"
ROUTES = {
    "/v1/sessions": {"get", "post"},
    "/v1/sessions/{session_id}": {"get"},
    "/v1/sessions/{session_id}/turns": {"get", "post"},
    "/v1/turns": {"get"},
    "/v1/turns/{turn_id}": {"get"},
    "/v1/turns/{turn_id}/cancel": {"post"},
    "/v1/turns/{turn_id}/fork": {"post"},
    "/v1/turns/{turn_id}/events": {"get"},
    "/v1/turns/{turn_id}/steps": {"get"},
    "/v1/turns/{turn_id}/steps/{seq}": {"get"},
    "/v1/turns/{turn_id}/steps/{seq}/approval": {"post"},
    "/v1/turns/{turn_id}/signals/{name}": {"post"},
    "/v1/webhooks/{provider}": {"post"},
}


def test_bad_input_is_a_json_error_and_records_nothing(harness: Harness) -> None:
    """Malformed JSON, unknown agent, unregistered tool, unknown field, oversized body,
    unknown session, blank prompt, bad cursor, unknown route; no token, a malformed one,
    a revoked one: each its status and the API's error shape; the World holds no session
    or turn afterwards. The OpenAPI document lists every route; `token` prints no secret
    in `list`."""
    made = harness.cli("token", "create", "--tenant", "acme", "--label", "ci")
    assert made.returncode == 0, made.stderr
    acme = made.stdout.strip()
    assert acme.startswith("dh_") and "shown once" in made.stderr
    serve = start_serve(
        harness,
        DURABLE_HARNESS_API_MAX_BODY_BYTES="4096",
        DURABLE_HARNESS_GITHUB_WEBHOOK_SECRET=HOOK_SECRET,
        DOCKER_HOST=f"unix://{harness.tmp / 'no-docker.sock'}",  # this serve has no Docker
    )
    try:
        with serve.http() as anon, serve.http(acme) as api:
            spec = anon.get("/openapi.json").json()
            assert {p: set(ops) for p, ops in spec["paths"].items()} == ROUTES
            assert "CreateSession" in spec["components"]["schemas"]

            post = "/v1/sessions"
            body = {"agent": "builtin"}
            assert error_of(anon.post(post, json=body))[:2] == (401, "unauthorized")
            for bad in ("Bearer dh_nope", "Bearer dh_0123456789abcdef_" + "x" * 40, "Basic x"):
                response = anon.post(post, json=body, headers={"Authorization": bad})
                assert error_of(response)[0] == 401
            # A header that is not ASCII is a wrong token, never a 500.
            response = anon.post(post, json=body, headers={"Authorization": b"Bearer dh_\xff"})
            assert error_of(response)[0] == 401

            cases = [
                (b"{not json", 400, "malformed_json", "not JSON"),
                (b'{"agent": "gpt-builder"}', 422, "unknown_agent", "builtin, claude-code"),
                (b'{"agent": "builtin", "tools": ["rm-rf"]}', 422, "unknown_tools", "demo"),
                (b'{"agent": "builtin", "tools": ["/tmp/x.py:TOOLS"]}', 422, "unknown_tools", ""),
                (b'{"agent": "builtin", "base_url": "http://evil"}', 422, "invalid_request", ""),
                (b'{"agent": "builtin", "workspace": "/etc"}', 422, "workspace_not_offered", ""),
                (b'{"agent": "custom"}', 422, "unknown_agent", ""),
                (b'{"agent": "builtin", "repo": "/"}', 422, "repo_not_allowed", ""),
                (b"[1, 2]", 422, "invalid_request", ""),
                # The session's check needs Docker, which this serve cannot reach: the
                # operator's to fix, in the API's shape.
                (b'{"agent": "builtin", "workspace": "docker"}', 503, "unavailable", "Docker"),
            ]
            for raw, status, code, needle in cases:
                response = api.post(post, content=raw, headers={"content-type": "application/json"})
                got = error_of(response)
                assert got[:2] == (status, code), (raw, got)
                assert needle in got[2], (raw, got)

            big = json.dumps({"agent": "builtin", "pad": "x" * 8000}).encode()
            got = error_of(api.post(post, content=big))
            assert got[:2] == (413, "body_too_large"), got

            turn_post = "/v1/sessions/ses_missing/turns"
            assert error_of(api.post(turn_post, json={"prompt": "hi"}))[:2] == (
                404,
                "session_not_found",
            )
            assert error_of(api.get("/v1/turns/turn_missing"))[0] == 404
            assert error_of(api.get("/v1/turns/turn_missing/events"))[0] == 404
            assert error_of(api.get("/v1/sessions", params={"cursor": "%%%"}))[0] == 400
            assert error_of(api.get("/v1/nowhere"))[:2] == (404, "not_found")

            # signal-server's webhooks, on serve: the provider's proof first.
            ping = b'{"zen": "hi"}'
            signed = "sha256=" + hmac.new(HOOK_SECRET.encode(), ping, hashlib.sha256).hexdigest()
            hook = "/v1/webhooks/github"
            headers = {"X-GitHub-Event": "ping", "X-Hub-Signature-256": signed}
            assert anon.post(hook, content=ping, headers=headers).status_code == 202
            headers["X-Hub-Signature-256"] = "sha256=" + "0" * 64
            assert error_of(anon.post(hook, content=ping, headers=headers))[0] == 401
            assert error_of(anon.post("/v1/webhooks/gitlab", content=ping))[0] == 404

            session = api.post(post, json={"agent": "builtin", "tools": ["demo"]})
            assert session.status_code == 201, session.text
            sid = session.json()["session_id"]
            assert session.json()["tools"] == ["demo"] and session.json()["tenant"] == "acme"
            blank = api.post(f"/v1/sessions/{sid}/turns", json={"prompt": "   "})
            assert error_of(blank)[:2] == (422, "empty_prompt")
            missing = api.post(f"/v1/sessions/{sid}/turns", json={})
            assert error_of(missing)[0] == 422

            with world_of(harness) as world:
                assert [s.session_id for s in world.list_sessions()] == [sid]
                assert world.list_turns() == []

            listed = harness.cli("token", "list", "--json")
            rows = json.loads(listed.stdout)
            assert [(r["tenant"], r["label"], r["revoked_at"]) for r in rows] == [
                ("acme", "ci", None)
            ]
            assert acme.rsplit("_", 1)[1] not in listed.stdout
            revoked = harness.cli("token", "revoke", rows[0]["token_id"])
            assert revoked.returncode == 0, revoked.stderr
            assert error_of(api.get("/v1/sessions"))[0] == 401
    finally:
        serve.stop()


def test_a_tenant_reaches_nothing_of_another(harness: Harness) -> None:
    """Tenant B cannot read, list, stream, signal, cancel or post to tenant A's sessions
    and turns: each is the 404 of an unknown id. A's own calls work (its quiet stream gets
    heartbeats); the turn's signal
    secret still works (signal-server's route); paging walks A's sessions once each; an
    operator token sees both tenants."""
    with world_of(harness) as world:
        a, b = token(world, "tenant-a"), token(world, "tenant-b")
        op = token(world, "ops", operator=True)
    serve = start_serve(harness, DURABLE_HARNESS_API_HEARTBEAT_S="0.3")
    try:
        with serve.http(a) as api_a, serve.http(b) as api_b, serve.http(op) as api_op:
            sids = [
                api_a.post("/v1/sessions", json={"agent": "builtin"}).json()["session_id"]
                for _ in range(3)
            ]
            b_sid = api_b.post("/v1/sessions", json={"agent": "builtin"}).json()["session_id"]
            started = api_a.post(f"/v1/sessions/{sids[0]}/turns", json={"prompt": "count to three"})
            assert started.status_code == 202, started.text
            tid = started.json()["turn_id"]
            assert started.json()["status"] == "queued"

            denied = [
                api_b.get(f"/v1/sessions/{sids[0]}"),
                api_b.get(f"/v1/sessions/{sids[0]}/turns"),
                api_b.post(f"/v1/sessions/{sids[0]}/turns", json={"prompt": "mine now"}),
                api_b.get(f"/v1/turns/{tid}"),
                api_b.get(f"/v1/turns/{tid}/events"),
                api_b.post(f"/v1/turns/{tid}/signals/go", json={"ok": True}),
                api_b.post(f"/v1/turns/{tid}/cancel", json={}),
                api_b.post(f"/v1/turns/{tid}/fork", json={"at": 0}),
            ]
            for response in denied:
                status, _code, message = error_of(response)
                assert status == 404, response.text
                assert "no session" in message or "no turn" in message
            # Another tenant's id answers exactly as an unknown one does.
            unknown = error_of(api_b.get("/v1/turns/turn_00000000000000000000"))
            theirs = error_of(api_b.get(f"/v1/turns/{tid}"))
            assert unknown[:2] == theirs[:2] == (404, "turn_not_found")
            assert unknown[2].replace("turn_00000000000000000000", tid) == theirs[2]
            listed_b = api_b.get("/v1/sessions").json()["sessions"]
            assert [s["session_id"] for s in listed_b] == [b_sid]
            assert api_b.get("/v1/turns").json()["turns"] == []

            seen: list[str] = []
            cursor = None
            pages = 0
            while True:
                pages += 1
                params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
                page = api_a.get("/v1/sessions", params=params).json()
                seen += [s["session_id"] for s in page["sessions"]]
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            assert sorted(seen) == sorted(sids) and len(seen) == 3 and pages == 2

            # A's own stream of the queued turn: its first event, then heartbeats.
            with api_a.stream("GET", f"/v1/turns/{tid}/events") as stream:
                lines = []
                for line in stream.iter_lines():
                    lines.append(line)
                    if sum(x.startswith(":") for x in lines) >= 2:
                        break
            assert "id: 1" in lines and "event: turn.created" in lines, lines

            turn = api_a.get(f"/v1/turns/{tid}").json()
            assert (turn["status"], turn["prompt"], turn["steps"]) == (
                "queued",
                "count to three",
                0,
            )
            turns = api_a.get(f"/v1/sessions/{sids[0]}/turns").json()["turns"]
            assert [t["turn_id"] for t in turns] == [tid]

            signal = api_a.post(f"/v1/turns/{tid}/signals/go", json={"ok": True})
            assert (signal.status_code, signal.json()["new"]) == (200, True), signal.text
            again = api_a.post(f"/v1/turns/{tid}/signals/go", json={"ok": True})
            assert (again.status_code, again.json()["new"]) == (208, False)
            reserved = api_a.post(f"/v1/turns/{tid}/signals/dh.cancel", json="x")
            assert error_of(reserved)[:2] == (422, "bad_signal_name")
            with world_of(harness) as world:
                secret = world.get_turn(tid).config["signal_secret"]
                by_secret = serve.http(secret).post(f"/v1/turns/{tid}/signals/ci", json=1)
                assert by_secret.status_code == 200, by_secret.text
                wrong = serve.http("not-the-secret").post(f"/v1/turns/{tid}/signals/ci", json=2)
                assert error_of(wrong)[0] == 401
                assert [s.payload for s in world.list_signals(tid, "go")] == ['{"ok": true}']
                assert [s.payload for s in world.list_signals(tid, "ci")] == ["1"]

            every = {s["session_id"] for s in api_op.get("/v1/sessions").json()["sessions"]}
            assert every == {*sids, b_sid}
            assert api_op.get(f"/v1/turns/{tid}").status_code == 200
            assert [t["turn_id"] for t in api_op.get("/v1/turns").json()["turns"]] == [tid]
            assert [t["turn_id"] for t in api_a.get("/v1/turns").json()["turns"]] == [tid]

            cancel = api_a.post(f"/v1/turns/{tid}/cancel", json={"reason": "changed my mind"})
            assert cancel.status_code == 202 and cancel.json()["requested"] is True, cancel.text
            with world_of(harness) as world:
                assert world.list_signals(tid, "dh.cancel"), "the cancel signal is recorded"
    finally:
        serve.stop()
