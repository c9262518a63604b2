"""Limits the model cannot raise, attacked from inside the Docker sandbox.

The scripted model makes the agent's own shell tool run the attacks (obfuscated: no
command spells what it does), in one turn per agent where they do not interfere:

* a command asking for an unbounded timeout (``sleep 100000``, timeout 10**9) is capped
  at the operator's ``DURABLE_HARNESS_MAX_TOOL_TIMEOUT`` and stopped there;
* filling the disk (``dd`` until it fails) fails with ENOSPC inside at the operator's
  ``DURABLE_HARNESS_MAX_WORKSPACE_BYTES``: the volumes are tmpfs mounts of that size on
  the Docker host, and the World's snapshot holds no more than that;
* processes that leave the command's process group (``setsid``, ``set -m``, a double
  fork renamed to look like a detached job) are killed when the command ends; in Claude
  Code, a ``setsid`` squatter that listens on the ports the old scheme derived for its
  own launch and the next one dies with the launch, and the next launch's bridge, at a
  random port stored in its plan, never talks to it;
* Codex, OpenCode and Pi in Docker, one turn each through the CLI's own shell tool, the
  commands base64-wrapped: the same sleep (Pi's and OpenCode's timeouts are held to the
  ceiling by the harness's extension and plugin; Codex's exec_command has none the
  model can set, and its command dies with the launch), the same fill, the same escapes
  (a CLI's shell tool does not kill them with the command: they die with the launch);
* on a host folder (the built-in agent's local sandbox, Pi, OpenCode; the agent user, no
  opt-in) the quota is RLIMIT_FSIZE on every agent process plus a watch that stops the
  command growing the workspace past it: the folder holds at most the quota plus SLACK;
* every turn still finishes.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import Harness, ids_of, make_harness

from durable_harness.adapters.cli.docker_host import bridge_port
from durable_harness.adapters.cli.host import stored_input
from durable_harness.adapters.cli.jobs import job_id
from durable_harness.harness.journal import decode_output
from durable_harness.sandbox.docker import DockerSandbox
from durable_harness.sandbox.quota import tree_bytes
from durable_harness.worlds import open_world

CEILING = 4  # seconds: DURABLE_HARNESS_MAX_TOOL_TIMEOUT in these tests
QUOTA = 16 << 20  # bytes: DURABLE_HARNESS_MAX_WORKSPACE_BYTES
LIMITS = {
    "DURABLE_HARNESS_MAX_TOOL_TIMEOUT": str(CEILING),
    "DURABLE_HARNESS_MAX_WORKSPACE_BYTES": str(QUOTA),
}
FINAL = "Limits probed."


def _s(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text)


def _tool(name: str, command: str, **extra: Any) -> str:
    """A TOML inline table: a tool_use of ``name`` with ``command`` and ``extra`` fields."""
    fields = "".join(f", {k} = {_s(v) if isinstance(v, str) else v}" for k, v in extra.items())
    return f"{{ name = {_s(name)}, input = {{ command = {_s(command)}{fields} }} }}"


def _bash(command: str, **extra: Any) -> str:
    return _tool("bash", command, **extra)


# -- the attacks, as the built-in agent's bash tool runs them --------------------------

SLEEP = "z=sl; z=${z}eep; $z 100000; echo after-sleep"
FILL = (
    "o=/dev/ze; o=${o}ro; c=d; c=$c$c; "
    '$c if=$o of=/workspace/fill bs=1M count=100000; echo "ws=$?"; '
    '$c if=$o of="$HOME/fill" bs=1M count=100000; echo "home=$?"; '
    'rm -f -- "$HOME/fill"'  # the shell keeps its state in HOME: leave it room
)
# Three ways out of the command's process group; each process carries the name "sq2at"
# (computed, so no command line holds it and [s]q2at matches none of them).
SPAWN = (
    "n=sq$((1+1))at; s=set; s=${s}sid; "
    '$s -f bash -c "exec -a $n sleep 4141" </dev/null >/dev/null 2>&1; '
    '(set -m; bash -c "exec -a $n sleep 4242" </dev/null >/dev/null 2>&1 &); '
    '( ( exec -a "dh-job:$n" sleep 4343 </dev/null >/dev/null 2>&1 & ) & ); '
    '$s -f node -e \'require("net").createServer().listen(31337, "127.0.0.1");'
    ' process.title = "sq2at-listen"\' </dev/null >/dev/null 2>&1; '
    "sleep 1; "
    'echo "alive-during=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr "\\0" " " '
    "| grep -o '[s]q2at' | wc -l)\""
)
CHECK = (
    'echo "SURVIVORS=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr "\\0" " " '
    "| grep -o '[s]q2at' | wc -l)\"; "
    "(echo > /dev/tcp/127.0.0.1/31337) 2>/dev/null && echo LISTENER-ALIVE; echo checked"
)

BUILTIN_SCRIPT = f"""
[[rule]]
name = "final"
when.conversation = "SURVIVORS="
reply.text = "{FINAL}"

