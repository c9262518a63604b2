"""OpenCode in the Docker sandbox: the real CLI 1.18.33 in the session's container,
against the fake model, through the proxy's unix socket and the in-container bridge.

The kill matrix with OpenCode in Docker is ``test_opencode_kill_matrix.py``
(parametrized ``docker``); this file has the plain two-tool turn (and the host tool over
MCP), the session's next turn after its container was lost, replay, and the container
lost in the middle of a turn.
"""

from __future__ import annotations

from pathlib import Path

from claude_cases import (
    bash_runs,
    container_text,
    dump,
    model_keys,
    notify_runs,
    tool_rows,
    upstream_keys,
    wait_for,
)
from opencode_cases import (
    FINAL,
    SECOND_PROMPT,
    SECOND_REPLY,
    TOOLS,
    opencode_harness,
    run_args,
)
from support import ids_of

from durable_harness.sandbox.docker import DockerSandbox


def test_turn_in_docker(tmp_path: Path, docker_host: str) -> None:
    for h in opencode_harness(tmp_path, notify=True, where="docker"):
        out = h.cli(*run_args(h, "--tools", TOOLS), timeout=300)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == FINAL
        ids = ids_of(out)
        show = h.show(ids["turn"])
        rows = [("bash", "done"), ("write", "done"), ("notify", "done")]
        assert tool_rows(show) == rows, dump(show)
        session = ids["session"]
        assert bash_runs(h, session) == 1 and notify_runs(h) == 1
        assert container_text(session, "/workspace/site/pricing.html") == "<h1>Pricing</h1>\n"
        assert h.repeated_requests() == {}

        # The session's next turn continues OpenCode's session (its database, from the
        # World); the container was lost between the turns, so a new one gets the
        # workspace back from the World too.
        _remove(session)
        second = h.cli(
            *run_args(h, "--tools", TOOLS, "--session", session, prompt=SECOND_PROMPT),
            timeout=300,
        )
        assert second.returncode == 0, second.stderr
        assert second.stdout.strip().splitlines()[-1] == SECOND_REPLY
        assert container_text(session, "/workspace/site/pricing.html") == "<h1>Pricing</h1>\n"

        # A finished turn replays in the container with 0 upstream calls and no tool run.
        calls = len(h.requests())
        replay = h.cli("replay", ids["turn"], timeout=300)
        assert replay.returncode == 0, replay.stderr
        assert replay.stdout.strip() == FINAL and len(h.requests()) == calls
        assert bash_runs(h, session) == 1 and notify_runs(h) == 1


def test_container_lost_mid_turn(tmp_path: Path, docker_host: str) -> None:
    """The container (and its volumes) vanish while the final reply streams: the next
    delivery makes a new container, restores the workspace from the journal's snapshot
    and OpenCode's database from the World, resumes OpenCode and finishes; nothing runs
    twice."""
    for h in opencode_harness(tmp_path, notify=True, where="docker", final_delay_ms=300):
        proc = h.popen(*run_args(h, "--tools", TOOLS))
        assert proc.stdout is not None
        session = proc.stdout.readline().split()[1]
        turn_id = proc.stdout.readline().split()[1]
        final_asked = lambda h=h: any(r["rule"] == "final" for r in h.requests())  # noqa: E731
        wait_for(final_asked, 120, what="the final reply")
        _remove(session)
        proc.communicate(timeout=120)  # the delivery is released: the sandbox is gone
        before = h.show(turn_id)
        done_before = set(model_keys(before, "done"))
        calls_before = len(h.requests())

        resumed = h.cli("resume", turn_id, timeout=300)
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip().splitlines()[-1] == FINAL
        after = h.show(turn_id)
        assert [s["kind"] for s in after["steps"]].count("agent") == 2, dump(after)
        repeated = [k for k in upstream_keys(h, since=calls_before) if k in done_before]
        assert repeated == [], dump(after)
        # The new container holds the workspace the tools made, restored, not made again.
        assert bash_runs(h, session) == 1 and notify_runs(h) == 1
        assert container_text(session, "/workspace/site/index.html") == "PRICING-42\n"
        assert container_text(session, "/workspace/site/pricing.html") == "<h1>Pricing</h1>\n"
        assert tool_rows(after) == [("bash", "done"), ("write", "done"), ("notify", "done")]


def _remove(session: str) -> None:
    box = DockerSandbox(session)
    try:
        box.remove()
    finally:
        box.close()
