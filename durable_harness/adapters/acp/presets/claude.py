"""``acp:claude-code``: Claude Code through Zed's ACP agent ``claude-code-acp``.

``@zed-industries/claude-code-acp`` 0.16.2 (pinned in tools/npm) drives Claude Code over
the Claude Agent SDK. Its SDK bundles an older Claude Code; ``CLAUDE_CODE_EXECUTABLE``
points it at the pinned one (``@anthropic-ai/claude-code`` 2.1.332, installed beside it),
whose traffic the Claude Code canonicalizer was measured on. Chosen over its successor
``claude-agent-acp`` because it is the one that uses the client's ``fs/*`` and
``terminal/*`` (docs/acp.md): given those capabilities it swaps Claude's Read, Write,
Edit and Bash for ``mcp__acp__*`` tools that ask the client, so every file write and
every command is a step the harness journals and runs in the sandbox. With Claude Code
2.1.332 that needs ``ENABLE_TOOL_SEARCH=false`` (else the ``mcp__acp__*`` tools hide
behind a tool search while the built-ins are disabled, and every tool call fails).

The model endpoint is the environment (``ANTHROPIC_BASE_URL`` = the proxy,
``ANTHROPIC_API_KEY`` = the per-launch token). The agent picks its model from Claude
Code's own aliases only (``default`` is Opus with a 1M context); the settings pick
``sonnet`` and ``ANTHROPIC_DEFAULT_*_MODEL`` map every alias to the turn's model. Its
session record is Claude Code's transcript under ``~/.claude/projects``; it advertises
``loadSession``.
"""

from __future__ import annotations

import json
import os

from durable_harness.adapters.acp.preset import AcpHome, AcpPreset
from durable_harness.adapters.proxy.canonical_claude_code import ClaudeCodeCanonicalizer

__all__ = ["PRESET"]

VERSION = "0.16.2"
#: Claude Code's switches, as the claude-code adapter sets them: no update check, no
#: telemetry or other traffic, no memory in the lost HOME; the ACP tools not deferred.
_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
    "ENABLE_TOOL_SEARCH": "false",
    # Without it the SDK's Claude Code sends betas the proxy's table has not seen
    # (mid-conversation-tool-changes, per-turn-control), and the proxy refuses them.
    "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
    "TERM": "dumb",
}
_MODEL_ALIASES = (
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
)


#: Where the agent image installs the pinned CLIs (Dockerfile, sandbox/session_image.py):
#: in a container the agent's binary is a bare name on PATH.
IMAGE_BIN = "/opt/agent-clis/node_modules/.bin"


def claude_beside(binary: str) -> str:
    """The pinned ``claude`` installed beside ``claude-code-acp``: one ``node_modules/.bin``
    on the host's ``.tools/npm`` and in the agent image (the SDK wants an existing path)."""
    folder = os.path.dirname(binary) if os.path.isabs(binary) else IMAGE_BIN
    return f"{folder}/claude"


def _home(launch: AcpHome) -> tuple[dict[str, bytes], dict[str, str]]:
    env = {
        **_ENV,
        "ANTHROPIC_BASE_URL": launch.endpoint,
        "ANTHROPIC_API_KEY": launch.token,
        **dict.fromkeys(_MODEL_ALIASES, launch.model),
    }
    env["CLAUDE_CODE_EXECUTABLE"] = claude_beside(launch.binary)
    # The agent sets one of Claude Code's aliases as the model, "default" unless the
    # settings name another; "default" adds the 1M-context beta (a pricier tier), the
    # "sonnet" alias does not, and the variables above make it the turn's model.
    settings = {"model": "sonnet"}
    return {".claude/settings.json": json.dumps(settings).encode()}, env


PRESET = AcpPreset(
    name="claude-code",
    product="Claude Code (ACP)",
    binary="claude-code-acp",
    package=f"@zed-industries/claude-code-acp@{VERSION}",
    version=VERSION,
    bin_env="DURABLE_HARNESS_CLAUDE_CODE_ACP_BIN",
    argv=(),
    home=_home,
    docker_only=True,
    wire="anthropic",
    canonicalizer=lambda launch: ClaudeCodeCanonicalizer(launch.home),
    record_files=(".claude/projects/*.jsonl",),
    load_session=True,
    # It speaks ACP whatever its arguments: there is no --version to ask.
    version_args=(),
    # Read (through fs/read_text_file) asks no permission; these only read.
    safe_tools=frozenset({"mcp__acp__Read", "Glob", "Grep", "LS", "TodoWrite"}),
    # Its file and shell tools, served by the client (fs/*, terminal/*).
    client_served_tools=frozenset(
        {
            "mcp__acp__Read",
            "mcp__acp__Write",
            "mcp__acp__Edit",
            "mcp__acp__Bash",
            "mcp__acp__BashOutput",
            "mcp__acp__KillShell",
        }
    ),
)