[[rule]]
name = "attacks"
reply.text = "Probing the limits."
reply.tool_use = [
  {_bash(SLEEP, timeout=10**9)},
  {_bash(FILL, timeout=60)},
  {_bash(SPAWN, timeout=60)},
  {_bash(CHECK, timeout=60)},
]
"""


@pytest.fixture
def builtin(docker_host: str, tmp_path: Path) -> Iterator[Harness]:
    script = tmp_path / "script.toml"
    script.write_text(BUILTIN_SCRIPT)
    yield from make_harness(tmp_path, script)


def _tool_outputs(h: Harness, turn_id: str) -> list[str]:
    with open_world("local", data_dir=h.tmp / "world") as world:
        return [
            str(decode_output(world, s)["content"])
            for s in world.load_steps(turn_id)
            if s.kind == "tool"
        ]


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _host_mount(mountpoint: str) -> list[str]:
    """The host's /proc/mounts line for ``mountpoint`` (split), or []."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == mountpoint:
            return fields
    return []


def test_the_builtin_agent_cannot_raise_its_limits(builtin: Harness) -> None:
    h = builtin
    free_before = shutil.disk_usage("/var/tmp").free
    started = time.monotonic()
    out = h.cli("run", "--workspace", "docker", "probe the limits", timeout=300, **LIMITS)
    elapsed = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL  # the turn finished
    ids = ids_of(out)
    sleep, fill, spawn, check = _tool_outputs(h, ids["turn"])

    # The unbounded timeout: capped, said so, stopped at the ceiling.
    assert sleep.startswith("timed out"), sleep
    assert f"capped at {CEILING}s" in sleep and "after-sleep" not in sleep, sleep
    assert elapsed < 120, elapsed  # the whole turn, not 100000 s

    # The disk: ENOSPC inside, on both volumes, at the quota.
    assert fill.count("No space left on device") == 2, fill
    assert "ws=1" in fill and "home=1" in fill, fill
    assert f"{QUOTA} bytes" in fill, fill  # dd wrote exactly the quota, then failed

    # The escapes were running during their command, and none outlived it.
    assert "alive-during=4" in spawn, spawn
    assert "SURVIVORS=0" in check and "LISTENER-ALIVE" not in check, check

    with DockerSandbox(ids["session"]) as box:
        try:
            assert box.bash("stat -c %s /workspace/fill").stdout == f"{QUOTA}\n"
            # Each volume is a tmpfs of the quota's size on the Docker host: the dd
            # above never reached the host's disk.
            for name in box.volume_names.values():
                mountpoint = box.client.volumes.get(name).attrs["Mountpoint"]
                fields = _host_mount(mountpoint)
                assert fields and fields[2] == "tmpfs", (mountpoint, fields)
                assert f"size={QUOTA // 1024}k" in fields[3], fields
            left = box.bash("cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c '[s]q2at'")
            assert left.stdout.strip() == "0", left
        finally:
            box.remove()
    # The World's snapshot of the full workspace is bounded by the quota too.
    assert _folder_bytes(h.tmp / "world") < QUOTA + (4 << 20)
    # 100000 MiB were asked for; the host lost nothing near that (other work shares
    # the disk, hence the margin).
    assert free_before - shutil.disk_usage("/var/tmp").free < 8 << 30


