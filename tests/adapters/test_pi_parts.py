"""The pi adapter's parts on their own: replay labels, what a session file tells, and the
extension's PostToolUse reply."""

from __future__ import annotations

import json
from pathlib import Path

from durable_harness.adapters.base import TurnRun
from durable_harness.adapters.cli.hooks import AgentConfig, ToolHooks
from durable_harness.adapters.pi.session import pi_session_facts
from durable_harness.adapters.pi.spec import PiReplayPolicy, recorded_results
from durable_harness.core.settings import Settings
from durable_harness.core.types import StepStatus
from durable_harness.harness.journal import Journal
from durable_harness.worlds import open_world


def test_default_labels() -> None:
    policy = PiReplayPolicy()
    for name in ("read", "grep", "find", "ls"):
        assert policy.label(name, {"path": "x"}) == "safe"
    for name in ("bash", "edit", "write", "something_new"):
        assert policy.label(name, {"command": "ls"}) == "never"


def test_user_marks_bash_commands_and_tools() -> None:
    config = AgentConfig.parse(
        {"replay": {"safe_bash": ["cat *", "git status"], "tools": {"read": "never"}}}, "t"
    )
    policy = PiReplayPolicy(config)
    assert policy.label("bash", {"command": "cat site/index.html"}) == "safe"
    assert policy.label("bash", {"command": "git push"}) == "never"
    assert policy.label("bash", {"command": "cat a; rm -rf b"}) == "never"
    assert policy.label("read", {"path": "x"}) == "never"
    # Claude Code's tool names mean nothing to Pi.
    assert policy.label("Bash", {"command": "cat x"}) == "never"


def _entry(message: dict[str, object]) -> str:
    return json.dumps({"type": "message", "id": "e", "message": message})


def test_session_facts() -> None:
    lines = [
        json.dumps({"type": "session", "version": 3, "id": "s", "cwd": "/ws"}),
        _entry({"role": "user", "content": [{"type": "text", "text": "go"}]}),
        _entry(
            {
                "role": "assistant",
                "responseId": "msg_1",
                "content": [
                    {"type": "text", "text": "ok"},
                    {"type": "toolCall", "id": "toolu_a", "name": "bash", "arguments": {}},
                    {"type": "toolCall", "id": "toolu_b", "name": "write", "arguments": {}},
                ],
            }
        ),
        _entry({"role": "toolResult", "toolCallId": "toolu_a", "content": [], "isError": False}),
        '{"type": "message", "message": {"role": "assistant", "content": [{"type": "toolC',
    ]
    facts = pi_session_facts("\n".join(lines).encode())
    assert facts.tool_uses == {"toolu_a", "toolu_b"}
    assert facts.tool_results == {"toolu_a"}
    assert facts.messages == {"msg_1"}


def test_a_recorded_result_replaces_a_rerun(tmp_path: Path) -> None:
    """A tool Pi ran although the journal already held its outcome: the PostToolUse reply
    tells the extension to show the model the journal's result instead of the new one."""
    world = open_world("local", data_dir=tmp_path / "world")
    world.create_session("ses_pi", {})
    config = {"agent": "pi", "workspace": str(tmp_path / "ws")}
    world.create_turn("ses_pi", "turn_pi", "p", config)
    lease = world.claim_turn("turn_pi", "test", 60)
    assert lease is not None
    journal = Journal(world, lease)
    run = TurnRun(world, world.get_turn("turn_pi"), journal, Settings.load())
    hooks = ToolHooks(journal, PiReplayPolicy(), host_tool_prefix="\0")
    control = recorded_results(run, hooks)
    recorded = {"content": [{"type": "text", "text": "BASH-42\n"}], "isError": False}
    allowed = control("PreToolUse", {"tool_name": "bash", "tool_input": {}, "tool_use_id": "t1"})
    assert allowed["hookSpecificOutput"]["permissionDecision"] == "allow"
    assert control("PostToolUse", {"tool_use_id": "t1", "tool_response": recorded}) == {}
    # The same call again (its PreToolUse denied it; Pi ran it anyway, or a second
    # extension did): the journal's result wins, and the journal is not rewritten.
    again = {"content": [{"type": "text", "text": "BASH-43\n"}], "isError": False}
    reply = control("PostToolUse", {"tool_use_id": "t1", "tool_response": again})
    assert reply == {"replace": recorded}
    (step,) = world.load_steps("turn_pi")
    assert step.status is StepStatus.DONE and step.attempts == 1
    world.close()
