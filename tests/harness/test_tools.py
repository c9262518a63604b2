"""Tool declarations: the replay label is required, loading errors name what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from durable_harness.core.errors import ToolDefinitionError
from durable_harness.harness.tools import Tool, ToolContext, ToolRegistry, load_tools, tool


class Args(BaseModel):
    n: int


def test_decorator_infers_schema_and_description() -> None:
    @tool(replay="never")
    def send(args: Args, ctx: ToolContext) -> str:
        """Send n emails."""
        return f"{args.n} {ctx.idempotency_key}"

    assert send.name == "send" and send.description == "Send n emails."
    assert send.anthropic_spec()["input_schema"]["properties"]["n"]["type"] == "integer"
    assert send.invoke({"n": 2}, ToolContext("turn", "ses", 7)) == "2 turn:7"


@pytest.mark.parametrize("label", [None, "", "maybe", "SAFE"])
def test_replay_label_is_required(label: object) -> None:
    with pytest.raises(ToolDefinitionError, match=r"'send'.*replay"):
        Tool("send", "d", Args, label, lambda a: a)  # type: ignore[arg-type]


def test_registry_refuses_duplicates() -> None:
    t = Tool("a", "d", Args, "safe", lambda a: a)
    with pytest.raises(ToolDefinitionError, match="twice"):
        ToolRegistry([t, t])


def test_load_tools_errors(tmp_path: Path) -> None:
    f = tmp_path / "t.py"
    f.write_text(
        "from durable_harness.harness.tools import tool\n"
        "def plain(args): return 1\n"
        "PLAIN = [plain]\n"
        "UNLABELLED = [{'name': 'mail', 'fn': plain}]\n"
        "OK = [{'name': 'mail', 'fn': plain, 'replay': 'never'}]\n"
    )
    with pytest.raises(ToolDefinitionError, match="'plain' is not a tool"):
        load_tools(f"{f}:PLAIN")
    with pytest.raises(ToolDefinitionError, match="'mail' has no valid replay label"):
        load_tools(f"{f}:UNLABELLED")
    with pytest.raises(ToolDefinitionError, match="defines no 'NOPE'"):
        load_tools(f"{f}:NOPE")
    with pytest.raises(ToolDefinitionError, match=r"expected path/to/file\.py:NAME"):
        load_tools(str(f))
    (ok,) = load_tools(f"{f}:OK")
    assert ok.replay == "never"
