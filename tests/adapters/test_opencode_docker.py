"""OpenCode in the Docker sandbox: the real CLI 1.18.33 in the session's container,
against the fake model, through the proxy's unix socket and the in-container bridge.

The kill matrix with OpenCode in Docker is ``test_opencode_kill_matrix.py``
(parametrized ``docker``); this file has the plain two-tool turn (and the host tool over
MCP), the session's next turn after its container was lost, and replay.
"""

from __future__ import annotations

from pathlib import Path

from claude_cases import bash_runs, container_text, dump, notify_runs, tool_rows
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
        box = DockerSandbox(session)
        try:
            box.remove()
        finally:
            box.close()
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
