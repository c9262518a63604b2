# ruff: noqa: E501  (the fake model script keeps one rule per line)
"""Escape tests of the journaling proxy and its listeners, from inside: each of the four
CLIs (Claude Code, Codex, OpenCode, Pi) and an ACP agent (``acp:claude-code``, whose
shell commands the harness runs as ``terminal/create``) in the Docker sandbox, and Pi and
OpenCode on a host folder (the default, hardened mode: the agent user, no opt-in set), one scripted turn
each, the CLI's own shell tool running a script the model sent base64-encoded (so no
command screening can read it), which finds the proxy's per-launch token and URL as any
process in the sandbox can (the CLI's environment, ``/proc/*/environ``, the launch's
HOME) and sends 14 model requests the CLI did not make, in the CLI's own API: another
model, a huge ``max_tokens`` (and thinking budget), provider-side tools (web search and
fetch, code execution, MCP, file search), a foreign beta or another account scope, state
stored on the account (``previous_response_id``, ``store``, ``background``), content the
provider would fetch from a URL, unknown paths, another API's path; then, in a Claude
Code turn with a budget of two model calls, one call past it.

Each is refused with the proxy's reason; the fake model's request log shows none of them
(every request it received is one the CLI made, or the one in-budget call); the journal
holds the model's one tool call; the first turns finish with their scripted reply, the
budget's turn ends failed with its reason.

In the same turn, every one of them also runs ``listener_attack.js`` against every listener the process can
reach (in Docker the launch's bridge on ``127.0.0.1`` and the run folder's unix socket it
relays to; on a host folder the proxy on loopback): malformed and oversize framings,
wrong, missing and non-ASCII tokens on the model, hook and ``/mcp`` paths, slow headers
and bodies; each is refused (400, 401, 408, 413, or closed) without a traceback, and an
authenticated request right after it is answered. Then 250 idle connections are held
while authenticated requests are answered; each is closed by the far end within the read
timeout, and the worker's thread count, sampled through the turn, stays bounded (no
thread per connection).
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import Harness, ids_of, make_harness

from durable_harness.sandbox.docker import DockerSandbox

HERE = Path(__file__).resolve().parent
FINAL = "Checked the proxy."

_SCRIPT = """
[[rule]]
name = "title"
when.system = "You are a title generator"
reply.text = "Proxy check"

[[rule]]
name = "final"
when.conversation = "ESCAPE-DONE"
reply.text = "{final}"

[[rule]]
name = "attack"
when.conversation = "check the proxy"
reply.tool_use = [ {tool_use} ]

