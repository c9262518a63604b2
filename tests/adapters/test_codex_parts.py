"""Parts of the codex agent without the CLI: replay labels with Codex's tool names."""

from __future__ import annotations

from durable_harness.adapters.cli.hooks import AgentConfig
from durable_harness.adapters.codex.spec import CodexReplayPolicy, codex_model


def policy(data: dict[str, object]) -> CodexReplayPolicy:
    return CodexReplayPolicy(AgentConfig.parse(data, "in the test"))


def test_the_shell_tool_is_never_unless_a_pattern_marks_it_safe() -> None:
    p = policy({"replay": {"safe_bash": ["cat *"]}})
    assert p.label("Bash", {"command": "rm -rf site"}) == "never"
    assert p.label("Bash", {"command": "cat site/index.html"}) == "safe"
    assert p.label("Bash", {"command": "cat a > b"}) == "never"  # redirects: never by pattern
    assert p.label("apply_patch", {}) == "never"


def test_a_label_for_exec_command_applies_to_the_shell_tool() -> None:
    assert policy({"replay": {"tools": {"exec_command": "safe"}}}).label("Bash", {}) == "safe"
    both = {"replay": {"tools": {"exec_command": "safe", "Bash": "never"}}}
    assert policy(both).label("Bash", {}) == "never"  # the name the hooks report wins


def test_the_harness_default_model_means_codex_default() -> None:
    assert codex_model({"model": "claude-sonnet-4-5"}) == "gpt-5-codex"
    assert codex_model({}) == "gpt-5-codex"
    assert codex_model({"model": "o3"}) == "o3"
