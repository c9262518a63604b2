"""Tool declarations: the replay label is required, loading errors name what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from durable_harness.core.errors import ToolDefinitionError
from durable_harness.harness.tools import (
    ABSENT,
    Tool,
    ToolContext,
    ToolRegistry,
    coerce_tool,
    done,
    load_tools,
    tool,
)


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


def test_a_check_is_declared_on_a_never_tool_and_answers_in_its_terms() -> None:
    def check(args: Args, ctx: ToolContext) -> object:
        return done(f"sent {args.n} ({ctx.idempotency_key})") if args.n else ABSENT

    @tool(replay="never", check=check, idempotent=True)  # type: ignore[arg-type]
    def send(args: Args) -> None:
        """Send n emails."""

    ctx = ToolContext("turn", "ses", 3)
    assert send.settle({"n": 2}, ctx) == done("sent 2 (turn:3)")
    assert send.settle({"n": 0}, ctx) is ABSENT
    as_dict = coerce_tool({"name": "s", "replay": "never", "fn": print, "check": check}, "f")
    assert as_dict.check is check and not as_dict.idempotent
    with pytest.raises(ToolDefinitionError, match="returned str, not done"):
        Tool("s", "d", Args, "never", print, check=lambda a: "yes").settle({"n": 1}, ctx)
    with pytest.raises(ToolDefinitionError, match="only a replay='never' tool takes a check"):
        Tool("s", "d", Args, "safe", print, check=check)
    with pytest.raises(ToolDefinitionError, match="declare check="):
        Tool("s", "d", Args, "never", print, idempotent=True)
    with pytest.raises(ToolDefinitionError, match="check must be a function"):
        Tool("s", "d", Args, "never", print, check="check_refund")  # type: ignore[arg-type]


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
