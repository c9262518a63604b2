"""Declaring approval, and the doors that cannot park on it refusing a gated call rather
than running it: a CLI agent's host tool over MCP (journal on a real local World)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from durable_harness.adapters.cli.mcp import HostToolServer
from durable_harness.core.errors import ToolDefinitionError
from durable_harness.harness.approval import needs_approval
from durable_harness.harness.journal import Journal
from durable_harness.harness.tools import Tool, coerce_tool, tool
from durable_harness.worlds.local import LocalWorld


class Refund(BaseModel):
    order: int
    amount: int


RUNS: list[int] = []


@tool(replay="never", approval=lambda a: a.amount > 100)
def refund(args: Refund) -> str:
    RUNS.append(args.order)
    return f"refunded {args.order}"


def test_declaring_approval() -> None:
    with pytest.raises(ToolDefinitionError, match="approval must be 'required' or a function"):
        tool(replay="never", approval="sometimes")(refund.fn)
    assert needs_approval(refund, {"order": 1, "amount": 250})
    assert not needs_approval(refund, {"order": 1, "amount": 20})
    assert not needs_approval(refund, {"order": "x"})  # the tool refuses it unrun
    broken = Tool("r", "r", Refund, "never", refund.fn, approval=lambda a: 1 / 0)
    assert needs_approval(broken, {"order": 1, "amount": 1})  # a failing rule gates
    always = coerce_tool(
        {"name": "d", "replay": "never", "fn": print, "approval": "required"}, "test"
    )
    assert needs_approval(always, {}) and not needs_approval(
        coerce_tool({"name": "e", "replay": "safe", "fn": print}, "test"), {}
    )


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with LocalWorld(tmp_path) as world:
        world.create_session("s")
        world.create_turn("s", "t", "prompt", {"agent": "claude-code"})
        lease = world.claim_turn("t", "w", 30, force=True)
        assert lease is not None
        yield Journal(world, lease)


def test_a_cli_host_tool_call_that_needs_approval_is_refused_not_run(journal: Journal) -> None:
    RUNS.clear()
    server = HostToolServer(journal, [refund], "s")

    def call(order: int, amount: int, use: str) -> dict[str, object]:
        meta = {"claudecode/toolUseId": use}
        args = {"order": order, "amount": amount}
        return server.call({"name": "refund", "arguments": args, "_meta": meta})

    gated = call(7, 250, "toolu_7")
    assert gated["isError"] is True
    assert "needs a human's approval" in str(gated["content"])
    assert call(1, 20, "toolu_1")["isError"] is False
    assert RUNS == [1]  # order 7 never ran
    assert [s.name for s in journal.world.load_steps("t")] == ["refund"]  # only order 1's
