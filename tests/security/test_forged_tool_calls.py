# ruff: noqa: E501  (the fake model script below keeps one rule per line)
"""Host tools and hooks only for calls the model made: forged from inside the sandbox.

Each CLI runs against the scripted fake model, in one turn with all the attacks: Claude
Code, Codex, OpenCode and Pi in the session's Docker container, Pi and OpenCode on a host
folder in the default hardened mode (no opt-in set: they run as the unprivileged agent
user, and the attack checks it does). The model calls the ``never`` host tool ``notify``,
then has the CLI's shell tool run ``forged_calls_attack.js`` (base64 in the command,
decoded and run by node there: the CLI's command screening never sees it), then calls
``notify`` again with the same arguments. The attack holds what every child of the CLI
can read, the proxy's URL and per-launch token (the CLI's HOME) and the real tool-use ids
(the CLI's transcript; OpenCode's SQLite database, read as bytes, as node has no SQLite),
and with them forges host-tool calls (a made-up id, the real id with other arguments, the
Bash call's id, the real id again after it ran, no id) and hook events (PreToolUse for
made-up ids, for real ids with other tools or input, for the running Bash call again;
PostToolUse and PostToolUseFailure with made-up outcomes). For OpenCode, whose MCP calls
carry no id (the harness pairs each with the id its plugin's PreToolUse announced), also
what its plugin posts: a made-up id announced, an id-less call with the real arguments,
the real call announced again and then called without an id, and announced once more and
left pending (it must not take the model's next call's place).

Each is refused or answered with the recorded result, and the turn still finishes with
the scripted reply; ``notify`` ran exactly twice, with the model's arguments (its ledger
file on the host); the journal holds exactly the model's three tool calls and no step for
a forged id.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from support import Harness, ids_of, make_harness

from durable_harness.core.keys import tool_key
from durable_harness.core.settings import AgentUserSettings

HERE = Path(__file__).resolve().parent
TOOLS = f"{HERE.parent / 'fixtures' / 'claude_tools.py'}:TOOLS"
ATTACK = HERE / "forged_calls_attack.js"
PROMPT = "notify the team, then check the host tools"
FINAL = "Team notified; nothing else ran."

_RULES = """
[[rule]]
name = "title"
when.system = "You are a title generator"
reply.text = "Host tools"

[[rule]]
name = "final"
when.conversation = "ATTACKS-DONE-42"
when.last_tool_name = "{notify_name}"
reply.text = "{final}"

[[rule]]
name = "notify-again"
when.conversation = "ATTACKS-DONE-42"
reply.tool_use = [ {{ {notify} }} ]

[[rule]]
name = "attack"
when.conversation = "NOTIFIED-OK"
reply.tool_use = [ {{ {shell} }} ]

