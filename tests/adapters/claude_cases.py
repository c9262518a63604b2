# ruff: noqa: E501  (the fake model script below keeps one rule per line)
"""What the claude-code tests share: the scripted turn, its tools, and process helpers.

The turn (prompt "add a pricing page"), as the fake model scripts it:

1. model -> Bash: makes ``site/index.html`` (content ``PRICING-42``), appends a line to
   ``bash_runs.txt``, sleeps ``sleep`` seconds, prints ``BASH-42``;
2. model -> Write ``site/pricing.html``;
3. model -> the host tool ``notify`` (``never``, appends to ``notify.txt``), served over MCP;
4. model -> the final reply.

After a resume the model behaves as a careful one: told a call MAY OR MAY NOT HAVE
HAPPENED, it checks (``cat site/index.html``, marked safe by the agent config) and only
redoes the Bash step if its effect is absent. Markers such as ``BASH-42`` are computed by
the shell, so they appear in the conversation only as tool output, never in a command.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support import Harness, make_harness
from support import wait_for as wait_for  # the adapter tests import it from here

from durable_harness.adapters.cli.host import UNSAFE_HOST_ENV

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
TOOLS = f"{FIXTURES / 'claude_tools.py'}:TOOLS"
PROMPT = "add a pricing page"
FINAL = "Pricing page added and the team notified."
SECOND_PROMPT = "what did you do in the previous turn?"
SECOND_REPLY = "Earlier I added the pricing page."
AGENT_CONFIG = FIXTURES / "claude_agent.toml"

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
when.conversation = "File created successfully"
reply.tool_use = [ {{ name = "mcp__durable-harness__notify", input = {{ text = "pricing page is live" }} }} ]

[[rule]]
name = "write"
when.conversation = "BASH-42"
reply.tool_use = [ {{ name = "Write", input = {{ file_path = "{ws}/site/pricing.html", content = "<h1>Pricing</h1>\\n" }} }} ]

[[rule]]
name = "write-after-check"
when.conversation = "PRICING-42"
reply.tool_use = [ {{ name = "Write", input = {{ file_path = "{ws}/site/pricing.html", content = "<h1>Pricing</h1>\\n" }} }} ]

[[rule]]
name = "redo"
when.conversation = "No such file"
reply.tool_use = [ {{ name = "Bash", input = {{ command = "{bash}", description = "make the site" }} }} ]

[[rule]]
name = "check"
when.conversation = "MAY OR MAY NOT HAVE HAPPENED"
reply.tool_use = [ {{ name = "Bash", input = {{ command = "cat site/index.html", description = "check" }} }} ]

[[rule]]
name = "bash"
reply.text = "Let me set up the site."
reply.tool_use = [ {{ name = "Bash", input = {{ command = "{bash}", description = "make the site" }} }} ]
reply.chunk_delay_ms = {chunk_delay_ms}
{fault}
"""


def bash_command(sleep: float) -> str:
    pause = f" && sleep {sleep}" if sleep else ""
    return (
        "mkdir -p site && printf 'PRICING-%s\\\\n' $((6*7)) > site/index.html && "
        f"echo ran >> bash_runs.txt{pause} && echo BASH-$((40+2))"
    )


def write_script(
    tmp: Path,
    ws: Path,
    *,
    sleep: float = 0,
    chunk_delay_ms: int = 0,
    fault: str | None = None,
    final_delay_ms: int = 0,
    first_rules: str = "",
) -> Path:
    script = tmp / "script.toml"
    script.write_text(
        first_rules
        + _SCRIPT.format(
            ws=ws,
            bash=bash_command(sleep),
            final=FINAL,
            second_prompt=SECOND_PROMPT,
            second_reply=SECOND_REPLY,
            chunk_delay_ms=chunk_delay_ms,
            final_delay_ms=final_delay_ms,
            fault=f'reply.stream_fault = "{fault}"' if fault else "",
        )
    )
    return script


