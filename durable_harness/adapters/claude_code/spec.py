"""The claude-code agent's :class:`~.cli.spec.CliSpec`: the real ``claude`` CLI behind the
journaling proxy, run by :class:`~.cli.agent.CliAdapter` (one turn, one or more launches:
:mod:`.cli.agent`). What is Claude Code's own:

* model calls: the Anthropic Messages API (``ANTHROPIC_BASE_URL`` is the proxy, the API
  key the per-launch token), keyed by
  :class:`~.claude_code.canonical.ClaudeCodeCanonicalizer`;
* tool calls: its PreToolUse/PostToolUse hooks (``--settings``, project and local settings
  ignored: they could switch the hooks off) post to :class:`~.cli.hooks.ToolHooks`, with
  the default :class:`~.cli.hooks.ReplayPolicy` labels; the host tools and the wait tools
  are served over MCP (``--mcp-config``, strict);
* waits: the hook *defers* a call to a pending wait; the launch ends deferred and the next
  delivery resumes the CLI with an empty prompt once the wait is settled;
* the session record is its transcript (``~/.claude/projects/<workspace>/<session>.jsonl``,
  :mod:`.claude_code.session`), under a session id derived from the durable-harness
  session (the same on every worker);
* it runs only in the session's Docker container, or on a host folder under the developer
  opt-in :data:`~.cli.host.UNSAFE_HOST_ENV`.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from durable_harness.adapters.claude_code.canonical import ClaudeCodeCanonicalizer
from durable_harness.adapters.claude_code.fork import cut_transcript
from durable_harness.adapters.claude_code.output import LaunchOutput
from durable_harness.adapters.claude_code.session import transcript_facts
from durable_harness.adapters.claude_code.setup import (
    BIN_ENV,
    CLAUDE_CODE_VERSION,
    claude_session_id,
    project_dir_name,
)
from durable_harness.adapters.cli.agent import find_binary
from durable_harness.adapters.cli.hooks import AgentConfig, ReplayPolicy, ToolHooks
from durable_harness.adapters.cli.host import CliLaunch, Finished
from durable_harness.adapters.cli.jobs import workspace_of
from durable_harness.adapters.cli.mcp import SERVER_NAME, HostToolServer
from durable_harness.adapters.cli.spec import BeforeIntent, CliSpec, LaunchContext, Wiring
from durable_harness.adapters.cli.transcript import TranscriptFile
from durable_harness.harness.endpoint import resolve_endpoint

__all__ = [
    "CLAUDE_CODE_VERSION",
    "SPEC",
    "find_claude",
    "project_dir_name",
    "workspace_of",  # re-exported: it lives in cli/jobs.py
]

RETRIES_ENV = "DURABLE_HARNESS_CLAUDE_MAX_RETRIES"
#: Retries the CLI makes itself on a failed model call before giving up; the worker then
#: releases the turn and a later delivery resumes it.
DEFAULT_CLI_RETRIES = "2"
_HOOK_EVENTS = ("SessionStart", "PreToolUse", "PostToolUse", "PostToolUseFailure")
_FLUSH_WAIT = 3.0  # seconds the transcript may take to show a tool call before a save


def find_claude() -> str:
    """The ``claude`` binary: $DURABLE_HARNESS_CLAUDE_BIN, the project's pinned install
    (``.tools/npm`` of a checkout, or ``setup-agents``'s user cache), or PATH."""
    return find_binary(SPEC)


def _transcript_rel(ctx: LaunchContext) -> str:
    """Claude Code's transcript of this session, relative to its HOME."""
    return f".claude/projects/{project_dir_name(ctx.host.workspace)}/{ctx.session}.jsonl"


#: Claude Code's transcript, under a session id derived from the durable-harness session.
_TRANSCRIPT = TranscriptFile(
    path=_transcript_rel,
    facts_of=transcript_facts,
    record_prefix="claude-code",
    session=lambda ctx: claude_session_id(ctx.run.turn.session_id),
    flush_wait=_FLUSH_WAIT,
    poll=0.02,
)


def _launch(ctx: LaunchContext, url: str) -> CliLaunch:
    home, token, host = ctx.home, ctx.token, ctx.host
    endpoint = f"{home}/durable-harness-endpoint.json"
    settings = {
        "hooks": {
            event: [
                {
                    "matcher": "*",
                    "hooks": [
                        {
                            "type": "command",
                            "command": shlex.join(host.hook_command(endpoint, event)),
                            "timeout": 600,
                        }
                    ],
                }
            ]
            for event in _HOOK_EVENTS
        }
    }
    # Always served: the wait tools (cli/waits.py) are host tools too. In Docker through
    # the stdio relay: the CLI's own HTTP client gives the model a call the worker's death
    # cut off as ECONNRESET; the relay posts it again to the next worker, which answers an
    # interrupted `never` tool "possibly ran" and runs a `safe` one again.
    relay = host.mcp_command(endpoint)
    server: dict[str, Any] = (
        {"type": "http", "url": f"{url}/mcp", "headers": {"Authorization": f"Bearer {token}"}}
        if relay is None
        else {"type": "stdio", "command": relay[0], "args": relay[1:]}
    )
    servers = {SERVER_NAME: server}
    files = {
        "durable-harness-endpoint.json": json.dumps({"url": url, "token": token}).encode(),
        "durable-harness-settings.json": json.dumps(settings, indent=1).encode(),
        "durable-harness-mcp.json": json.dumps({"mcpServers": servers}).encode(),
        **ctx.restored,
    }
    start = "--session-id" if ctx.plan.mode == "new" else "--resume"
    argv = [
        ctx.binary,
        "-p",
        "--output-format", "stream-json",
        "--verbose",
        "--model", ctx.run.turn_config.model or ctx.run.settings.model,
        "--settings", f"{home}/durable-harness-settings.json",
        # Project and local settings could switch the journaling hooks off.
        "--setting-sources", "user",
        "--mcp-config", f"{home}/durable-harness-mcp.json",
        "--strict-mcp-config",
        "--dangerously-skip-permissions",
        start, str(ctx.session),
    ]  # fmt: skip
    env = {
        "HOME": home,
        "TERM": "dumb",
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": token,  # the proxy's per-launch token, never a provider key
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",  # memory would live in the lost HOME
        "CLAUDE_CODE_MAX_RETRIES": os.environ.get(RETRIES_ENV, DEFAULT_CLI_RETRIES),
        "IS_SANDBOX": "1",  # lets --dangerously-skip-permissions run as root
        **_bash_timeouts(ctx.run.settings.max_tool_timeout),
    }
    return CliLaunch(ctx.job, argv, env, ctx.plan.message.encode(), files)


def _bash_timeouts(ceiling: float) -> dict[str, str]:
    """Claude Code's Bash tool under the operator's ceiling: the model asks for up to
    BASH_MAX_TIMEOUT_MS (the CLI's own default 600000, whose tool description then stays
    the same) and gets BASH_DEFAULT_TIMEOUT_MS (default 120000) when it asks for none;
    at the timeout the command is stopped, not backgrounded."""
    limit = max(int(ceiling * 1000), 1)
    return {
        "BASH_MAX_TIMEOUT_MS": str(limit),
        "BASH_DEFAULT_TIMEOUT_MS": str(min(limit, 120_000)),
        # Otherwise a command that reaches its timeout is moved to the background and
        # runs on (measured: `sleep 100000` with the 4 s ceiling came back as a
        # backgroundTaskId), and `claude -p` waits for it before it exits: the worker
        # would be held for as long as the model asked. Also no `run_in_background`.
        "CLAUDE_CODE_DISABLE_BACKGROUND_TASKS": "1",
    }


def _wiring(ctx: LaunchContext, hooks: ToolHooks, saver: BeforeIntent | None) -> Wiring:
    # No save before a host call: Claude Code's PreToolUse hook runs for MCP tools too.
    run = ctx.run
    mcp = HostToolServer(
        run.journal, ctx.tools, run.turn.session_id, ctx.gate.signal_secret, hooks.ledger
    )
    return Wiring(hooks.handle, mcp.handle)


@dataclass
class _Output:
    """The stream-json lines (:class:`~.claude_code.output.LaunchOutput`)."""

    show: bool  # progress lines (not --quiet)
    session: str | None
    lines: LaunchOutput = field(default_factory=LaunchOutput)

    def feed(self, line: bytes) -> None:
        self.lines.feed(line, show_progress=self.show)

    def reply(self, finished: Finished, upstream_errors: list[str]) -> str:
        self.lines.status, self.lines.stderr = finished.status, finished.stderr
        return self.lines.reply(upstream_errors)

    def fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"session": self.session}
        result = self.lines.result or {}
        deferred = result.get("deferred_tool_use")
        if result.get("stop_reason") == "tool_deferred" and deferred:
            fields["deferred"] = str(deferred.get("id"))  # stopped at a wait (defer mode)
        return fields


SPEC = CliSpec(
    name="claude-code",
    binary="claude",
    product="Claude Code",
    version=CLAUDE_CODE_VERSION,
    package=f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}",
    bin_env=BIN_ENV,
    read_version=lambda host, binary: host.version(binary),
    docker_only=True,
    parse_config=lambda data: AgentConfig.parse(data, "in the turn"),
    replay_policy=ReplayPolicy,
    upstream=resolve_endpoint,
    canonicalizer=lambda ctx: ClaudeCodeCanonicalizer(home=ctx.home),
    record=_TRANSCRIPT,
    launch=_launch,
    output=lambda ctx: _Output(show=ctx.run.journal.on_step is not None, session=ctx.session),
    wiring=_wiring,
    host_tool_prefix=f"mcp__{SERVER_NAME}__",
    waits="defer",
    hooks_wait=10.0,
    hooks_missing="Claude Code did not run the durable-harness hooks (no SessionStart arrived)",
    close_from_request=lambda hooks, body: hooks.close_from_request(body),
    fork=cut_transcript,
)