# -- Claude Code: its Bash tool, a setsid squatter on the bridge's ports ---------------

# Listens on the port the old scheme derived from the launch's job id (its HOME's name)
# and on the next launch's, logging whatever connects; detached with setsid.
SQUAT = (
    "j=${HOME##*/}; k=${j%launch*}launch$(( ${j##*launch} + 1 )); "
    "cat > /tmp/sq.js <<'EOF'\n"
    'const net = require("net"), crypto = require("crypto"), fs = require("fs");\n'
    'const log = (s) => fs.appendFileSync("/tmp/sq.log", s + "\\n");\n'
    'const port = (j) => 20000 + parseInt(crypto.createHash("sha256").update(j)'
    '.digest("hex").slice(0, 8), 16) % 20000;\n'
    "for (const j of process.argv.slice(2)) {\n"
    "  const p = port(j);\n"
    '  net.createServer((c) => c.on("data", (d) => log("GOT " + p + " " + d)))\n'
    '    .on("error", (e) => log("ERR " + p + " " + e.code))\n'
    '    .listen(p, "127.0.0.1", () => log("LISTEN " + p));\n'
    "}\n"
    "setInterval(() => {}, 1e9);\n"
    "EOF\n"
    's=set; s=${s}sid; $s -f node /tmp/sq.js "$j" "$k" </dev/null >/dev/null 2>&1; '
    "sleep 1; cat /tmp/sq.log; printf 'SQUAT%s\\n' TED"
)
CLAUDE_SECOND = "second turn, after the squatter"
CLAUDE_SCRIPT = f"""
[[rule]]
name = "second"
when.last_user_text = "{CLAUDE_SECOND}"
reply.text = "Second turn done."

[[rule]]
name = "final"
when.conversation = "SQUATTED"
reply.text = "{FINAL}"

[[rule]]
name = "squat"
when.conversation = "home=1"
reply.tool_use = [ {_tool("Bash", SQUAT, description="serve")} ]

[[rule]]
name = "fill"
when.last_tool_name = "Bash"
reply.tool_use = [ {_tool("Bash", FILL, description="store", timeout=60000)} ]

[[rule]]
name = "sleep"
reply.tool_use = [ {_tool("Bash", SLEEP, description="wait", timeout=10**9)} ]
"""


@pytest.fixture
def claude(docker_host: str, tmp_path: Path) -> Iterator[Harness]:
    script = tmp_path / "script.toml"
    script.write_text(CLAUDE_SCRIPT)
    yield from make_harness(tmp_path, script)


def _launch_port(h: Harness, turn_id: str) -> int | None:
    with open_world("local", data_dir=h.tmp / "world") as world:
        step = next(s for s in world.load_steps(turn_id) if s.key == "launch:0")
        return json.loads(stored_input(world, step)).get("port")  # type: ignore[no-any-return]


def _claude_run(h: Harness, prompt: str, *extra: str) -> Any:
    return h.cli(
        "run", "--agent", "claude-code", "--workspace", "docker", *extra, prompt,
        timeout=300, **LIMITS,
    )  # fmt: skip


