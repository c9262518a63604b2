"""Probe an ACP agent against the scripted fake model and record everything it does.

    .venv/bin/python bench/acp_probe.py AGENT --script FILE.toml --out DIR [--prompt TEXT]...
        [--load] [--no-fs] [--no-terminal]

AGENT is one of ``claude-agent-acp``, ``claude-code-acp``, ``codex-acp``, ``opencode``
(the pinned packages under ``.tools/npm`` or the ones named by ``--bin``). The agent runs
as a child of this script with a private HOME (``DIR/home``) and workspace
(``DIR/workspace``), its model endpoint pointed at a fake model on loopback (no provider
is reachable here), speaking ACP over stdio to a client built on PyPI's
``agent-client-protocol``. Written to DIR:

- ``rpc.jsonl``: every JSON-RPC message, both directions, in order (``dir``, ``msg``);
- ``model.jsonl``: every model request body the fake model answered (path, JSON body);
- ``stderr.txt``: what the agent printed on stderr;
- ``home.txt``: the files the agent left in its HOME (path and size);
- ``fake.log``: the fake model's own log (rules matched, api key sent).

With ``--load`` the agent is started a second time on the same HOME and asked to
``session/load`` the first run's session, then given the last prompt again: what a
resume after a restart sees. This is a measuring tool for docs/acp.md and the presets,
not part of the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import acp
from acp import schema
from acp.connection import StreamEvent

from durable_harness.testing import fake_model
from durable_harness.testing.fake_model import FakeModelServer

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".tools" / "npm" / "node_modules" / ".bin"
TOKEN = "probe-token-0123456789"


def agent_command(agent: str, binary: str | None) -> list[str]:
    names = {
        "claude-agent-acp": ["claude-agent-acp"],
        "claude-code-acp": ["claude-code-acp"],
        "codex-acp": ["codex-acp"],
        "opencode": ["opencode", "acp"],
    }
    argv = names[agent]
    return [binary or str(BIN / argv[0]), *argv[1:]]


def agent_env(
    agent: str,
    home: Path,
    model_url: str,
    claude_bin: str | None,
    approval: str = "never",
    codex_model: str = "gpt-5.4",
    codex_extra: str = "",
) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
    }
    if agent.startswith("claude"):
        env |= {
            "ANTHROPIC_BASE_URL": model_url,
            "ANTHROPIC_API_KEY": TOKEN,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
            "IS_SANDBOX": "1",
        }
        if claude_bin:
            env["CLAUDE_CODE_EXECUTABLE"] = claude_bin
    elif agent == "codex-acp":
        codex_home = home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)
        (codex_home / "config.toml").write_text(
            f"model = {json.dumps(codex_model)}\n"
            'model_provider = "fake"\n'
            f'approval_policy = "{approval}"\n'
            'sandbox_mode = "danger-full-access"\n'
            "[model_providers.fake]\n"
            'name = "fake"\n'
            f'base_url = "{model_url}/v1"\n'
            'wire_api = "responses"\n'
            'env_key = "FAKE_API_KEY"\n'
            f"{codex_extra}\n",
            encoding="utf-8",
        )
        env |= {"CODEX_HOME": str(codex_home), "FAKE_API_KEY": TOKEN}
    elif agent == "opencode":
        cfg = home / ".config" / "opencode"
        cfg.mkdir(parents=True, exist_ok=True)
        (cfg / "opencode.json").write_text(
            json.dumps(
                {
                    "$schema": "https://opencode.ai/config.json",
                    "provider": {
                        "fake": {
                            "npm": "@ai-sdk/openai-compatible",
                            "name": "fake",
                            "options": {"baseURL": model_url + "/v1", "apiKey": TOKEN},
                            "models": {"fake-model": {"name": "fake-model"}},
                        }
                    },
                    "model": "fake/fake-model",
                    "small_model": "fake/fake-model",
                    "permission": {"bash": "allow", "edit": "allow"},
                }
            ),
            encoding="utf-8",
        )
        env |= {
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_SHARE": "1",
        }
    return env


_EXCHANGE = threading.local()
_handle = fake_model.handle


def _handle_keeping_headers(fake: Any, exchange: Any) -> None:
    _EXCHANGE.headers = dict(exchange.headers.items())
    _handle(fake, exchange)


# The fake model's handler sees the headers, its answerers only the body: keep them aside.
fake_model.handle = _handle_keeping_headers  # type: ignore[assignment]


class RecordingFake(FakeModelServer):
    """The fake model, also writing each request (headers, body) it answers to ``model.jsonl``."""

    def __init__(self, script: Path, out: Path) -> None:
        super().__init__(script, log_path=out / "fake.log")
        self._bodies = open(out / "model.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def _keep(self, path: str, body: bytes) -> None:
        try:
            parsed: Any = json.loads(body)
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        headers = getattr(_EXCHANGE, "headers", {})
        self._bodies.write(json.dumps({"path": path, "headers": headers, "body": parsed}) + "\n")
        self._bodies.flush()

    def answer_messages(self, body: bytes) -> Any:
        self._keep("/v1/messages", body)
        return super().answer_messages(body)

    def answer_responses(self, body: bytes) -> Any:
        self._keep("/v1/responses", body)
        return super().answer_responses(body)

    def answer_chat(self, body: bytes) -> Any:
        self._keep("/v1/chat/completions", body)
        return super().answer_chat(body)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant (read from /proc), children first seen first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, 9)


class Killed(Exception):
    """The probe killed the agent at the point it was asked to (``--kill-at``)."""


class ProbeClient:
    """An ACP client serving fs/* and terminal/* from the workspace, allowing every tool.

    With ``kill_at`` (``permission``, ``write``, ``terminal``) it kills the agent's whole
    process tree when that request first arrives, as a crashed worker would leave it.
    """

    def __init__(self, workspace: Path, kill_at: str | None = None) -> None:
        self.workspace = workspace
        self.terminals: dict[str, dict[str, Any]] = {}
        self.updates: list[str] = []
        self.kill_at = kill_at
        self.pid: int | None = None
        self.killed = asyncio.Event()

    def _maybe_kill(self, point: str) -> None:
        if self.kill_at == point and self.pid is not None and not self.killed.is_set():
            kill_tree(self.pid)
            self.killed.set()
            raise Killed(point)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> schema.RequestPermissionResponse:
        self._maybe_kill("permission")
        allow = next((o for o in options if o.kind == "allow_once"), options[0])
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(option_id=allow.option_id, outcome="selected")
        )

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(getattr(update, "session_update", type(update).__name__))

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> schema.WriteTextFileResponse:
        self._maybe_kill("write")
        Path(path).write_text(content, encoding="utf-8")
        return schema.WriteTextFileResponse()

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> schema.ReadTextFileResponse:
        text = Path(path).read_text(encoding="utf-8")
        if line is not None or limit is not None:
            lines = text.splitlines(keepends=True)
            start = (line or 1) - 1
            text = "".join(lines[start : start + limit if limit else None])
        return schema.ReadTextFileResponse(content=text)

    async def create_terminal(
        self,
        session_id: str,
        command: str,
        args: list[str] | None = None,
        env: list[Any] | None = None,
        cwd: str | None = None,
        output_byte_limit: int | None = None,
        **kwargs: Any,
    ) -> schema.CreateTerminalResponse:
        self._maybe_kill("terminal")
        extra = {e.name: e.value for e in env or []}
        # claude-code-acp sends a whole shell line as `command` with no `args`.
        argv = [command, *args] if args else ["/bin/sh", "-c", command]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd or str(self.workspace),
            env={**os.environ, **extra},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        tid = f"term-{len(self.terminals) + 1}"
        self.terminals[tid] = {"proc": proc, "out": b""}
        return schema.CreateTerminalResponse(terminal_id=tid)

    async def _finish(self, tid: str) -> dict[str, Any]:
        term = self.terminals[tid]
        proc: asyncio.subprocess.Process = term["proc"]
        if proc.returncode is None or not term.get("read"):
            out, _ = await proc.communicate()
            term["out"] += out or b""
            term["read"] = True
        return term

    async def terminal_output(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> schema.TerminalOutputResponse:
        term = await self._finish(terminal_id)
        code = term["proc"].returncode
        return schema.TerminalOutputResponse(
            output=term["out"].decode("utf-8", "replace"),
            truncated=False,
            exit_status=schema.TerminalExitStatus(exit_code=code),
        )

    async def wait_for_terminal_exit(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> schema.WaitForTerminalExitResponse:
        term = await self._finish(terminal_id)
        return schema.WaitForTerminalExitResponse(exit_code=term["proc"].returncode)

    async def release_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> None:
        self.terminals.pop(terminal_id, None)

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> None:
        proc = self.terminals[terminal_id]["proc"]
        if proc.returncode is None:
            proc.kill()

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise acp.RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None

    def on_connect(self, conn: Any) -> None:
        return None


async def one_run(
    args: argparse.Namespace, out: Path, model_url: str, prompts: list[str], load: str | None
) -> str:
    home, workspace = out / "home", out / "workspace"
    rpc = open(out / "rpc.jsonl", "a", encoding="utf-8")  # noqa: SIM115
    stderr = open(out / "stderr.txt", "ab")  # noqa: SIM115
    started = time.monotonic()

    def observe(event: StreamEvent) -> None:
        rpc.write(
            json.dumps(
                {
                    "t": round(time.monotonic() - started, 3),
                    "dir": event.direction.value,
                    "msg": event.message,
                }
            )
            + "\n"
        )
        rpc.flush()

    argv = agent_command(args.agent, args.bin)
    env = agent_env(
        args.agent,
        home,
        model_url,
        args.claude_bin,
        args.codex_approval,
        args.codex_model,
        "\n".join(args.codex_config),
    )
    env |= dict(item.split("=", 1) for item in args.env)
    if args.claude_settings:
        (home / ".claude").mkdir(parents=True, exist_ok=True)
        (home / ".claude" / "settings.json").write_text(args.claude_settings, encoding="utf-8")
    client = ProbeClient(workspace, args.kill_at if load is None else None)
    async with acp.spawn_agent_process(
        client,
        *argv,
        env=env,
        cwd=str(workspace),
        transport_kwargs={"stderr": stderr, "limit": 16 * 1024 * 1024},
        observers=[observe],
    ) as (conn, proc):
        client.pid = proc.pid
        init = await asyncio.wait_for(
            conn.initialize(
                protocol_version=acp.PROTOCOL_VERSION,
                client_capabilities=schema.ClientCapabilities(
                    fs=schema.FileSystemCapabilities(
                        read_text_file=not args.no_fs, write_text_file=not args.no_fs
                    ),
                    terminal=not args.no_terminal,
                ),
                client_info=schema.Implementation(name="durable-harness-probe", version="0"),
            ),
            args.timeout,
        )
        print("initialize:", init.model_dump_json(exclude_none=True), file=sys.stderr)
        mcp: list[Any] = []
        if args.mcp_stdio:
            mcp.append(schema.McpServerStdio(name="probe", command=args.mcp_stdio, args=[], env=[]))
        if load is None:
            meta = json.loads(args.session_meta) if args.session_meta else {}
            session = await asyncio.wait_for(
                conn.new_session(cwd=str(workspace), mcp_servers=mcp, **meta), args.timeout
            )
            sid = session.session_id
        else:
            await asyncio.wait_for(
                conn.load_session(cwd=str(workspace), session_id=load, mcp_servers=mcp),
                args.timeout,
            )
            sid = load
        for prompt in prompts:
            turn = asyncio.ensure_future(
                conn.prompt(
                    session_id=sid, prompt=[schema.TextContentBlock(type="text", text=prompt)]
                )
            )
            killed = asyncio.ensure_future(client.killed.wait())
            done, _ = await asyncio.wait(
                {turn, killed}, timeout=args.timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if killed in done:
                turn.cancel()
                print("prompt -> killed at", args.kill_at, file=sys.stderr)
                break
            killed.cancel()
            if turn not in done:
                raise TimeoutError(f"no answer to session/prompt within {args.timeout} s")
            print("prompt ->", turn.result().stop_reason, file=sys.stderr)
        print("updates:", sorted(set(client.updates)), file=sys.stderr)
        if proc.returncode is None:
            proc.terminate()
    rpc.close()
    stderr.close()
    return sid


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "agent", choices=["claude-agent-acp", "claude-code-acp", "codex-acp", "opencode"]
    )
    parser.add_argument("--script", type=Path, required=True, help="the fake model's script (TOML)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the records (emptied)")
    parser.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    parser.add_argument(
        "--load", action="store_true", help="restart and session/load, then prompt again"
    )
    parser.add_argument("--no-fs", action="store_true", help="offer no fs/* capability")
    parser.add_argument("--no-terminal", action="store_true", help="offer no terminal/* capability")
    parser.add_argument("--mcp-stdio", help="offer this command as a stdio MCP server")
    parser.add_argument("--bin", help="the agent binary (default: the pinned one in .tools/npm)")
    parser.add_argument("--claude-bin", help="CLAUDE_CODE_EXECUTABLE for the Claude agents")
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for the agent (repeatable)"
    )
    parser.add_argument(
        "--kill-at",
        choices=["permission", "write", "terminal"],
        help="kill the agent there, then load",
    )
    parser.add_argument("--resume-prompt", action="append", help="the prompt after the restart")
    parser.add_argument("--claude-settings", help="JSON: ~/.claude/settings.json for Claude")
    parser.add_argument("--session-meta", help="JSON object: session/new's _meta")
    parser.add_argument("--codex-model", default="gpt-5.4", help="codex-acp's model")
    parser.add_argument("--codex-config", action="append", default=[], help="a TOML line")
    parser.add_argument("--codex-approval", default="never", help="codex-acp's approval_policy")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    (args.out / "home").mkdir(parents=True)
    (args.out / "workspace").mkdir(parents=True)
    (args.out / "workspace" / "notes.txt").write_text("one\ntwo\n", encoding="utf-8")
    prompts = args.prompt or ["Say hello."]
    with RecordingFake(args.script, args.out) as fake:
        sid = await one_run(args, args.out, fake.url, prompts, None)
        if args.load or args.kill_at:
            await one_run(args, args.out, fake.url, args.resume_prompt or prompts[-1:], sid)
    with open(args.out / "home.txt", "w", encoding="utf-8") as listing:
        for path in sorted((args.out / "home").rglob("*")):
            if path.is_file():
                listing.write(f"{path.relative_to(args.out / 'home')}\t{path.stat().st_size}\n")


if __name__ == "__main__":
    asyncio.run(main())
