"""Codex in the Docker sandbox: the real CLI 0.171.0 in the session's container, against the
fake model, through the proxy's unix socket and the in-container bridge.

The kill matrix with Codex in Docker is ``test_codex_kill_matrix.py`` (parametrized
``docker``); this file has the two-tool turn with a second turn and a replay, the
container lost mid-turn, and the provider key's absence from the container.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import container_text, dump, model_keys, tool_rows, upstream_keys, wait_for
from codex_cases import (
    FINAL,
    SECOND_PROMPT,
    SECOND_REPLY,
    bash_runs,
    codex_harness,
    run_args,
    write_runs,
)
from support import Harness, ids_of
from test_claude_docker import _container_id, _remove_sandbox

from durable_harness.sandbox.docker import DockerSandbox


@pytest.fixture
def h(tmp_path: Path, docker_host: str) -> Iterator[Harness]:
    yield from codex_harness(tmp_path, where="docker")


def test_two_tool_turn_then_a_second_turn_in_docker(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    ids = ids_of(out)
    session = ids["session"]
    show = h.show(ids["turn"])
    assert tool_rows(show) == [("Bash", "done"), ("Bash", "done")], dump(show)
    assert len(model_keys(show, "done")) == 3
    assert bash_runs(h, session) == 1 and write_runs(h, session) == 1
    assert container_text(session, "/workspace/site/pricing.html") == "<h1>Pricing</h1>\n"
    assert sorted(upstream_keys(h)) == sorted(model_keys(show))

    # The session's next turn resumes the thread's rollout in the same container.
    second = h.cli(*run_args(h, "--session", session, prompt=SECOND_PROMPT))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == SECOND_REPLY
    assert bash_runs(h, session) == 1 and write_runs(h, session) == 1

    # A finished turn replays in the container with 0 upstream calls and no tool run.
    calls = len(h.requests())
    replay = h.cli("replay", ids["turn"])
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == FINAL and len(h.requests()) == calls
    assert bash_runs(h, session) == 1 and write_runs(h, session) == 1


def test_container_lost_mid_turn(tmp_path: Path, docker_host: str) -> None:
    """The container vanishes while the final reply streams: the next delivery makes a new
    container, restores the workspace and the rollout from the World, resumes Codex and
    finishes; no command runs again and no recorded model call is paid again."""
    for h in codex_harness(tmp_path, where="docker", final_delay_ms=300):
        proc = h.popen(*run_args(h))
        assert proc.stdout is not None
        session = proc.stdout.readline().split()[1]
        turn_id = proc.stdout.readline().split()[1]
        final_asked = lambda h=h: any(r["rule"] == "final" for r in h.requests())  # noqa: E731
        wait_for(final_asked, what="the final reply")
        first = _container_id(session)
        _remove_sandbox(session)
        proc.communicate(timeout=120)  # the delivery is released: the sandbox is gone
        before = h.show(turn_id)
        done_before = set(model_keys(before, "done"))
        calls_before = len(h.requests())

        resumed = h.cli("resume", turn_id)
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip().splitlines()[-1] == FINAL
        after = h.show(turn_id)
        assert _container_id(session) != first
        assert [s["kind"] for s in after["steps"]].count("agent") == 2, dump(after)
        repeated = [k for k in upstream_keys(h, since=calls_before) if k in done_before]
        assert repeated == [], dump(after)
        assert bash_runs(h, session) == 1 and write_runs(h, session) == 1
        assert container_text(session, "/workspace/site/index.html") == "PRICING-42\n"
        assert container_text(session, "/workspace/site/pricing.html") == "<h1>Pricing</h1>\n"
        assert tool_rows(after) == [("Bash", "done"), ("Bash", "done")], dump(after)


def test_provider_key_never_enters_the_container(tmp_path: Path, docker_host: str) -> None:
    """While Codex runs in the container (its first command sleeping), no process
    environment and no file there holds the provider key; Codex holds the proxy token."""
    secret = "sk-proj-test-" + "K3Y" * 8
    for h in codex_harness(tmp_path, where="docker", sleep=6):
        h.env["OPENAI_API_KEY"] = secret
        proc = h.popen(*run_args(h))
        assert proc.stdout is not None
        session = proc.stdout.readline().split()[1]
        running = lambda h=h, s=session: bash_runs(h, s) == 1  # noqa: E731
        wait_for(running, what="the first command")
        box = DockerSandbox(session)
        try:
            scan = box.exec(
                "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' > /tmp/envs; "
                'echo "tokens=$(grep -c "^DURABLE_HARNESS_CODEX_TOKEN=" /tmp/envs)"; '
                'echo "keys=$(grep -c "^OPENAI_API_KEY=" /tmp/envs)"; '
                'echo "secret=$(grep -c -F "$1" /tmp/envs)"; '
                'echo "files=$(grep -rlF "$1" /workspace /home/agent /tmp 2>/dev/null'
                ' | grep -v "^/tmp/envs$" | wc -l)"; rm -f /tmp/envs',
                secret,
            )
        finally:
            box.close()
        found = dict(line.split("=", 1) for line in scan.stdout.decode().split())
        assert int(found["tokens"]) >= 1, found  # Codex is there, with the proxy's token
        assert found["keys"] == "0", found
        assert found["secret"] == "0" and found["files"] == "0", found
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip().splitlines()[-1] == FINAL
