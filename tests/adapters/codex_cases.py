# ruff: noqa: E501  (the fake model script below keeps one rule per line)
"""What the codex tests share: the scripted turn and process helpers.

The turn (prompt "add a pricing page"), as the fake model scripts it over the Responses API:

1. model -> ``exec_command``: makes ``site/index.html`` (content ``PRICING-42``), appends a
   line to ``bash_runs.txt``, sleeps ``sleep`` seconds, prints ``BASH-42``;
2. model -> ``exec_command``: writes ``site/pricing.html``, appends to ``write_runs.txt``,
   prints ``WROTE-2``;
3. model -> the final reply.

After a resume the model behaves as a careful one: told a call MAY OR MAY NOT HAVE
HAPPENED, it checks (``cat site/index.html``, marked safe by the agent config) and only
redoes step 1 if its effect is absent. Markers are computed by the shell, so they appear in
the conversation only as tool output, never in a command.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import claude_cases
from claude_cases import container_text, lines
from support import Harness, make_harness

from durable_harness.adapters.cli.host import UNSAFE_HOST_ENV

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
PROMPT = "add a pricing page"
FINAL = "Pricing page added."
SECOND_PROMPT = "what did you do in the previous turn?"
SECOND_REPLY = "Earlier I added the pricing page."
AGENT_CONFIG = FIXTURES / "codex_agent.toml"
WRITE = "printf '<h1>Pricing</h1>\\\\n' > site/pricing.html && echo ran >> write_runs.txt && echo WROTE-$((1+1))"

_SCRIPT = """
[[rule]]
name = "second"
when.last_user_text = "{second_prompt}"
when.conversation = "{final}"
reply.text = "{second_reply}"

[[rule]]
name = "final"
when.conversation = "{final_after}"
reply.text = "{final}"
reply.chunk_delay_ms = {final_delay_ms}
{notify_rule}
[[rule]]
name = "write"
when.conversation = "BASH-42"
reply.tool_use = [ {{ name = "exec_command", input = {{ cmd = "{write}", yield_time_ms = 30000 }} }} ]

[[rule]]
name = "write-after-check"
when.conversation = "PRICING-42"
reply.tool_use = [ {{ name = "exec_command", input = {{ cmd = "{write}", yield_time_ms = 30000 }} }} ]

[[rule]]
name = "redo"
when.conversation = "No such file"
reply.tool_use = [ {{ name = "exec_command", input = {{ cmd = "{bash}", yield_time_ms = 30000 }} }} ]

[[rule]]
name = "check"
when.conversation = "MAY OR MAY NOT HAVE HAPPENED"
reply.tool_use = [ {{ name = "exec_command", input = {{ cmd = "cat site/index.html", yield_time_ms = 30000 }} }} ]

[[rule]]
name = "bash"
reply.text = "Let me set up the site."
reply.tool_use = [ {{ name = "exec_command", input = {{ cmd = "{bash}", yield_time_ms = 30000 }} }} ]
reply.chunk_delay_ms = {chunk_delay_ms}
{fault}
"""


#: With ``notify``: after the second command the model calls the host tool ``notify``
#: (tests/fixtures/claude_tools.py, ``never``, served over MCP; Codex offers it as the
#: namespace ``mcp__durable_harness``), and answers once it returned.
NOTIFY_TOOLS = f"{FIXTURES / 'claude_tools.py'}:TOOLS"
_NOTIFY_RULE = """
[[rule]]
name = "notify"
when.conversation = "WROTE-2"
reply.tool_use = [ { name = "notify", namespace = "mcp__durable_harness", input = { text = "pricing page is live" } } ]
"""


def bash_command(sleep: float) -> str:
    pause = f" && sleep {sleep}" if sleep else ""
    return (
        "mkdir -p site && printf 'PRICING-%s\\\\n' $((6*7)) > site/index.html && "
        f"echo ran >> bash_runs.txt{pause} && echo BASH-$((40+2))"
    )


def write_script(
    tmp: Path,
    *,
    sleep: float = 0,
    chunk_delay_ms: int = 0,
    fault: str | None = None,
    final_delay_ms: int = 0,
    notify: bool = False,
) -> Path:
    script = tmp / "script.toml"
    script.write_text(
        _SCRIPT.format(
            bash=bash_command(sleep),
            write=WRITE,
            final=FINAL,
            second_prompt=SECOND_PROMPT,
            second_reply=SECOND_REPLY,
            chunk_delay_ms=chunk_delay_ms,
            final_delay_ms=final_delay_ms,
            fault=f'reply.stream_fault = "{fault}"' if fault else "",
            final_after="NOTIFIED-OK" if notify else "WROTE-2",
            notify_rule=_NOTIFY_RULE if notify else "",
        )
    )
    return script


_WORKSPACE = "DH_TEST_WORKSPACE"  # the harness's --workspace (read by these helpers only)


def codex_harness(
    tmp: Path,
    *,
    sleep: float = 0,
    chunk_delay_ms: int = 0,
    fault: str | None = None,
    final_delay_ms: int = 0,
    where: str = "host",
    notify: bool = False,
) -> Iterator[Harness]:
    """A harness for the codex turn; ``where`` is ``host`` (a host folder, the developer
    opt-in) or ``docker`` (the session's container)."""
    if where == "host":
        (tmp / "ws").mkdir()
    script = write_script(
        tmp,
        sleep=sleep,
        chunk_delay_ms=chunk_delay_ms,
        fault=fault,
        final_delay_ms=final_delay_ms,
        notify=notify,
    )
    for h in make_harness(tmp, script):
        h.env["OPENAI_BASE_URL"] = h.server.url
        h.env.pop("OPENAI_API_KEY", None)
        h.env[_WORKSPACE] = "docker" if where == "docker" else str(tmp / "ws")
        if where == "host":
            h.env[UNSAFE_HOST_ENV] = "1"
        if notify:
            h.env["NOTIFY_LEDGER"] = str(tmp / "notify.txt")
        yield h


def run_args(h: Harness, *extra: str, prompt: str = PROMPT) -> list[str]:
    return [
        "run",
        "--agent",
        "codex",
        "--workspace",
        h.env.get(_WORKSPACE) or str(h.tmp / "ws"),
        "--agent-config",
        str(AGENT_CONFIG),
        *(["--tools", NOTIFY_TOOLS] if "NOTIFY_LEDGER" in h.env else []),
        *extra,
        prompt,
    ]


def bash_runs(h: Harness, session: str | None = None) -> int:
    """Runs of the first command (in the session's container when ``session`` is given)."""
    return _runs(h, "bash_runs.txt", session)


def notify_runs(h: Harness) -> int:
    """Runs of the host tool ``notify`` (it runs in the worker, on the host, in both places)."""
    return len(lines(h.tmp / "notify.txt"))


def write_runs(h: Harness, session: str | None = None) -> int:
    return _runs(h, "write_runs.txt", session)


def _runs(h: Harness, name: str, session: str | None) -> int:
    if session is None:
        return len(lines(h.tmp / "ws" / name))
    return container_text(session, f"/workspace/{name}").count("ran")


def kill_worker_and_cli(worker_pid: int) -> list[int]:
    """SIGKILL the worker and the process group of its codex; returns the pids below it."""
    return claude_cases.kill_worker_and_cli(worker_pid, "codex")


def cli_processes(under: Path | None = None) -> list[int]:
    """Processes of any codex launch (their command lines name the launch's HOME)."""
    return claude_cases.launch_processes("durable-harness-codex-", under=under)
