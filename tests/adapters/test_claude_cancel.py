# ruff: noqa: E501  (the fake model script below keeps one rule per line)
"""Cancelling a Claude Code turn in Docker while it runs: the real CLI in the session's
container runs a Bash call, then waits on a model reply that does not come; the turn is
cancelled through the HTTP API (``POST /v1/turns/{id}/cancel`` of a real ``serve``, with an
operator token: the turn was started by ``run``, not by a tenant). The CLI and what it started are killed, the turn
ends ``cancelled`` with the finished Bash step in its journal, and the session's next
turn continues from it: its model request holds the Bash call's result.

The built-in agent's cancels (queued, waiting, running) are tests/runtime/test_cancel.py.
"""

from __future__ import annotations

import time
from pathlib import Path

from claude_cases import AGENT_CONFIG, dump, tool_rows, wait_for
from support import make_harness, start_serve

from durable_harness.client import Client
from durable_harness.sandbox.docker import DockerSandbox
from durable_harness.server.auth import create_token
from durable_harness.worlds import open_world

PROMPT = "print the marker"
LATER_PROMPT = "continue please"
LATER_REPLY = "Continued from the marker."

# The marker is computed by the shell, so it reaches the conversation only as the Bash
# call's result; a request holding it holds that result.
SCRIPT = f"""
[[rule]]
name = "later"
when.last_user_text = "{LATER_PROMPT}"
when.conversation = "CANCEL-42"
reply.text = "{LATER_REPLY}"

[[rule]]
name = "stall"
when.conversation = "CANCEL-42"
reply.delay_ms = 600000
reply.text = "never sent"

[[rule]]
name = "bash"
when.last_user_text = "{PROMPT}"
reply.tool_use = [ {{ name = "Bash", input = {{ command = "echo CANCEL-$((40+2))", description = "print the marker" }} }} ]
"""

#: From the cancel request to the turn ended and the CLI gone: the worker looks once a
#: second (DURABLE_HARNESS_CANCEL_POLL_SECONDS), kills the job, saves the transcript.
BOUND_S = 20.0


def test_cancel_a_running_claude_code_turn_in_docker(tmp_path: Path, docker_host: str) -> None:
    script = tmp_path / "script.toml"
    script.write_text(SCRIPT)
    for h in make_harness(tmp_path, script, lease="5"):
        args = ["run", "--agent", "claude-code", "--workspace", "docker"]
        args += ["--agent-config", str(AGENT_CONFIG)]
        proc = h.popen(*args, PROMPT)
        assert proc.stdout is not None
        session = proc.stdout.readline().split()[1]
        turn_id = proc.stdout.readline().split()[1]
        stalled = lambda h=h: any(r["rule"] == "stall" for r in h.requests())  # noqa: E731
        wait_for(stalled, timeout=180, what="the model request after the Bash call")
        assert _claude_processes(session), "the CLI should be running in the container"

        with open_world("local", data_dir=h.env["DURABLE_HARNESS_DATA_DIR"]) as world:
            secret = create_token(world, "ops", operator=True)[1]
        serve = start_serve(h)
        try:
            with Client(serve.url, secret) as client:
                asked = time.monotonic()
                assert client.cancel(turn_id, "user pressed stop")
                wait_for(
                    lambda c=client, t=turn_id: c.get_turn(t).status == "cancelled",
                    timeout=BOUND_S,
                    what="the turn to end cancelled",
                )
                took = time.monotonic() - asked
        finally:
            serve.stop()
        _, err = proc.communicate(timeout=BOUND_S)
        assert proc.returncode == 1 and "was cancelled: user pressed stop" in err, err
        assert _claude_processes(session) == [], "the CLI outlived its cancelled turn"
        assert took < BOUND_S, took

        show = h.show(turn_id)
        assert show["turn"]["status"] == "cancelled", dump(show)
        assert tool_rows(show) == [("Bash", "done")], dump(show)
        launches = [s["status"] for s in show["steps"] if s["kind"] == "agent"]
        assert launches == ["intent"], dump(show)  # stopped: the launch has no outcome

        # The session's next turn resumes the cancelled turn's transcript.
        later = h.cli(*args, "--session", session, LATER_PROMPT, timeout=300)
        assert later.returncode == 0, later.stderr
        assert later.stdout.strip().splitlines()[-1] == LATER_REPLY
        assert [r["rule"] for r in h.requests()] == ["bash", "stall", "later"]


def _claude_processes(session: str) -> list[str]:
    """The command lines of the container's processes that are Claude Code's."""
    box = DockerSandbox(session)
    try:
        listing = box.exec(
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < \"$p/cmdline\" 2>/dev/null; echo; done"
        )
    finally:
        box.close()
    return [line for line in listing.stdout.decode().splitlines() if "claude" in line]
