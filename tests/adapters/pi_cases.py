# ruff: noqa: E501  (the fake model script below keeps one rule per line)
"""What the pi tests share: the scripted turn (Pi's tool names), and process helpers.

The turn (prompt "add a pricing page"), as the fake model scripts it for Pi 0.73.1,
whose built-in tools are ``read``, ``bash``, ``edit`` and ``write``:

1. model -> ``bash``: makes ``site/index.html`` (content ``PRICING-42``), appends a line
   to ``bash_runs.txt``, sleeps ``sleep`` seconds, prints ``BASH-42``;
2. model -> ``write`` ``site/pricing.html``;
3. model -> the host tool ``notify`` (``never``, appends to ``notify.txt``), registered
   in Pi by the durable-harness extension and run by the harness;
4. model -> the final reply.

After a resume the model behaves as a careful one (as in claude_cases): told a call MAY
OR MAY NOT HAVE HAPPENED, it checks (``cat site/index.html``, marked safe by the agent
config) and only redoes the bash step if its effect is absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import claude_cases
from claude_cases import (
    AGENT_CONFIG,
    FINAL,
    PROMPT,
    SECOND_PROMPT,
    SECOND_REPLY,
    bash_command,
    bash_runs,
    lines,
)
from support import Harness, make_harness

__all__ = [
    "FINAL",
    "PROMPT",
    "SECOND_PROMPT",
    "SECOND_REPLY",
    "bash_runs",
    "cli_processes",
    "kill_worker_and_cli",
    "notify_runs",
    "pi_harness",
    "run_args",
]

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
TOOLS = f"{FIXTURES / 'claude_tools.py'}:TOOLS"
#: Every process of a pi launch names its private HOME (the --session path) on its command line.
LAUNCH_MARK = "durable-harness-pi-"
WORKSPACE_ENV = "DH_TEST_WORKSPACE"  # the harness's --workspace (read by these helpers only)

_SCRIPT = """
[[rule]]
name = "second"
when.last_user_text = "{second_prompt}"
when.conversation = "{final}"
reply.text = "{second_reply}"

[[rule]]
name = "final"
when.conversation = "NOTIFIED-OK"
reply.text = "{final}"
reply.chunk_delay_ms = {final_delay_ms}

[[rule]]
name = "notify"
when.conversation = "Successfully wrote"
reply.tool_use = [ {{ name = "notify", input = {{ text = "pricing page is live" }} }} ]

[[rule]]
name = "write"
when.conversation = "BASH-42"
reply.tool_use = [ {{ name = "write", input = {{ path = "{ws}/site/pricing.html", content = "<h1>Pricing</h1>\\n" }} }} ]

[[rule]]
name = "write-after-check"
when.conversation = "PRICING-42"
reply.tool_use = [ {{ name = "write", input = {{ path = "{ws}/site/pricing.html", content = "<h1>Pricing</h1>\\n" }} }} ]

[[rule]]
name = "redo"
when.conversation = "No such file"
reply.tool_use = [ {{ name = "bash", input = {{ command = "{bash}" }} }} ]

[[rule]]
name = "check"
when.conversation = "MAY OR MAY NOT HAVE HAPPENED"
reply.tool_use = [ {{ name = "bash", input = {{ command = "cat site/index.html" }} }} ]

[[rule]]
name = "bash"
reply.text = "Let me set up the site."
reply.tool_use = [ {{ name = "bash", input = {{ command = "{bash}" }} }} ]
reply.chunk_delay_ms = {chunk_delay_ms}
"""


def write_script(
    tmp: Path, ws: Path, *, sleep: float = 0, chunk_delay_ms: int = 0, final_delay_ms: int = 0
) -> Path:
    script = tmp / "script.toml"
    script.write_text(
        _SCRIPT.format(
            ws=ws,
            bash=bash_command(sleep),
            final=FINAL,
            second_prompt=SECOND_PROMPT,
            second_reply=SECOND_REPLY,
            chunk_delay_ms=chunk_delay_ms,
            final_delay_ms=final_delay_ms,
        )
    )
    return script


def pi_harness(
    tmp: Path,
    *,
    sleep: float = 0,
    chunk_delay_ms: int = 0,
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
        tmp, ws, sleep=sleep, chunk_delay_ms=chunk_delay_ms, final_delay_ms=final_delay_ms
    )
    for h in make_harness(tmp, script):
        h.env["NOTIFY_LEDGER"] = str(tmp / "notify.txt")
        h.env[WORKSPACE_ENV] = "docker" if where == "docker" else str(ws)
        yield h


def run_args(h: Harness, *extra: str, prompt: str = PROMPT) -> list[str]:
    return [
        "run",
        "--agent",
        "pi",
        "--workspace",
        h.env.get(WORKSPACE_ENV) or str(h.tmp / "ws"),
        "--tools",
        TOOLS,
        "--agent-config",
        str(AGENT_CONFIG),
        *extra,
        prompt,
    ]


def notify_runs(h: Harness) -> int:
    return len(lines(h.tmp / "notify.txt"))


def kill_worker_and_cli(worker_pid: int) -> list[int]:
    """SIGKILL the worker and the process group of its pi CLI (as an OOM kill would);
    returns the pids that were below the worker, for later checks."""
    return claude_cases.kill_worker_and_cli(worker_pid, LAUNCH_MARK)


def cli_processes(under: Path | None = None) -> list[int]:
    """Processes of any pi launch still alive."""
    return claude_cases.launch_processes(LAUNCH_MARK, under=under)
