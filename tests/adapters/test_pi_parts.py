"""The pi adapter's parts on their own: replay labels and what a session file tells."""

from __future__ import annotations

import json

from durable_harness.adapters.hooks import ClaudeCodeConfig
from durable_harness.adapters.pi import PiReplayPolicy
from durable_harness.adapters.pi_session import pi_session_facts


def test_default_labels() -> None:
    policy = PiReplayPolicy()
    for name in ("read", "grep", "find", "ls"):
        assert policy.label(name, {"path": "x"}) == "safe"
    for name in ("bash", "edit", "write", "something_new"):
        assert policy.label(name, {"command": "ls"}) == "never"


def test_user_marks_bash_commands_and_tools() -> None:
    config = ClaudeCodeConfig.parse(
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
