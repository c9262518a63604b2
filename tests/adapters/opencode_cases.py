# ruff: noqa: E501  (the fake model script below keeps one rule per line)
"""What the opencode tests share: the scripted turn and process helpers.

The turn (prompt "add a pricing page"), as the fake model scripts it (OpenCode's tool
names; every run starts with OpenCode's title request, answered by the first rule):

1. model -> bash: makes ``site/index.html`` (content ``PRICING-42``), appends a line to
   ``bash_runs.txt``, sleeps ``sleep`` seconds, prints ``BASH-42``;
2. model -> write ``site/pricing.html``;
3. model -> the final reply.

After a resume the model behaves as a careful one: told a call MAY OR MAY NOT HAVE
HAPPENED, it checks (``cat site/index.html``, marked safe by the agent config) and only
redoes the bash step if its effect is absent. Markers such as ``BASH-42`` are computed by
the shell, so they appear in the conversation only as tool output, never in a command.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import claude_cases
from claude_cases import SECOND_PROMPT, bash_command
from support import Harness, make_harness

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
TOOLS = f"{FIXTURES / 'claude_tools.py'}:TOOLS"
PROMPT = "add a pricing page"
AGENT_CONFIG = FIXTURES / "claude_agent.toml"
TITLE = "Pricing page"
FINAL = "Pricing page added."
SECOND_REPLY = "Earlier I added the pricing page."
WORKSPACE_ENV = "DH_TEST_WORKSPACE"  # the harness's --workspace (read by these helpers only)

_FINAL = """
[[rule]]
name = "final"
when.last_tool_name = "write"
reply.text = "{final}"
"""
# With host tools: write, then the host tool notify (never, served over MCP), then the reply.
_FINAL_AFTER_NOTIFY = """
[[rule]]
name = "final"
when.conversation = "NOTIFIED-OK"
reply.text = "{final}"
reply.chunk_delay_ms = {final_delay_ms}

[[rule]]
name = "notify"
when.last_tool_name = "write"
reply.tool_use = [ {{ name = "durable-harness_notify", input = {{ text = "pricing page is live" }} }} ]
"""

_SCRIPT = """
[[rule]]
name = "title"
when.system = "You are a title generator"
reply.text = "{title}"

[[rule]]
name = "second"
when.last_user_text = "{second_prompt}"
when.conversation = "{final}"
reply.text = "{second_reply}"

{final_rules}

[[rule]]
name = "write"
when.conversation = "BASH-42"
reply.tool_use = [ {{ name = "write", input = {{ filePath = "{ws}/site/pricing.html", content = "<h1>Pricing</h1>\\n" }} }} ]

[[rule]]
name = "write-after-check"
when.conversation = "PRICING-42"
reply.tool_use = [ {{ name = "write", input = {{ filePath = "{ws}/site/pricing.html", content = "<h1>Pricing</h1>\\n" }} }} ]

[[rule]]
name = "redo"
when.conversation = "No such file"
reply.tool_use = [ {{ name = "bash", input = {{ command = "{bash}", description = "make the site" }} }} ]

[[rule]]
name = "check"
when.conversation = "MAY OR MAY NOT HAVE HAPPENED"
reply.tool_use = [ {{ name = "bash", input = {{ command = "cat site/index.html", description = "check" }} }} ]

[[rule]]
name = "bash"
reply.text = "Let me set up the site."
reply.tool_use = [ {{ name = "bash", input = {{ command = "{bash}", description = "make the site" }} }} ]
reply.chunk_delay_ms = {chunk_delay_ms}
"""


def write_script(
    tmp: Path,
    ws: Path,
    *,
    sleep: float = 0,
    chunk_delay_ms: int = 0,
    notify: bool = False,
    final_delay_ms: int = 0,
) -> Path:
    script = tmp / "script.toml"
    final_rules = (_FINAL_AFTER_NOTIFY if notify else _FINAL).format(
        final=FINAL, final_delay_ms=final_delay_ms
    )
    script.write_text(
        _SCRIPT.format(
            final_rules=final_rules,
            ws=ws,
            title=TITLE,
            bash=bash_command(sleep),
            final=FINAL,
            second_prompt=SECOND_PROMPT,
            second_reply=SECOND_REPLY,
            chunk_delay_ms=chunk_delay_ms,
        )
    )
    return script


def opencode_harness(
    tmp: Path,
    *,
    sleep: float = 0,
    chunk_delay_ms: int = 0,
    notify: bool = False,
    final_delay_ms: int = 0,
    where: str = "host",
) -> Iterator[Harness]:
    """``where``: ``host`` (a host folder, the local sandbox) or ``docker``."""
    if where == "docker":
        ws = Path("/workspace")
    else:
        ws = tmp / "ws"
        ws.mkdir()
    script = write_script(
        tmp,
        ws,
        sleep=sleep,
        chunk_delay_ms=chunk_delay_ms,
        notify=notify,
        final_delay_ms=final_delay_ms,
    )
    for h in make_harness(tmp, script):
        h.env["NOTIFY_LEDGER"] = str(tmp / "notify.txt")
        h.env[WORKSPACE_ENV] = "docker" if where == "docker" else str(ws)
        yield h


def run_args(h: Harness, *extra: str, prompt: str = PROMPT) -> list[str]:
    return [
        "run",
        "--agent",
        "opencode",
        "--workspace",
        h.env.get(WORKSPACE_ENV) or str(h.tmp / "ws"),
        "--agent-config",
        str(AGENT_CONFIG),
        *extra,
        prompt,
    ]


def kill_worker_and_cli(worker_pid: int) -> list[int]:
    """SIGKILL the worker and the process group of its OpenCode (as an OOM kill or a lost
    machine would); returns the pids that were below the worker, for later checks."""
    return claude_cases.kill_worker_and_cli(worker_pid, "opencode")


def cli_processes(under: Path | None = None) -> list[int]:
    """Processes of any opencode launch (their environment names the private HOME)."""
    return claude_cases.launch_processes("HOME=/tmp/durable-harness-opencode-", "environ", under)
