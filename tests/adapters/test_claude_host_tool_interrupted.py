"""Claude Code's host-tool calls cut off by a dying worker (the real CLI in Docker).

A host tool runs in the worker, so a SIGKILL of the worker breaks the MCP call of the CLI,
which runs on in its container. Claude Code's own HTTP client handed the model that
broken connection (``ECONNRESET``) and the step stayed an intent in a finished turn; its
MCP server is now the stdio relay ``dh-mcp.js`` (adapters/cli/node.py), which posts the
call again to the next worker. One turn, two kills, three workers, one launch of the CLI:

1. the model calls ``charge`` (``never``); its worker is SIGKILLed (process group) while
   the tool runs: the next worker answers the relayed call with the *possibly ran*
   notice, which the model reads as the call's result;
2. the model calls ``quote_price`` (``safe``); that worker is SIGKILLed while it runs:
   the last worker runs it again and the model gets its answer, then replies.
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

from durable_harness.core.types import StepStatus
from durable_harness.harness.journal import decode_output
from durable_harness.worlds import open_world

PROMPT = "Charge order 42 and tell me the price of pro"
FINAL = "Order 42 is settled; pro costs 51."
NOTICE = "may or may not have taken effect"
_SCRIPT = f"""
[[rule]]
name = "final"
when.conversation = "PRICE-51"
reply.text = "{FINAL}"

[[rule]]
name = "quote after the notice"
when.last_tool_result = "{NOTICE}"
reply.tool_use = [ {{ name = "mcp__durable-harness__quote_price", input = {{ item = "pro" }} }} ]

[[rule]]
name = "charge"
when.last_user_text = "{PROMPT}"
reply.tool_use = [ {{ name = "mcp__durable-harness__charge", input = {{ order = "42" }} }} ]
"""


@pytest.fixture
def h(tmp_path: Path, docker_host: str) -> Iterator[Harness]:
    script = tmp_path / "script.toml"
    script.write_text(_SCRIPT)
    for h in make_harness(tmp_path, script):
        h.env["INTERRUPTED_TOOL_RUNS"] = str(tmp_path / "runs.txt")
        yield h


def _runs(h: Harness) -> list[str]:
    path = h.tmp / "runs.txt"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(600)
def test_host_tool_calls_cut_off_by_a_dying_worker(h: Harness) -> None:
    tools = f"{FIXTURES / 'interrupted_tools.py'}:TOOLS"
    queued = h.cli(
        "run", "--detach", "--agent", "claude-code", "--workspace", "docker",
        "--tools", tools, PROMPT,
    )  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    turn_id = ids_of(queued)["turn"]

    # 1. SIGKILL while `charge` (never) runs; 2. while `quote_price` (safe) runs.
    for runs in (["charge"], ["charge", "quote_price"]):
        worker = h.popen("worker")
        try:
            wait_for(lambda runs=runs: _runs(h) == runs, timeout=300, what=f"{runs[-1]} to run")
        finally:
            # SIGKILL of the worker's process group; the CLI runs on in its container.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
            worker.communicate()
    last = h.cli("worker", "--until-idle", timeout=300)
    assert last.returncode == 0, last.stderr

    shown = h.show(turn_id)
    assert shown["turn"]["status"] == "done", shown
    assert shown["turn"]["result"] == FINAL, shown["turn"]
    # The model's view of `charge` was the notice (the rule keyed on the last tool result),
    # then the quote; each request once, none repeated for a finished step.
    assert [r["rule"] for r in h.requests()] == ["charge", "quote after the notice", "final"]
    assert h.repeated_requests() == {}
    # The never tool ran once, the safe one again after its interrupted run.
    assert _runs(h) == ["charge", "quote_price", "quote_price"]
    with open_world("local", data_dir=h.tmp / "world") as world:
        steps = world.load_steps(turn_id)
        tools_ = [(s.name, s.status) for s in steps if s.kind == "tool"]
        assert tools_ == [("charge", StepStatus.POSSIBLY_RAN), ("quote_price", StepStatus.DONE)]
        charge = next(s for s in steps if s.name == "charge")
        assert NOTICE in str(decode_output(world, charge))
        # One launch: the CLI that lived through both kills, never a resumed one.
        launches = [s for s in steps if s.kind == "agent"]
        assert [s.status for s in launches] == [StepStatus.DONE], launches