def test_claude_codes_squatter_dies_with_its_launch(claude: Harness) -> None:
    h = claude
    started = time.monotonic()
    out = _claude_run(h, "serve something")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    assert time.monotonic() - started < 200  # the 10**9 ms Bash call did not hold it
    ids = ids_of(out)
    turn = ids["turn"]
    # Claude Code's Bash tool took the ceiling (BASH_MAX_TIMEOUT_MS) and stopped the
    # command there, not moving it to the background to run on.
    with open_world("local", data_dir=h.tmp / "world") as world:
        steps = world.load_steps(turn)
        waited = next(s for s in steps if s.kind == "tool" and "eep" in (s.input or ""))
        assert f"timed out after {CEILING}s" in json.dumps(decode_output(world, waited))
        filled = next(s for s in steps if s.kind == "tool" and "count=100000" in (s.input or ""))
        fill = json.dumps(decode_output(world, filled))
    # The fill failed with ENOSPC at the quota on both volumes (the workspace and HOME).
    assert "/workspace/fill': No space left on device" in fill and "home=1" in fill, fill
    port = _launch_port(h, turn)
    assert isinstance(port, int) and port != bridge_port(job_id(turn, 0))
    with DockerSandbox(ids["session"]) as box:
        try:
            assert box.bash("stat -c %s /workspace/fill").stdout == f"{QUOTA}\n"
            log = (box.read_bytes("/tmp/sq.log") or b"").decode()
            # It was up, listening where the old scheme would have put the bridges.
            assert f"LISTEN {bridge_port(job_id(turn, 1))}" in log, log
            # ...and is gone with the launch: no node process runs sq.js.
            left = box.bash("cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c '[s]q.js'")
            assert left.stdout.strip() == "0", (left, log)

            # The session's next launch (a new turn) finds its bridge free and works.
            second = _claude_run(h, CLAUDE_SECOND, "--session", ids["session"])
            assert second.returncode == 0, second.stderr
            assert second.stdout.strip().splitlines()[-1] == "Second turn done."
            next_port = _launch_port(h, ids_of(second)["turn"])
            assert isinstance(next_port, int)
            log = (box.read_bytes("/tmp/sq.log") or b"").decode()
            assert "GOT" not in log, log  # no bridge ever talked to the squatter
        finally:
            box.remove()


# -- Codex, OpenCode and Pi: each CLI's own shell tool, its own timeout parameter -------

SLEEPING = (
    'echo "SLEEPING=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr "\\0" " " '
    "| grep -o 'sleep 10000[0]' | wc -l)\"; "
)


def _wrapped(command: str) -> str:
    """``command`` base64-wrapped: no command screening of the CLI can read it."""
    encoded = base64.b64encode(command.encode()).decode()
    return f"echo {encoded} | base64 -d | bash"


@dataclass(frozen=True)
class Cli:
    agent: str
    #: A tool_use of the CLI's shell tool running ``command``, asking for ``timeout``
    #: (the CLI's own parameter and unit) or the CLI's default with None.
    call: Callable[[str, int | None], str]


def _codex_call(command: str, timeout: int | None) -> str:
    # Codex's exec_command has no timeout: yield_time_ms is how long the call waits for
    # output before it returns, leaving the command running in a Codex session.
    fields = f"cmd = {_s(command)}, yield_time_ms = {timeout or 60000}"
    return f'{{ name = "exec_command", input = {{ {fields} }} }}'


def _opencode_call(command: str, timeout: int | None) -> str:
    extra: dict[str, Any] = {"description": "run"}
    if timeout is not None:
        extra["timeout"] = timeout  # milliseconds
    return _tool("bash", command, **extra)


def _pi_call(command: str, timeout: int | None) -> str:
    return _tool("bash", command, **({} if timeout is None else {"timeout": timeout}))


CLIS = {
    "codex": Cli("codex", _codex_call),
    "opencode": Cli("opencode", _opencode_call),
    "pi": Cli("pi", _pi_call),
}


def _chain(cli: Cli, calls: list[tuple[str, int | None]]) -> str:
    """A script making ``cli`` run ``calls`` (command, timeout) one after the other,
    each base64-wrapped, then reply FINAL. The next call is keyed on the last one's
    command being in the conversation, not on its output (a killed command has none)."""
    wrapped = [_wrapped(command) for command, _ in calls]
    rules = [
        '[[rule]]\nname = "title"\nwhen.system = "You are a title generator"\n'
        'reply.text = "Limits"\n',
        f'[[rule]]\nname = "final"\nwhen.conversation = "{wrapped[-1][5:45]}"\n'
        f'reply.text = "{FINAL}"\n',
    ]
    for i in range(len(calls) - 1, -1, -1):
        when = f'when.conversation = "{wrapped[i - 1][5:45]}"\n' if i else ""
        call = cli.call(wrapped[i], calls[i][1])
        rules.append(f'[[rule]]\nname = "call{i}"\n{when}reply.tool_use = [ {call} ]\n')
    return "\n".join(rules)


def cli_script(cli: Cli) -> str:
    """One turn: the sleep with a 10**9 timeout, the disk fill, the escapes, the check."""
    return _chain(cli, [(SLEEP, 10**9), (FILL, None), (SPAWN, None), (SLEEPING + CHECK, None)])