[[rule]]
name = "any"
reply.text = "ok"
"""

# The attack, in JavaScript (the image has node, not python). Each request's user text
# is ATTACK-<name>: the fake model's log would show it if one got through.
_ATTACK = r"""
const fs = require('fs');
function endpoint() {
  const env = process.env;
  if (env.ANTHROPIC_BASE_URL && env.ANTHROPIC_API_KEY)
    return {url: env.ANTHROPIC_BASE_URL, key: env.ANTHROPIC_API_KEY, from: 'env'};
  for (const pid of fs.readdirSync('/proc').filter(p => /^\d+$/.test(p))) {
    try {
      const vars = {};
      for (const kv of fs.readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0'))
        vars[kv.split('=')[0]] = kv.slice(kv.indexOf('=') + 1);
      if (vars.ANTHROPIC_BASE_URL && vars.ANTHROPIC_API_KEY)
        return {url: vars.ANTHROPIC_BASE_URL, key: vars.ANTHROPIC_API_KEY, from: 'proc'};
    } catch (e) {}
  }
  // The endpoint file every CLI adapter leaves for its hooks: named in the environment
  // (Pi) or somewhere in the launch's HOME.
  const named = Object.values(env).find(v => v.endsWith('durable-harness-endpoint.json'));
  const find = (dir, depth) => {
    for (const e of fs.readdirSync(dir, {withFileTypes: true})) {
      const p = `${dir}/${e.name}`;
      if (e.isFile() && e.name === 'durable-harness-endpoint.json') return p;
      if (e.isDirectory() && depth > 0) { const f = find(p, depth - 1); if (f) return f; }
    }
  };
  const saved = JSON.parse(fs.readFileSync(named || find(env.HOME, 4)));
  return {url: saved.url, key: saved.token, from: 'home'};
}
const ep = endpoint();
const MODEL = process.argv[2], WIRE = process.argv[3], MODE = process.argv[4];
const anthropic = WIRE === 'anthropic';
const PATH = anthropic ? '/v1/messages' : '/v1/responses';
function ask(name, extra) {
  const base = anthropic
    ? {model: MODEL, max_tokens: 1000, stream: false,
       messages: [{role: 'user', content: `ATTACK-${name}`}]}
    : {model: MODEL, stream: false, store: false,
       input: [{type: 'message', role: 'user', content: [{type: 'input_text', text: `ATTACK-${name}`}]}]};
  return Object.assign(base, extra || {});
}
async function send(name, path, body, headers, method) {
  const auth = anthropic ? {'x-api-key': ep.key, 'anthropic-version': '2023-06-01'}
                         : {authorization: `Bearer ${ep.key}`};
  const res = await fetch(ep.url + path, {method: method || 'POST',
    headers: Object.assign(auth, {'content-type': 'application/json'}, headers || {}),
    body: body === undefined ? undefined : JSON.stringify(body)});
  const text = await res.text();
  return {name, status: res.status, refused: text.includes('durable-harness proxy'),
          reason: text.slice(0, 300)};
}
const tool = t => ({tools: [t]});
(async () => {
  const out = {from: ep.from, results: []};
  const r = out.results;
  const go = async (name, extra, headers, path) =>
    r.push(await send(name, path || PATH, ask(name, extra), headers));
  if (MODE === 'budget') {
    await go('budget-ok');
    await go('budget-over');
  } else if (anthropic) {
    const img = {type: 'image', source: {type: 'url', url: 'https://example.invalid/x.png?leak=1'}};
    await go('other-model', {model: 'claude-opus-4-1'}, {}, '/v1/messages?beta=true');
    await go('huge-max-tokens', {max_tokens: 10000000});
    await go('huge-thinking', {thinking: {type: 'enabled', budget_tokens: 5000000}});
    await go('web-fetch', tool({type: 'web_fetch_20250910', name: 'web_fetch'}));
    await go('web-search', tool({type: 'web_search_20250305', name: 'web_search'}));
    await go('code-execution', tool({type: 'code_execution_20250825', name: 'code_execution'}));
    await go('foreign-beta', {}, {'anthropic-beta': 'web-fetch-2025-09-10'});
    await go('mcp-servers', {mcp_servers: [{type: 'url', url: 'https://example.invalid/mcp', name: 'x'}]});
    await go('url-image', {messages: [{role: 'user', content: [{type: 'text', text: 'ATTACK-url-image'}, img]}]});
    await go('unknown-query', {}, {}, '/v1/messages?x=1');
    await go('files', {}, {}, '/v1/files');
    r.push(await send('batches', '/v1/messages/batches', {requests: [{custom_id: 'a', params: ask('batches')}]}));
    r.push(await send('models-other', '/v1/models/claude-opus-4-1', undefined, {}, 'GET'));
    r.push(await send('count-other', '/v1/messages/count_tokens', {model: 'claude-opus-4-1', messages: [{role: 'user', content: 'ATTACK-count-other'}]}));
  } else {
    const img = {type: 'input_image', image_url: 'https://example.invalid/x.png?leak=1'};
    await go('other-model', {model: 'gpt-6.2-sol'});
    await go('huge-max-tokens', {max_output_tokens: 10000000});
    await go('web-search', tool({type: 'web_search_preview'}));
    await go('code-interpreter', tool({type: 'code_interpreter', container: {type: 'auto'}}));
    await go('mcp-tool', tool({type: 'mcp', server_label: 'x', server_url: 'https://example.invalid/mcp'}));
    await go('file-search', tool({type: 'file_search', vector_store_ids: ['vs_1']}));
    await go('previous-response', {previous_response_id: 'resp_someone_elses'});
    await go('background', {background: true});
    await go('store', {store: true});
    await go('organization', {}, {'openai-organization': 'org-other'});
    await go('url-image', {input: [{type: 'message', role: 'user', content: [{type: 'input_text', text: 'ATTACK-url-image'}, img]}]});
    await go('files', {}, {}, '/v1/files');
    r.push(await send('stored-response', '/v1/responses/resp_1', undefined, {}, 'GET'));
    r.push(await send('other-wire', '/v1/chat/completions', {model: 'gpt-4o', messages: [{role: 'user', content: 'ATTACK-other-wire'}]}));
  }
  if (process.argv[5])  // the listener attacks too (listener_attack.js, beside this file)
    out.listeners = await require(`${__dirname}/l.js`)(ep, WIRE, ...process.argv.slice(5, 8).map(Number));
  fs.writeFileSync('escape.json', JSON.stringify(out));  // the shell tool's cwd: the workspace
  console.log('ESCAPE-' + ['DO', 'NE'].join(''));
})();
"""


@dataclass(frozen=True)
class Cli:
    agent: str
    model: str  # the turn's model as the CLI is configured with it
    wire: str
    #: The CLI's shell tool call, as the fake model's TOML (``{command}`` the command).
    tool_use: str
    #: ``docker``, or ``host``: a host folder, in the default hardened mode (the agent
    #: user, no opt-in set).
    place: str = "docker"
    #: The same turn also runs ``listener_attack.js``.
    listeners: bool = False


_BASH = '{{ name = "bash", input = {{ command = "{command}" }} }}'
_OPENCODE_BASH = '{{ name = "bash", input = {{ command = "{command}", description = "check" }} }}'
CLIS = {
    "claude-code": Cli(
        "claude-code",
        "claude-sonnet-4-5",
        "anthropic",
        '{{ name = "Bash", input = {{ command = "{command}", description = "check" }} }}',
        listeners=True,
    ),
    "codex": Cli(
        "codex",
        "gpt-5-codex",
        "responses",
        '{{ name = "exec_command", input = {{ cmd = "{command}", yield_time_ms = 60000 }} }}',
        listeners=True,
    ),
    "opencode": Cli("opencode", "claude-sonnet-4-5", "anthropic", _OPENCODE_BASH, listeners=True),
    "pi": Cli("pi", "claude-sonnet-4-5", "anthropic", _BASH, listeners=True),
    "pi-host-folder": Cli(
        "pi", "claude-sonnet-4-5", "anthropic", _BASH, place="host", listeners=True
    ),
    "opencode-host-folder": Cli(
        "opencode", "claude-sonnet-4-5", "anthropic", _OPENCODE_BASH, place="host", listeners=True
    ),
    # An ACP agent: its shell tool is the client's terminal/create, run by the harness in
    # the container (not by the agent), beside the agent that holds the launch's token.
    "acp-claude-code": Cli(
        "acp:claude-code",
        "claude-sonnet-4-5",
        "anthropic",
        '{{ name = "mcp__acp__Bash", input = {{ command = "{command}", description = "check", timeout = 120000 }} }}',
        listeners=True,
    ),
}
#: The worker's listener limits in the turns with the listener attacks: small enough that
#: an oversize body and a slow client are refused within seconds, large enough for the
#: CLI's own requests.
MAX_BODY = 4 * 1024 * 1024
READ_TIMEOUT_S = 4
MAX_CONNECTIONS = 300  # 250 idle ones fit, 60 more do not
LISTENER = HERE / "listener_attack.js"


def _command(cli: Cli, mode: str) -> str:
    """The shell command: the scripts base64-encoded, decoded into a fresh folder and run
    by node."""
    encoded = base64.b64encode(_ATTACK.encode()).decode()
    command = f"d=$(mktemp -d) && echo {encoded} | base64 -d > $d/p.js"
    args = f"{cli.model} {cli.wire} {mode}"
    if cli.listeners and mode == "attacks":
        listener = base64.b64encode(LISTENER.read_bytes()).decode()
        command += f" && echo {listener} | base64 -d > $d/l.js"
        args += f" {MAX_BODY} {READ_TIMEOUT_S * 1000} {MAX_CONNECTIONS}"
    return f"{command} && node $d/p.js {args}"


def _harness(tmp: Path, cli: Cli, mode: str) -> Iterator[Harness]:
    script = tmp / f"script-{mode}.toml"
    tool_use = cli.tool_use.format(command=_command(cli, mode))
    script.write_text(_SCRIPT.format(final=FINAL, tool_use=tool_use))
    (tmp / "ws").mkdir(exist_ok=True)
    for h in make_harness(tmp, script):
        h.env["OPENAI_BASE_URL"] = h.server.url
        h.env.pop("OPENAI_API_KEY", None)
        h.env.pop("DURABLE_HARNESS_UNSAFE_SAME_USER", None)
        h.env.pop("DURABLE_HARNESS_UNSAFE_HOST_AGENT", None)
        if cli.listeners:
            h.env["DURABLE_HARNESS_LISTENER_MAX_BODY_BYTES"] = str(MAX_BODY)
            h.env["DURABLE_HARNESS_LISTENER_READ_TIMEOUT_S"] = str(READ_TIMEOUT_S)
            h.env["DURABLE_HARNESS_LISTENER_MAX_CONNECTIONS"] = str(MAX_CONNECTIONS)
        yield h


def _found(h: Harness, cli: Cli, ids: dict[str, str]) -> Any:
    """What the attack wrote into the workspace (escape.json)."""
    if cli.place == "host":
        return json.loads((h.tmp / "ws" / "escape.json").read_bytes())
    box = DockerSandbox(ids["session"])
    try:
        data = box.read_bytes("/workspace/escape.json")
    finally:
        box.close()
    return json.loads(data or b"null")


def _run(h: Harness, cli: Cli, *extra: str) -> tuple[Any, dict[str, str]]:
    extra = extra or ("--max-model-calls", "8")  # a script that fails makes the model loop
    workspace = "docker" if cli.place == "docker" else str(h.tmp / "ws")
    out = h.cli(
        "run", "--agent", cli.agent, "--workspace", workspace, *extra, "check the proxy",
        timeout=300,
    )  # fmt: skip
    return out, ids_of(out)


def _tool_outputs(h: Harness, ids: dict[str, str]) -> str:
    """The first tool step's output (what the script printed), for a failure's message."""
    steps = [s for s in h.show(ids["turn"])["steps"] if s["kind"] == "tool"]
    return json.dumps(steps[:1], indent=1)[:3000]


class WorkerThreads:
    """The thread count of the worker (the ``run`` process this test started), sampled
    every 0.2 s while the turn runs."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> WorkerThreads:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        pid: Path | None = None
        while not self._stop.wait(0.2):
            pid = pid or _worker()
            if pid is None:
                continue
            try:
                status = (pid / "status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("Threads:"):
                    self.samples.append(int(line.split()[1]))


def _worker() -> Path | None:
    for proc in Path("/proc").iterdir():
        try:
            status = (proc / "status").read_text()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid:")), "")
        if ppid == str(os.getpid()) and b"durable_harness.cli" in argv and b"run" in argv:
            return proc
    return None


def _assert_listener_attacks(found: dict[str, Any], cli: Cli, threads: list[int]) -> str:
    """Every listener attack refused, the listener serving after each, the idle connections
    bounded; the figures, printed by the caller."""
    lines = []
    listeners = found["listeners"]
    expected_targets = {"bridge", "relay-socket"} if cli.place == "docker" else {"proxy"}
    assert set(listeners["targets"]) == expected_targets, listeners
    for target, results in listeners["targets"].items():
        assert len(results) == 15, results
        for r in results:
            # Refused (its 4xx, or closed unanswered for a slow client), never a 5xx or a
            # traceback, and the listener answered the next authenticated request.
            assert r["status"] in r["expected"], (target, r)
            assert not r["traceback"], (target, r)
            assert r["servedAfter"], (target, r)
            if r["name"].startswith("slow"):
                assert r["seconds"] < 3 * READ_TIMEOUT_S + 2, (target, r)
        statuses = ", ".join(f"{r['name']} {r['status']} ({r['seconds']:.1f}s)" for r in results)
        lines.append(f"  {target}: {len(results)} attacks refused: {statuses}")
    idle = listeners["idle"]
    assert idle["openDuringProbes"] == idle["held"] == 250, idle
    assert idle["served"] == idle["probes"], idle
    assert idle["probeSeconds"] < 15, idle
    if cli.place == "docker":
        # The bridge's cap, the operator's: 250 idle and the CLI's own are under it, and
        # of 60 more at least the 10 past it were closed at once.
        assert 10 <= idle["overCap"] <= 20, idle
    # Each idle connection was closed by the far end within the read timeout (plus slack):
    # the bridge and relay for a silent one, the proxy for half a request line.
    assert idle["closedByFarEnd"] == idle["held"], idle
    assert idle["servedAfter"], idle
    # One event loop relays them all: no thread per connection (250 would be 500 threads).
    assert threads and max(threads) < 100, threads
    capped = ""
    if cli.place == "docker":
        capped = f"{idle['overCap']} of 60 more past the bridge's cap of {MAX_CONNECTIONS} closed at once; "
    lines.append(
        f"  {idle['held']} idle connections: {idle['served']}/{idle['probes']} authenticated "
        f"requests answered beside them in {idle['probeSeconds']:.2f} s; {capped}"
        f"{idle['closedByFarEnd']} closed by the far end within {READ_TIMEOUT_S} s + 4 s "
        f"({idle['answered408']} of them with a 408); worker threads at most {max(threads)} "
        f"({len(threads)} samples)"
    )
    return "\n".join(lines)


@pytest.fixture(params=list(CLIS))
def cli(request: pytest.FixtureRequest) -> Cli:
    return CLIS[request.param]


def test_requests_the_cli_did_not_make_are_refused(
    tmp_path: Path, cli: Cli, request: pytest.FixtureRequest
) -> None:
    if cli.place == "docker":
        request.getfixturevalue("docker_host")
    started = time.monotonic()
    for h in _harness(tmp_path, cli, "attacks"):
        with WorkerThreads() as threads:
            out, ids = _run(h, cli)
        seconds = time.monotonic() - started
        assert out.returncode == 0, out.stderr[-2000:] + _tool_outputs(h, ids)
        assert out.stdout.strip().splitlines()[-1] == FINAL
        found = _found(h, cli, ids)
        results = found["results"]
        assert len(results) == 14, results
        for result in results:
            assert result["refused"] and 400 <= result["status"] < 500, result
        # Upstream saw only the CLI's own two calls: none of the attacks.
        log = h.requests()
        assert [r["rule"] for r in log if r["rule"] != "title"] == ["attack", "final"], log
        assert not any("ATTACK-" in r["last_user_text"] for r in log), log
        # The journal holds the model's one tool call and nothing the attacks sent.
        tools = [s for s in h.show(ids["turn"])["steps"] if s["kind"] == "tool"]
        assert len(tools) == 1, tools
        print(
            f"\nproxy escape ({cli.agent} in {cli.place}, token from {found['from']}): "
            f"{len(results)} requests refused, {len(log)} upstream calls (the CLI's), "
            f"{seconds:.1f} s"
        )
        for result in results:
            print(f"  {result['name']}: {result['status']} {result['reason'][:160]}")
        if cli.listeners:
            # Every refusal was an answer or a close, never a crash of the worker's.
            assert "Traceback" not in out.stderr, out.stderr[-3000:]
            print(f"listener attacks ({cli.agent} in {cli.place}):")
            print(_assert_listener_attacks(found, cli, threads.samples))


def test_a_call_past_the_budget_is_refused_and_ends_the_turn(
    tmp_path: Path, docker_host: str
) -> None:
    cli = CLIS["claude-code"]
    started = time.monotonic()
    for h in _harness(tmp_path, cli, "budget"):
        out, ids = _run(h, cli, "--max-model-calls", "2")
        assert out.returncode != 0
        assert "the turn's limit is 2" in out.stderr, out.stderr
        show = h.show(ids["turn"])
        assert show["turn"]["status"] == "failed", show["turn"]
        # The CLI's first call and the one call inside the budget reached upstream; the
        # call past it did not (nor did the CLI's next one).
        log = h.requests()
        assert [r["last_user_text"] for r in log][1:] == ["ATTACK-budget-ok"], log
        assert len(log) == 2
        assert not any("budget-over" in r["last_user_text"] for r in log)
        print(
            f"\nproxy budget escape: call 3 of a 2-call budget refused, {len(log)} upstream "
            f"calls, {time.monotonic() - started:.1f} s"
        )
