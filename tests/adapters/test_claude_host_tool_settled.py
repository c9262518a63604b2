"""A Claude Code host tool with a check, cut off by a dying worker (issue 18: "for CLI
agents, host tools get the same"). ``charge`` (``never``) records its run, with the step's
idempotency key, before it holds its worker; its check finds that record. The worker is
SIGKILLed (process group) while the call is in flight; the next worker settles the call
*done* with the check's result, so the model reads ``charged order 42``, never the
*possibly ran* notice, and the charge does not run again. Two paths:

* ``docker``: the CLI lives on in its container and its MCP relay posts the call again to
  the next worker, which answers it from the check;
* ``host`` (the developer opt-in): the CLI dies with the worker; the next worker settles
  the interrupted step before it resumes the CLI, whose resume message quotes the result.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import FIXTURES, wait_for
from support import Harness, ids_of, make_harness

from durable_harness.adapters.cli.host import UNSAFE_HOST_ENV

PROMPT = "Charge order 42"
FINAL = "Order 42 is charged, once."
_SCRIPT = f"""
[[rule]]
name = "final"
when.conversation = "charged order 42"
reply.text = "{FINAL}"

[[rule]]
name = "charge"
when.last_user_text = "{PROMPT}"
reply.tool_use = [ {{ name = "mcp__durable-harness__charge", input = {{ order = "42" }} }} ]
"""
TOOLS = f"{FIXTURES / 'interrupted_tools.py'}:TOOLS_CHECKED"


@pytest.fixture(params=["docker", "host"])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "docker":
        request.getfixturevalue("docker_host")
    script = tmp_path / "script.toml"
    script.write_text(_SCRIPT)
    for h in make_harness(tmp_path, script):
        h.env["INTERRUPTED_TOOL_RUNS"] = str(tmp_path / "runs.txt")
        if request.param == "host":
            (tmp_path / "ws").mkdir()
            h.env[UNSAFE_HOST_ENV] = "1"
            h.env["DH_TEST_WORKSPACE"] = str(tmp_path / "ws")
        else:
            h.env["DH_TEST_WORKSPACE"] = "docker"
        yield h


def _runs(h: Harness) -> list[str]:
    path = h.tmp / "runs.txt"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(600)
def test_a_checked_host_tool_cut_off_is_settled_with_its_result(h: Harness) -> None:
    queued = h.cli(
        "run", "--detach", "--agent", "claude-code", "--workspace", h.env["DH_TEST_WORKSPACE"],
        "--tools", TOOLS, PROMPT,
    )  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    turn_id = ids_of(queued)["turn"]
    worker = h.popen("worker")
    try:
        wait_for(lambda: _runs(h) == ["charge"], timeout=300, what="charge to run")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.communicate()
    last = h.cli("worker", "--until-idle", timeout=300)
    assert last.returncode == 0, last.stderr

    shown = h.show(turn_id)
    assert shown["turn"]["status"] == "done", shown
    assert shown["turn"]["result"] == FINAL, shown["turn"]
    (charge,) = [s for s in shown["steps"] if s["name"] == "charge"]
    assert (charge["status"], charge["settled"]) == ("done", "done"), charge
    assert _runs(h) == ["charge"]  # not run again
    # The model read the check's result: the final rule matched on it, and no request
    # carried the possibly-ran notice.
    assert [r["rule"] for r in h.requests()] == ["charge", "final"]
    assert h.repeated_requests() == {}