@pytest.fixture(params=list(CLIS))
def cli_harness(
    request: pytest.FixtureRequest, docker_host: str, tmp_path: Path
) -> Iterator[tuple[Cli, Harness]]:
    cli = CLIS[request.param]
    script = tmp_path / "script.toml"
    script.write_text(cli_script(cli))
    for h in make_harness(tmp_path, script):
        h.env["OPENAI_BASE_URL"] = h.server.url  # Codex speaks the Responses API
        h.env.pop("OPENAI_API_KEY", None)
        yield cli, h


def _step_texts(h: Harness, turn_id: str) -> list[str]:
    """Each tool step's recorded outcome, as JSON text, in the order they ran."""
    with open_world("local", data_dir=h.tmp / "world") as world:
        return [
            json.dumps(decode_output(world, s))
            for s in world.load_steps(turn_id)
            if s.kind == "tool"
        ]


def test_codex_opencode_and_pi_cannot_raise_their_limits(
    cli_harness: tuple[Cli, Harness],
) -> None:
    """Pi's bash timeout (seconds) has no default and no bound, OpenCode's (ms) a 2-minute
    default and no bound: the harness's extension and plugin hold each to the operator's
    ceiling before the tool runs (the journal keeps the model's own input), so the
    10**9 s (Pi) and 10**9 ms (OpenCode) sleeps are stopped at the ceiling by the CLI
    itself. Codex's exec_command has no timeout the model can set: ``yield_time_ms``
    only says how long the call waits before it returns with the command left running
    in a Codex session; what bounds that command is the launch: it is killed with
    everything else of the launch when the turn's CLI exits. The disk fill fails with
    ENOSPC at the quota on both volumes; the escaping processes, which a CLI's own shell
    tool does not kill with the command, die with the launch."""
    cli, h = cli_harness
    started = time.monotonic()
    out = h.cli(
        "run", "--agent", cli.agent, "--workspace", "docker", "--max-model-calls", "12",
        "probe the limits", timeout=400, **LIMITS,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    print(f"{cli.agent}: limits turn took {elapsed:.1f}s")
    assert out.returncode == 0, out.stderr
    ids = ids_of(out)
    texts = _step_texts(h, ids["turn"])
    assert out.stdout.strip().splitlines()[-1] == FINAL, texts  # the turn finished
    assert len(texts) == 4, texts  # the model's four calls, nothing else recorded
    sleep, fill, spawn, check = texts
    assert "after-sleep" not in sleep, sleep
    if cli.agent == "pi":
        assert f"Command timed out after {CEILING} seconds" in sleep, sleep
    elif cli.agent == "opencode":
        assert f"exceeding timeout {CEILING * 1000} ms" in sleep, sleep
    else:  # Codex: the call came back, the sleep left running in a Codex session
        assert "SLEEPING=1" in check, check
    assert elapsed < 240, elapsed  # not 10**9 of anything

    assert "/workspace/fill': No space left on device" in fill, fill
    # OpenCode keeps a running command's output in its database, in HOME: once the fill
    # of HOME has filled that volume too, the rest of the output is lost (measured: only
    # the first dd's lines come back). The volumes themselves are checked below.
    if cli.agent != "opencode":
        assert "ws=1" in fill and "home=1" in fill, fill
    assert "alive-during=4" in spawn, spawn

    with DockerSandbox(ids["session"]) as box:
        try:
            assert box.bash("stat -c %s /workspace/fill").stdout == f"{QUOTA}\n"
            # The launch is over: nothing it started is left, squatters and sleep alike.
            left = box.bash(
                "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c -e '[s]q2at' -e 'sleep 10000[0]'"
            )
            assert left.stdout.strip() == "0", left
            alive = box.bash("(echo > /dev/tcp/127.0.0.1/31337) 2>/dev/null && echo ALIVE")
            assert "ALIVE" not in alive.stdout, alive
        finally:
            box.remove()
    # The World's snapshot of the full workspace is bounded by the quota too.
    assert _folder_bytes(h.tmp / "world") < QUOTA + (4 << 20)


# -- host folders: the built-in agent's local sandbox, Pi and OpenCode ------------------

# One file past the quota outside the workspace (RLIMIT_FSIZE stops it: SIGXFSZ), then
# 1 MiB files into the workspace until a write fails (the quota's watch stops it).
HOST_FILL = (
    "o=/dev/ze; o=${o}ro; c=d; c=$c$c; "
    '$c if=$o of="$HOME/big" bs=1M count=100000; echo "home=$?"; rm -f -- "$HOME/big"; '
    "i=0; while [ $i -lt 100000 ]; do "
    "$c if=$o of=part$i bs=1M count=1 2>/dev/null || break; i=$((i+1)); done; "
    'echo "parts=$i"'
)
# What the watch may let through past the quota: what is written between a measurement
# and the kill, here 1 MiB files from a shell loop on a loaded 2-CPU machine (measured: up
# to 19 MiB for OpenCode, 6 MiB for the built-in agent, 2 MiB for Pi).
SLACK = 32 << 20
HOST_CLIS = {"builtin": Cli("builtin", _pi_call), **CLIS}  # its bash is spelled as Pi's


def host_script(cli: Cli) -> str:
    """One turn: the sleep with a 10**9 timeout, then the fill."""
    return _chain(cli, [(SLEEP, 10**9), (HOST_FILL, None)])


@pytest.fixture(params=["builtin", "pi", "opencode"])
def host_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Cli, Harness]]:
    cli = HOST_CLIS[request.param]
    (tmp_path / "ws").mkdir()
    script = tmp_path / "script.toml"
    script.write_text(host_script(cli))
    for h in make_harness(tmp_path, script):
        # The default, hardened mode: the agent user, no opt-in.
        h.env.pop("DURABLE_HARNESS_UNSAFE_SAME_USER", None)
        h.env.pop("DURABLE_HARNESS_UNSAFE_HOST_AGENT", None)
        yield cli, h


