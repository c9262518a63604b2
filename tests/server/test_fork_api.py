"""``POST /v1/turns/{id}/fork`` on a real ``serve`` (the local World) with the Python
client: a tenant forks its own finished turn into a session of its own, which a worker
runs; another tenant's fork of it is the 404 of an unknown turn; bad cuts are 422 and
record nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_cases import error_of, token, world_of
from support import FIXTURES, Harness, make_harness, start_serve

from durable_harness.client import ApiError, Client

PROMPT = "Write a.txt, then b.txt."
NEW_PROMPT = "Instead of b.txt, write c.txt."


@pytest.fixture
def fork_harness(tmp_path: Path) -> Iterator[Harness]:
    yield from make_harness(tmp_path, FIXTURES / "fork.toml")


def test_a_tenant_forks_its_own_turn(fork_harness: Harness) -> None:
    h = fork_harness
    with world_of(h) as world:
        a, b = token(world, "tenant-a"), token(world, "tenant-b")
    serve = start_serve(h)
    try:
        with Client(serve.url, a) as api_a, Client(serve.url, b) as api_b:
            session = api_a.create_session("builtin")
            started = api_a.start_turn(session.session_id, PROMPT)
            assert h.cli("worker", "--until-idle").returncode == 0
            assert api_a.get_turn(started.turn_id).reply == "a.txt and b.txt are written."
            calls = len(h.requests())

            with pytest.raises(ApiError) as denied:
                api_b.fork(started.turn_id, 3, NEW_PROMPT)
            assert (denied.value.status, denied.value.code) == (404, "turn_not_found")
            for at, prompt, says in [(9, NEW_PROMPT, "has steps 0..4"), (2, "  ", "blank")]:
                with pytest.raises(ApiError) as bad:
                    api_a.fork(started.turn_id, at, prompt)
                assert bad.value.status == 422 and says in bad.value.message
            with serve.http(a) as raw:
                status, _code, _message = error_of(
                    raw.post(f"/v1/turns/{started.turn_id}/fork", json={"at": -1})
                )
                assert status == 422
            assert [s.session_id for s in api_a.list_sessions().items] == [session.session_id]

            forked = api_a.fork(started.turn_id, 3, NEW_PROMPT)
            assert forked.session_id != session.session_id and forked.status == "queued"
            assert h.cli("worker", "--until-idle").returncode == 0
            done = api_a.get_turn(forked.turn_id)
            assert (done.status, done.reply, done.steps) == (
                "done",
                "c.txt is written instead of b.txt.",
                3,
            )
            assert len(h.requests()) == calls + 2  # the kept steps were not asked again
            mine = {s.session_id: s for s in api_a.list_sessions().items}
            assert set(mine) == {session.session_id, forked.session_id}
            assert mine[forked.session_id].tenant == "tenant-a"
            assert mine[forked.session_id].workspace == mine[session.session_id].workspace
            assert api_b.list_sessions().items == []
            # The fork's session takes turns as any other (its history is the fork's).
            later = api_a.start_turn(forked.session_id, "Which files did you write?")
            assert h.cli("worker", "--until-idle").returncode == 0
            assert api_a.get_turn(later.turn_id).reply == "a.txt and b.txt."
    finally:
        serve.stop()
