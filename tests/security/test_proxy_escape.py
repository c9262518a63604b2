# ruff: noqa: E501  (the fake model script keeps one rule per line)
"""Escape tests of the journaling proxy, from inside: each of the four CLIs (Claude Code,
Codex, OpenCode, Pi) in the Docker sandbox, one scripted turn each, the CLI's own shell
tool running a script the model sent base64-encoded (so no command screening can read
it), which finds the proxy's per-launch token and URL as any
process in the container can (the CLI's environment, ``/proc/*/environ``, the launch's
HOME) and sends 14 model requests the CLI did not make, in the CLI's own API: another
model, a huge ``max_tokens`` (and thinking budget), provider-side tools (web search and
fetch, code execution, MCP, file search), a foreign beta or another account scope, state
stored on the account (``previous_response_id``, ``store``, ``background``), content the
provider would fetch from a URL, unknown paths, another API's path; then, in a Claude
Code turn with a budget of two model calls, one call past it.

Each is refused with the proxy's reason; the fake model's request log shows none of them
(every request it received is one the CLI made, or the one in-budget call); the first
turns finish with their scripted reply, the budget's turn ends failed with its reason.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import Harness, ids_of, make_harness

from durable_harness.sandbox.docker import DockerSandbox

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
  fs.writeFileSync('/workspace/escape.json', JSON.stringify(out));
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
    env: dict[str, str]


CLIS = {
    "claude-code": Cli(
        "claude-code",
        "claude-sonnet-4-5",
        "anthropic",
        '{{ name = "Bash", input = {{ command = "{command}", description = "check" }} }}',
        {},
    ),
    "codex": Cli(
        "codex",
        "gpt-5-codex",
        "responses",
        '{{ name = "exec_command", input = {{ cmd = "{command}", yield_time_ms = 60000 }} }}',
        {},
    ),
    "opencode": Cli(
        "opencode",
        "claude-sonnet-4-5",
        "anthropic",
        '{{ name = "bash", input = {{ command = "{command}", description = "check" }} }}',
        {},
    ),
    "pi": Cli(
        "pi",
        "claude-sonnet-4-5",
        "anthropic",
        '{{ name = "bash", input = {{ command = "{command}" }} }}',
        {},
    ),
}


def _command(cli: Cli, mode: str) -> str:
    """The shell command: the script base64-encoded, decoded and run by node."""
    encoded = base64.b64encode(_ATTACK.encode()).decode()
    return f"echo {encoded} | base64 -d > /tmp/p.js && node /tmp/p.js {cli.model} {cli.wire} {mode}"


def _harness(tmp: Path, cli: Cli, mode: str) -> Iterator[Harness]:
    script = tmp / f"script-{mode}.toml"
    tool_use = cli.tool_use.format(command=_command(cli, mode))
    script.write_text(_SCRIPT.format(final=FINAL, tool_use=tool_use))
    for h in make_harness(tmp, script):
        h.env["OPENAI_BASE_URL"] = h.server.url
        h.env.pop("OPENAI_API_KEY", None)
        yield h


def _container_json(session: str, path: str) -> Any:
    box = DockerSandbox(session)
    try:
        data = box.read_bytes(path)
    finally:
        box.close()
    return json.loads(data or b"null")


def _run(h: Harness, cli: Cli, *extra: str) -> tuple[Any, dict[str, str]]:
    extra = extra or ("--max-model-calls", "8")  # a script that fails makes the model loop
    out = h.cli(
        "run", "--agent", cli.agent, "--workspace", "docker", *extra, "check the proxy",
        timeout=300,
    )  # fmt: skip
    return out, ids_of(out)


def _tool_outputs(h: Harness, ids: dict[str, str]) -> str:
    """The first tool step's output (what the script printed), for a failure's message."""
    steps = [s for s in h.show(ids["turn"])["steps"] if s["kind"] == "tool"]
    return json.dumps(steps[:1], indent=1)[:3000]


@pytest.fixture(params=list(CLIS))
def cli(request: pytest.FixtureRequest) -> Cli:
    return CLIS[request.param]


def test_requests_the_cli_did_not_make_are_refused(
    tmp_path: Path, docker_host: str, cli: Cli
) -> None:
    started = time.monotonic()
    for h in _harness(tmp_path, cli, "attacks"):
        out, ids = _run(h, cli)
        assert out.returncode == 0, _tool_outputs(h, ids)
        assert out.stdout.strip().splitlines()[-1] == FINAL
        found = _container_json(ids["session"], "/workspace/escape.json")
        results = found["results"]
        assert len(results) == 14, results
        for result in results:
            assert result["refused"] and 400 <= result["status"] < 500, result
        # Upstream saw only the CLI's own two calls: none of the attacks.
        log = h.requests()
        assert [r["rule"] for r in log if r["rule"] != "title"] == ["attack", "final"], log
        assert not any("ATTACK-" in r["last_user_text"] for r in log), log
        print(
            f"\nproxy escape ({cli.agent} in Docker, token from {found['from']}): "
            f"{len(results)} requests refused, {len(log)} upstream calls (the CLI's), "
            f"{time.monotonic() - started:.1f} s"
        )
        for result in results:
            print(f"  {result['name']}: {result['status']} {result['reason'][:160]}")


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