def test_a_host_folder_holds_its_quota(host_harness: tuple[Cli, Harness]) -> None:
    """On a host folder (no tmpfs): RLIMIT_FSIZE stops a file past the quota anywhere
    (SIGXFSZ: "File size limit exceeded"), the quota's watch stops the command that
    grows the workspace past it (sandbox/quota.py); the folder holds at most the quota
    plus SLACK; the 10**9 timeout is held to the ceiling as in Docker; the turn finishes."""
    cli, h = host_harness
    ws = h.tmp / "ws"
    started = time.monotonic()
    out = h.cli("run", "--agent", cli.agent, "--workspace", str(ws), "probe the limits",
                timeout=300, **LIMITS)  # fmt: skip
    elapsed = time.monotonic() - started
    held = tree_bytes(ws)
    print(f"{cli.agent}: host-folder turn took {elapsed:.1f}s; the folder holds {held} bytes")
    assert out.returncode == 0, out.stderr
    ids = ids_of(out)
    texts = _step_texts(h, ids["turn"])
    assert out.stdout.strip().splitlines()[-1] == FINAL, texts
    assert len(texts) == 2, texts  # the model's two calls, nothing else recorded
    sleep, fill = texts
    assert "after-sleep" not in sleep, sleep
    timed_out = {
        "builtin": f"capped at {CEILING}s",
        "pi": f"Command timed out after {CEILING} seconds",
        "opencode": f"exceeding timeout {CEILING * 1000} ms",
    }
    assert timed_out[cli.agent] in sleep, sleep
    assert elapsed < 200, elapsed

    # The file past the quota in HOME: stopped by the file-size limit.
    # (dd on a terminal, the local sandbox's, handles SIGXFSZ and reports EFBIG; in
    # Pi's and OpenCode's shells SIGXFSZ ends it.)
    assert ("File too large" in fill and "home=1" in fill) or (
        "File size limit exceeded" in fill and "home=153" in fill
    ), fill
    assert not any(ws.rglob("big"))
    # The workspace: filled up to the quota, then the watch stopped the command.
    assert QUOTA <= held <= QUOTA + SLACK, held
    # The model is told why: by the local sandbox's result, or through the stderr of the
    # CLI's shell.
    assert "past its quota" in fill and "DURABLE_HARNESS_MAX_WORKSPACE_BYTES" in fill, fill