#: Where the CLI runs in a test: ``host`` (the developer-only opt-in, fast) or ``docker``.
WHERE = ("host", "docker")
_WORKSPACE = "DH_TEST_WORKSPACE"  # the harness's --workspace (read by these helpers only)


def claude_harness(
    tmp: Path,
    *,
    sleep: float = 0,
    chunk_delay_ms: int = 0,
    fault: str | None = None,
    final_delay_ms: int = 0,
    where: str = "host",
    first_rules: str = "",
) -> Iterator[Harness]:
    """``first_rules``: fake-model rules tried before the turn's own (a test's own turn)."""
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
        fault=fault,
        final_delay_ms=final_delay_ms,
        first_rules=first_rules,
    )
    for h in make_harness(tmp, script):
        h.env["NOTIFY_LEDGER"] = str(tmp / "notify.txt")
        h.env[_WORKSPACE] = "docker" if where == "docker" else str(ws)
        if where == "host":
            h.env[UNSAFE_HOST_ENV] = "1"
        yield h


def run_args(h: Harness, *extra: str, prompt: str = PROMPT) -> list[str]:
    return [
        "run",
        "--agent",
        "claude-code",
        "--workspace",
        h.env.get(_WORKSPACE) or str(h.tmp / "ws"),
        "--tools",
        TOOLS,
        "--agent-config",
        str(AGENT_CONFIG),
        *extra,
        prompt,
    ]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def bash_runs(h: Harness, session: str | None = None) -> int:
    """Runs of the turn's Bash command: lines of ``bash_runs.txt`` in the workspace (the
    session's container when ``session`` is given)."""
    if session is None:
        return len(lines(h.tmp / "ws" / "bash_runs.txt"))
    return container_text(session, "/workspace/bash_runs.txt").count("ran")


def container_text(session: str, path: str) -> str:
    from durable_harness.sandbox.docker import DockerSandbox

    box = DockerSandbox(session)
    try:
        data = box.read_bytes(path)
    finally:
        box.close()
    return (data or b"").decode()


def notify_runs(h: Harness) -> int:
    return len(lines(h.tmp / "notify.txt"))


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def kill_worker_and_cli(worker_pid: int, mark: str = "claude") -> list[int]:
    """SIGKILL the worker and the process group of its CLI (a process below it whose
    command line holds ``mark``), as an OOM kill or a lost machine would; returns the pids
    that were below the worker, for later checks."""
    below = descendants(worker_pid)
    cli = [p for p in below if mark in cmdline(p) and "reaper.py" not in cmdline(p)]
    with contextlib.suppress(ProcessLookupError):
        os.kill(worker_pid, signal.SIGKILL)
    for pid in cli:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
    return below


def launch_processes(mark: str, where: str = "cmdline", under: Path | None = None) -> list[int]:
    """Live processes of any launch of a CLI: ``mark`` (the launch's private HOME prefix)
    in their command line, or (``where="environ"``) in their environment; with ``under``,
    only those working in that folder or below (this test's own, when other tests run
    the same CLI at the same time)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / where).read_bytes()
            cwd = os.readlink(entry / "cwd") if under is not None else ""
        except OSError:
            continue
        if mark.encode() in text and (under is None or Path(cwd).is_relative_to(under)):
            pids.append(int(entry.name))
    return alive(pids)


def alive(pids: list[int]) -> list[int]:
    living = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        if state[state.rfind(b")") + 2 :].split()[0] != b"Z":
            living.append(pid)
    return living


def model_keys(show: dict[str, Any], status: str | None = None) -> list[str]:
    return [
        s["key"]
        for s in show["steps"]
        if s["kind"] == "model" and (status is None or s["status"] == status)
    ]


def upstream_keys(h: Harness, since: int = 0) -> list[str]:
    """The journal key of every request the fake model answered (from its log)."""
    return [str(r.get("request_key")) for r in h.requests()[since:]]


def tool_rows(show: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s["name"], s["status"]) for s in show["steps"] if s["kind"] == "tool"]


def dump(show: dict[str, Any]) -> str:
    return json.dumps(show, indent=1)
