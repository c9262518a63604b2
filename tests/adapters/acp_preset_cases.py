# ruff: noqa: E501  (the fake model scripts below keep one rule per line)
"""What the tests of the ``acp:claude-code`` and ``acp:codex`` presets share: the scripted
turn in each agent's tool names, the harness, and the process helpers.

The turn (prompt "add a pricing page") is the claude-code tests' (:mod:`claude_cases`):

1. model -> the shell tool: makes ``site/index.html`` (``PRICING-42``), appends a line to
   ``bash_runs.txt``, sleeps ``sleep`` seconds, prints ``BASH-42``;
2. model -> write ``site/pricing.html`` (claude-code-acp: ``mcp__acp__Write``, which the
   client serves as ``fs/write_text_file``; codex-acp: a second shell command);
3. (claude-code-acp) model -> the host tool ``notify`` (``never``, served over MCP);
4. model -> the final reply.

claude-code-acp's shell tool is ``mcp__acp__Bash`` (served by the client as
``terminal/create``), codex-acp's ``exec_command`` (run by the agent after its
``session/request_permission``). After a resume the model is a careful one: told a call
MAY OR MAY NOT HAVE HAPPENED it checks with ``cat site/index.html`` and redoes the shell
step only if its effect is absent.

Both presets are docker_only: on a host folder they run with the developer opt-in, as
the other CLIs' host rows do; ``where="docker"`` runs them in the session's container.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from claude_cases import AGENT_CONFIG, TOOLS, bash_command, kill_worker_and_cli, launch_processes
from support import Harness, make_harness

from durable_harness.adapters.cli.host import UNSAFE_HOST_ENV

PROMPT = "add a pricing page"
FINAL = "Pricing page added and the team notified."
CODEX_FINAL = "Pricing page added."
WORKSPACE_ENV = "DH_TEST_WORKSPACE"  # the harness's --workspace (read by these helpers only)

_CLAUDE_SCRIPT = """
[[rule]]
name = "final"
when.conversation = "NOTIFIED-OK"
reply.text = "{final}"

[[rule]]
name = "notify"
when.last_tool_name = "mcp__acp__Write"
reply.tool_use = [ {{ name = "mcp__durable-harness__notify", input = {{ text = "pricing page is live" }} }} ]

[[rule]]
name = "write"
when.conversation = "BASH-42"
reply.tool_use = [ {{ name = "mcp__acp__Write", input = {{ file_path = "{ws}/site/pricing.html", content = "<h1>Pricing</h1>\\n" }} }} ]

[[rule]]
name = "write-after-check"
when.conversation = "PRICING-42"
reply.tool_use = [ {{ name = "mcp__acp__Write", input = {{ file_path = "{ws}/site/pricing.html", content = "<h1>Pricing</h1>\\n" }} }} ]

[[rule]]
name = "redo"
when.conversation = "No such file"
reply.tool_use = [ {{ name = "mcp__acp__Bash", input = {{ command = "{bash}", description = "make the site", timeout = 120000 }} }} ]

[[rule]]
name = "check"
when.conversation = "MAY OR MAY NOT HAVE HAPPENED"
reply.tool_use = [ {{ name = "mcp__acp__Bash", input = {{ command = "cat site/index.html", description = "check", timeout = 120000 }} }} ]

[[rule]]
name = "bash"
reply.text = "Let me set up the site."
reply.tool_use = [ {{ name = "mcp__acp__Bash", input = {{ command = "{bash}", description = "make the site", timeout = 120000 }} }} ]
reply.chunk_delay_ms = {chunk_delay_ms}
"""

_CODEX_SCRIPT = """
[[rule]]
name = "final"
when.conversation = "PAGE-WRITTEN"
reply.text = "{final}"

[[rule]]
name = "write"
when.conversation = "BASH-42"
reply.tool_use = [ {{ name = "exec_command", input = {{ cmd = "{write}" }} }} ]

[[rule]]
name = "write-after-check"
when.conversation = "PRICING-42"
reply.tool_use = [ {{ name = "exec_command", input = {{ cmd = "{write}" }} }} ]

[[rule]]
name = "redo"
when.conversation = "No such file"
reply.tool_use = [ {{ name = "exec_command", input = {{ cmd = "{bash}" }} }} ]

[[rule]]
name = "check"
when.conversation = "MAY OR MAY NOT HAVE HAPPENED"
reply.tool_use = [ {{ name = "exec_command", input = {{ cmd = "cat site/index.html" }} }} ]

[[rule]]
name = "bash"
reply.text = "Let me set up the site."
reply.tool_use = [ {{ name = "exec_command", input = {{ cmd = "{bash}" }} }} ]
reply.chunk_delay_ms = {chunk_delay_ms}
"""
#: The second command: writes the page, prints a marker made by the shell.
_WRITE = "printf '<h1>Pricing</h1>\\\\n' > site/pricing.html && echo PAGE-$((1+1))WRITTEN | tr -d 2"


@dataclass(frozen=True)
class Agent:
    """One preset under test."""

    agent: str  # --agent
    mark: str  # in the agent's command line (its process group is killed with the worker)
    home_prefix: str  # in its HOME: the launch's processes
    final: str
    shell_tool: str
    host_tools: bool  # the turn serves the host tool notify


CLAUDE = Agent(
    "acp:claude-code",
    "claude-code-acp",
    "durable-harness-acp-claude-code-acp-",
    FINAL,
    "terminal/create",
    True,
)
CODEX = Agent(
    "acp:codex", "codex-acp", "durable-harness-acp-codex-acp-", CODEX_FINAL, "exec_command", False
)


def preset_harness(
    tmp: Path, agent: Agent, *, sleep: float = 0, chunk_delay_ms: int = 0, where: str = "host"
) -> Iterator[Harness]:
    """A harness whose fake model scripts the turn for ``agent`` on the host folder
    ``tmp/ws`` (the developer opt-in) or in the session's container (``where="docker"``)."""
    if where == "docker":
        ws = Path("/workspace")
    else:
        ws = tmp / "ws"
        ws.mkdir()
    template = _CLAUDE_SCRIPT if agent is CLAUDE else _CODEX_SCRIPT
    script = tmp / "script.toml"
    script.write_text(
        template.format(
            ws=ws,
            bash=bash_command(sleep),
            write=_WRITE,
            final=agent.final,
            chunk_delay_ms=chunk_delay_ms,
        )
    )
    for h in make_harness(tmp, script):
        h.env["NOTIFY_LEDGER"] = str(tmp / "notify.txt")
        h.env[WORKSPACE_ENV] = "docker" if where == "docker" else str(ws)
        if where == "host":
            h.env[UNSAFE_HOST_ENV] = "1"
        yield h


def run_args(h: Harness, agent: Agent, prompt: str = PROMPT) -> list[str]:
    tools = ["--tools", TOOLS] if agent.host_tools else []
    return [
        "run",
        "--agent",
        agent.agent,
        "--workspace",
        h.env[WORKSPACE_ENV],
        *tools,
        "--agent-config",
        str(AGENT_CONFIG),
        prompt,
    ]


def killer(agent: Agent):  # type: ignore[no-untyped-def]
    return lambda worker_pid: kill_worker_and_cli(worker_pid, agent.mark)


def launches(agent: Agent):  # type: ignore[no-untyped-def]
    return lambda tmp: launch_processes(agent.home_prefix, "environ", under=tmp)