[[rule]]
name = "notify"
reply.tool_use = [ {{ {notify} }} ]
"""
_COMMAND = "echo {payload} | base64 -d | node - {cli}"
#: How long an adapter waits for a call to show in the CLI's record before saving it.
FLUSH_WAIT = 3.0


@dataclass(frozen=True)
class Cli:
    """One CLI of the test: how its model asks for the shell and the host tool."""

    agent: str
    attack: str  # the attack script's argument for this CLI
    shell: str  # the shell tool use, TOML (``{command}``: the attack command)
    notify: str  # the host tool use, TOML
    env: dict[str, str]  # where the fake model is (``{url}``)
    shell_step: str = "Bash"  # the shell call's step name (as the CLI's hooks name it)
    host_folder: bool = False  # on a host folder (as the agent user), else in Docker


CLIS = {
    "claude-code": Cli(
        "claude-code",
        "claude",
        'name = "Bash", input = {{ command = "{command}", description = "check the host tools" }}',
        'name = "mcp__durable-harness__notify", input = { text = "pricing page is live" }',
        {"ANTHROPIC_BASE_URL": "{url}"},
    ),
    "codex": Cli(
        "codex",
        "codex",
        'name = "exec_command", input = {{ cmd = "{command}", yield_time_ms = 30000 }}',
        'name = "notify", namespace = "mcp__durable_harness", input = { text = "pricing page is live" }',
        {"OPENAI_BASE_URL": "{url}"},
    ),
    "pi": Cli(
        "pi",
        "pi",
        'name = "bash", input = {{ command = "{command}" }}',
        'name = "notify", input = { text = "pricing page is live" }',
        {"ANTHROPIC_BASE_URL": "{url}"},
        shell_step="bash",
    ),
    "opencode": Cli(
        "opencode",
        "opencode",
        'name = "bash", input = {{ command = "{command}", description = "check the host tools" }}',
        'name = "durable-harness_notify", input = { text = "pricing page is live" }',
        {"ANTHROPIC_BASE_URL": "{url}"},
        shell_step="bash",
    ),
}
#: Pi and OpenCode on a host folder: the same turns, run as the agent user.
CLIS |= {
    f"{name}-host-folder": replace(CLIS[name], host_folder=True) for name in ("pi", "opencode")
}


#: Every forged request, and what refusing it looks like.
MCP_REFUSED = (
    "mcp-made-up-id",
    "mcp-made-up-id-real-args",
    "mcp-real-id-other-args",
    "mcp-bash-id",
)
HOOK_DENIED = (
    "pre-made-up-bash",
    "pre-made-up-host",
    "pre-real-host-other-args",
    "pre-bash-id-other-command",
    "pre-bash-id-again",
    "pre-notify-id-as-bash",
    "pre-made-up-wait",
)
POST_REFUSED = ("post-made-up-id", "failure-made-up-id")
#: OpenCode's plugin path: MCP calls paired with the id its PreToolUse announced (the
#: real call's id is taken: an id-less call with its arguments has no id to run under).
OPENCODE_DENIED = ("plugin-pre-made-up-host",)
OPENCODE_MCP_REFUSED = ("mcp-no-id-real-args",)


@pytest.fixture(params=list(CLIS))
def cli(request: pytest.FixtureRequest) -> Cli:
    return CLIS[request.param]


@pytest.fixture
def h(tmp_path: Path, request: pytest.FixtureRequest, cli: Cli) -> Iterator[Harness]:
    if not cli.host_folder:
        request.getfixturevalue("docker_host")
    (tmp_path / "ws").mkdir()
    payload = base64.b64encode(ATTACK.read_bytes()).decode()
    command = _COMMAND.format(payload=payload, cli=cli.attack)
    script = tmp_path / "script.toml"
    shell = cli.shell.format(command=command)
    notify_name = cli.notify.split('"')[1]  # the host tool's name as the model gave it
    rules = _RULES.format(final=FINAL, shell=shell, notify=cli.notify, notify_name=notify_name)
    script.write_text(rules)
    for harness in make_harness(tmp_path, script):
        harness.env["NOTIFY_LEDGER"] = str(tmp_path / "notify.txt")
        harness.env.pop("OPENAI_API_KEY", None)
        # The default, hardened mode: no opt-in (a host folder's CLI is the agent user).
        harness.env.pop("DURABLE_HARNESS_UNSAFE_SAME_USER", None)
        harness.env.pop("DURABLE_HARNESS_UNSAFE_HOST_AGENT", None)
        for name, value in cli.env.items():
            harness.env[name] = value.format(url=harness.server.url)
        yield harness


def test_forged_host_tool_calls_and_hook_events_are_refused(h: Harness, cli: Cli) -> None:
    started = time.monotonic()
    workspace = str(h.tmp / "ws") if cli.host_folder else "docker"
    out = h.cli(
        "run", "--agent", cli.agent, "--workspace", workspace, "--tools", TOOLS,
        "--max-model-calls", "10", PROMPT,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    ids = ids_of(out)
    show = h.show(ids["turn"])
    seconds = time.monotonic() - started

    recorded = _tool_outputs(h, ids["turn"])
    output = _stdout(recorded[cli.shell_step])
    assert "ATTACKS-DONE-42" in output, recorded
    real = json.loads(output.split("REAL ", 1)[1].splitlines()[0])
    attacks = _attacks(output)
    expected = {*MCP_REFUSED, "mcp-real-id-again", "mcp-no-id", *HOOK_DENIED, *POST_REFUSED}
    expected |= {"post-real-host-id"}
    opencode = cli.agent == "opencode"
    if opencode:
        expected |= {*OPENCODE_DENIED, *OPENCODE_MCP_REFUSED}
        expected |= {"plugin-pre-real-host-again", "mcp-no-id-announced", "plugin-session-start"}
        expected |= {"plugin-pre-real-host-primed"}
    assert set(attacks) == expected, sorted(attacks)
    if opencode:  # found by scanning the SQLite database's bytes (the file or its WAL)
        assert real["from"].startswith("opencode.db"), real
    if cli.host_folder:
        # The hardened mode, no opt-in: the CLI and its shell run as the agent user.
        wanted = h.env.get("DURABLE_HARNESS_AGENT_USER", AgentUserSettings().agent_user)
        assert real["user"] == wanted, real

    for name in MCP_REFUSED:
        result = attacks[name]["reply"]["result"]
        assert result["isError"] is True, (name, result)
        assert result["content"][0]["text"].startswith("durable-harness refused"), (name, result)
    # The real id again, after it ran: its recorded result, not a second run.
    again = attacks["mcp-real-id-again"]["reply"]["result"]
    assert again["content"][0]["text"] == "NOTIFIED-OK", again
    for name in ("mcp-no-id", *(OPENCODE_MCP_REFUSED if opencode else ())):
        no_id = attacks[name]["reply"]["result"]
        assert no_id["isError"] is True and "no tool_use_id" in no_id["content"][0]["text"]
    # A PostToolUse for the host tool's real id: the MCP handler journaled that call, so
    # the hooks record nothing (the outcome below is the tool's own).
    assert _reply(attacks["post-real-host-id"]) == {"status": 200, "reply": {}}
    for name in HOOK_DENIED + (OPENCODE_DENIED if opencode else ()):
        decision = attacks[name]["reply"]["hookSpecificOutput"]
        assert attacks[name]["status"] == 200, (name, attacks[name])
        assert decision["permissionDecision"] == "deny", (name, decision)
        assert "refused" in decision["permissionDecisionReason"], (name, decision)
        # Refused before any work for it: saving the CLI's record first waits up to
        # FLUSH_WAIT for the (never coming) call to show in it, then writes the World.
        assert attacks[name]["ms"] < FLUSH_WAIT * 1000, (name, attacks[name])
    # The running call's id again, with its own input: refused as running, not on a
    # technicality of the input (the attack found the real one).
    running = attacks["pre-bash-id-again"]["reply"]["hookSpecificOutput"]
    assert "already running" in running["permissionDecisionReason"], running
    for name in POST_REFUSED:
        assert attacks[name]["status"] == 200, (name, attacks[name])
        assert "refused" in attacks[name]["reply"]["refused"], (name, attacks[name])
    answered, allowed = 1, 0
    if opencode:
        # The plugin's announcement of the real call replayed: allowed (a host tool's
        # PreToolUse only pairs the id), and the id-less call it pairs gets the
        # recorded result; a SessionStart changes nothing.
        for name in ("plugin-pre-real-host-again", "plugin-pre-real-host-primed"):
            again_pre = attacks[name]["reply"]["hookSpecificOutput"]
            assert again_pre["permissionDecision"] == "allow", (name, again_pre)
        announced = attacks["mcp-no-id-announced"]["reply"]["result"]
        assert announced["content"][0]["text"] == "NOTIFIED-OK", announced
        assert _reply(attacks["plugin-session-start"]) == {"status": 200, "reply": {}}
        answered, allowed = answered + 1, 2

    # The never tool ran exactly as often as the model asked: twice, with its arguments,
    # once per call (the forged ones spent none of them).
    notified = (h.tmp / "notify.txt").read_text().splitlines()
    assert len(notified) == 2, notified
    assert all(line.endswith(" pricing page is live") for line in notified), notified
    assert len({line.split(" ", 1)[0] for line in notified}) == 2, notified
    # The journal holds the model's three calls, each done, and nothing forged.
    tools = [s for s in show["steps"] if s["kind"] == "tool"]
    assert [(s["name"], s["status"]) for s in tools] == [
        ("notify", "done"),
        (cli.shell_step, "done"),
        ("notify", "done"),
    ]
    keys = [s["key"] for s in tools]
    assert keys[:2] == [tool_key(real["notify"]), tool_key(real["bash"])], keys
    assert sorted(keys) == sorted(tool_key(i) for i in _model_tool_ids(h, ids["turn"]))
    models = [s for s in show["steps"] if s["kind"] == "model"]
    assert len(models) == len(h.requests()) >= 4  # notify, the command, notify, the reply
    assert {s["kind"] for s in show["steps"]} == {"agent", "model", "tool"}
    assert recorded["notify"] == {"content": "NOTIFIED-OK", "is_error": False}
    assert "forged" not in json.dumps(recorded["notify"])
    assert seconds < 240, seconds
    refused = len(MCP_REFUSED) + 1 + len(HOOK_DENIED) + len(POST_REFUSED)
    if opencode:
        refused += len(OPENCODE_DENIED) + len(OPENCODE_MCP_REFUSED)
    ignored = 2 if opencode else 1  # a PostToolUse for a host tool; a SessionStart
    print(
        f"\nforged ({cli.agent}, {'host folder' if cli.host_folder else 'docker'}; ids from "
        f"{real['from']}, the running command's input from its {real['shellFrom']}): "
        f"{refused} refused, {ignored} ignored, "
        + (f"{allowed} host-tool announcements allowed, " if allowed else "")
        + f"{answered} answered from the journal; notify ran twice, as asked; {seconds:.1f}s"
    )


def _reply(attack: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attack.items() if k != "ms"}


def _attacks(output: str) -> dict[str, dict[str, Any]]:
    found = {}
    for line in output.splitlines():
        if line.startswith("ATTACK "):
            _, name, reply = line.split(" ", 2)
            found[name] = json.loads(reply)
    return found


def _stdout(value: Any) -> str:
    """The attack's output in the shell call's recorded outcome (its stdout, wherever the
    CLI's hook puts it)."""
    if isinstance(value, str):
        return value if "ATTACKS-DONE-42" in value else ""
    if isinstance(value, dict):
        value = list(value.values())
    for child in value if isinstance(value, list) else []:
        found = _stdout(child)
        if found:
            return found
    return ""


def _model_tool_ids(h: Harness, turn_id: str) -> list[str]:
    """The id of every tool use in the model responses the World recorded for the turn."""
    from durable_harness.adapters.cli.ledger import tool_uses_of
    from durable_harness.harness.journal import decode_output
    from durable_harness.worlds import open_world

    world = open_world(h.env["DURABLE_HARNESS_DATA_DIR"])
    try:
        steps = [s for s in world.load_steps(turn_id) if s.kind == "model"]
        return [u.id for s in steps for u in tool_uses_of(decode_output(world, s))]
    finally:
        world.close()


def _tool_outputs(h: Harness, turn_id: str) -> dict[str, Any]:
    """Each tool step's recorded outcome, by tool name, read from the World itself."""
    from durable_harness.harness.journal import decode_output
    from durable_harness.worlds import open_world

    world = open_world(h.env["DURABLE_HARNESS_DATA_DIR"])
    try:
        return {
            s.name: decode_output(world, s) for s in world.load_steps(turn_id) if s.kind == "tool"
        }
    finally:
        world.close()
