"""The codex agent: the real ``codex`` CLI (OpenAI Codex 0.171.0) behind the journaling proxy.

Built like the claude-code agent (:mod:`.claude_code.adapter`); what is Codex's own:

* model calls: Codex speaks the OpenAI Responses API; its ``config.toml`` names one model
  provider whose ``base_url`` is the proxy (``/v1/responses``, :mod:`.proxy.wire.responses`)
  and whose key variable holds the per-launch token, never a provider key. Requests are
  keyed by :class:`~.codex.canonical.CodexCanonicalizer`;
* tool calls: ``$CODEX_HOME/hooks.json`` has Claude Code's hook shape (``PreToolUse``
  with ``tool_name``, ``tool_input``, ``tool_use_id`` = the call id; deny and exit 2 block
  the tool), so :class:`~.hooks.ToolHooks` journals them; the shell tool (``exec_command``)
  is reported as ``Bash`` with ``{"command": …}`` and labelled like Claude Code's Bash
  (``never`` unless a ``safe_bash`` pattern marks the command safe);
* host tools and the wait tools: served over MCP by the proxy (:mod:`.codex.tools`, the
  call id from ``_meta.callId``); a wait still pending stops the CLI and parks the turn
  (:class:`~.cli.waits.WaitGate` stop mode, Codex has no ``defer``), and the next
  delivery settles the wait before resuming;
* the session record is the thread's rollout file (:mod:`.codex.session`), read where the
  CLI runs and saved before every tool intent, restored into a fresh ``CODEX_HOME`` for
  ``codex exec resume``;
* a resumed launch gets the same journal-written message as Claude Code
  (:func:`~.cli.records.compose_resume_message`), on stdin (``-``: Codex appends piped
  stdin to a prompt given as an argument, measured).

Where it runs is a :class:`~.cli.host.CliHost` (:func:`~.codex.setup.open_host`): the
session's Docker container, as a detached job a new worker re-attaches to after the old
one died (the only place by default), or a host folder under the developer opt-in.
Which launch runs next is decided as for Claude Code: the last launch finished → its
reply; its CLI still runs in the container (or ended well) → follow it again from its
first output line; a rollout of this turn was saved → ``resume`` it; otherwise start as
the turn first did.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import threading
import time
from pathlib import PurePosixPath
from typing import Any

from durable_harness.adapters.base import Adapter, TurnRun
from durable_harness.adapters.cli.hooks import (
    AgentConfig,
    ReplayPolicy,
    ToolHooks,
    save_before_host_calls,
)
from durable_harness.adapters.cli.host import CliHost, CliLaunch, CliRun, follow
from durable_harness.adapters.cli.jobs import launch_token
from durable_harness.adapters.cli.launches import close_interrupted, finished_reply, run_launches
from durable_harness.adapters.cli.mcp import SERVER_NAME
from durable_harness.adapters.cli.records import TranscriptStore, compose_resume_message
from durable_harness.adapters.cli.waits import WaitGate
from durable_harness.adapters.codex.canonical import CodexCanonicalizer
from durable_harness.adapters.codex.output import CodexOutput
from durable_harness.adapters.codex.session import (
    Rollout,
    latest_turn_rollout,
    lost_reply,
    point,
    previous_turn_rollout,
    rollout_facts,
)
from durable_harness.adapters.codex.setup import (
    CODEX_VERSION,
    check_version,
    codex_model,
    find_codex,
    open_host,
    resolve_openai_endpoint,
    workspace_spec,
)
from durable_harness.adapters.codex.tools import HOST_TOOL_PREFIX, CodexHostTools
from durable_harness.adapters.proxy.server import JournalingProxy, ProxyCallbacks, Upstream
from durable_harness.core.errors import DurableHarnessError, LeaseLost
from durable_harness.core.sandbox import Sandbox
from durable_harness.core.types import Replay, StepStatus, TurnStatus
from durable_harness.harness.model import is_loopback
from durable_harness.harness.tools import Tool, load_user_tools
from durable_harness.harness.waits import WAIT_TOOL_NAMES
from durable_harness.harness.workspace import SnapshotStore, restore_workspace, save_workspace

__all__ = ["CODEX_VERSION", "CodexAdapter", "CodexReplayPolicy", "codex_model", "find_codex"]

RETRIES_ENV = "DURABLE_HARNESS_CODEX_MAX_RETRIES"
DEFAULT_CLI_RETRIES = "2"
TOKEN_ENV = "DURABLE_HARNESS_CODEX_TOKEN"  # the variable Codex reads its "API key" from
PROVIDER = "durable-harness"
_HOOK_EVENTS = ("SessionStart", "PreToolUse", "PostToolUse")
_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")
_FLUSH_WAIT = 3.0  # seconds the rollout may take to show a tool call before a save
_HOOKS_WAIT = 10.0  # seconds the first model call waits for proof the hooks are live
_THREAD_IN_NAME = re.compile(
    r"-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$"
)


class CodexAdapter(Adapter):
    name = "codex"

    def check(self, config: dict[str, Any], settings: Any) -> None:
        spec = workspace_spec(config)
        load_user_tools(config.get("tools", []), WAIT_TOOL_NAMES)
        AgentConfig.parse(config.get("agent_config"), "in the turn")
        resolve_openai_endpoint(config.get("base_url"))
        if spec == "docker":
            from durable_harness.sandbox import open_sandbox

            open_sandbox("docker").close()  # Docker answers and the image is built
        else:
            check_version(find_codex())

    def run_turn(self, run: TurnRun) -> str:
        reply = finished_reply(run)
        if reply is not None:
            return reply
        with open_host(run.config, run.turn.session_id) as host:
            return run_launches(run, self.name, host, _Launch(run, host))


class _Launch:
    """One run of the CLI for a turn."""

    def __init__(self, run: TurnRun, host: CliHost) -> None:
        self.run_ = run
        self.host = host
        self.world = run.world
        self.journal = run.journal
        self.turn = run.turn
        self.config = AgentConfig.parse(run.config.get("agent_config"), "in the turn")
        self.store = TranscriptStore(self.world)
        self.snapshots = SnapshotStore(self.world)
        self._save_lock = threading.Lock()
        # Codex has no `defer` hook decision: the gate's stop mode (cli/waits.py) stops the
        # CLI at a pending wait and the next delivery settles the wait before resuming.
        self.gate = WaitGate.for_turn(run)
        #: The host tools served over MCP: the user's, and the wait tools.
        self.tools: list[Tool] = [
            *load_user_tools(run.config.get("tools", []), WAIT_TOOL_NAMES),
            *self.gate.tools,
        ]

    # -- what to run -----------------------------------------------------------------
    def plan(self, number: int) -> dict[str, Any]:
        """How launch ``number`` starts: mode, message and the rollout to restore."""
        turn, epoch = self.turn, self.journal.lease.epoch
        saved = latest_turn_rollout(self.world, turn.session_id, turn.turn_id, epoch)
        if saved is None:
            previous = previous_turn_rollout(self.world, turn.session_id, turn.index)
            return {
                "mode": "resume" if previous is not None else "new",
                "message": turn.prompt,
                "rollout": previous.as_json() if previous is not None else None,
            }
        close_interrupted(
            self.journal,
            self.world,
            CodexReplayPolicy(self.config),
            self.tools,
        )
        steps = sorted(self.journal.recorded.values(), key=lambda s: s.seq)
        facts = rollout_facts(self.world, steps, self.store.load(saved.transcript))
        message = compose_resume_message(self.world, turn.prompt, steps, facts, lost_reply)
        return {"mode": "resume", "message": message, "rollout": saved.as_json(), "launch": number}

    # -- running it ----------------------------------------------------------------------
    def run(self, plan: dict[str, Any], job: str, cli: CliRun | None = None) -> dict[str, Any]:
        """Run the launch ``job`` (or follow ``cli``, the same launch started by an earlier
        worker) to its end; its reply, thread and final rollout."""
        host = self.host
        binary = host.binary("codex")
        check_version(binary, host)
        url, key = resolve_openai_endpoint(self.run_.config.get("base_url"))
        home = host.home(job)
        codex_home = f"{home}/.codex"
        restored = Rollout.of(plan.get("rollout"))
        sandbox = getattr(host, "sandbox", None)
        if cli is None and sandbox is not None and not self.journal.replay_only:
            # A new container (the old one was lost) gets the workspace back from the World.
            digest = self.journal.latest_meta("workspace") or self._session_workspace()
            restore_workspace(sandbox, self.snapshots, digest)
        saver = None if self.journal.replay_only else self._saver(codex_home)
        hooks = ToolHooks(
            self.journal,
            CodexReplayPolicy(self.config),
            host_tool_prefix=HOST_TOOL_PREFIX,
            before_intent=saver,
            waits=self.gate,
            outcome_meta=None if sandbox is None else self._snapshotter(sandbox),
            adopt=cli is not None,
        )
        if cli is not None:
            hooks.session_started.set()  # it started under the earlier worker
        mcp = CodexHostTools(
            self.journal, self.tools, self.turn.session_id, self.gate.signal_secret
        )
        control = save_before_host_calls(self.journal, hooks.handle, saver, HOST_TOOL_PREFIX)
        callbacks = ProxyCallbacks(
            on_request=self._on_request(hooks), control=control, mcp=mcp.handle
        )
        token = launch_token(self.turn.config, job) if host.durable else secrets.token_urlsafe(32)
        proxy = JournalingProxy(
            self.journal,
            CodexCanonicalizer(home=home),
            Upstream(url, key, send_key=is_loopback(url)),
            token,
            callbacks,
        )
        output = CodexOutput(thread=restored.thread if restored else None)
        progress = self.journal.on_step is not None  # not --quiet
        with proxy:
            endpoint = host.endpoint(proxy.url, job)
            self.gate.stop = proxy.fail  # a pending wait stops the CLI (then parks)
            if cli is None:
                cli = host.start(self._launch(job, binary, home, endpoint, token, plan, restored))
            try:
                status = follow(
                    cli,
                    proxy.fatal_event,
                    lambda line: output.feed(line, show_progress=progress),
                    lambda: isinstance(proxy.fatal, LeaseLost),
                )
            finally:
                self.gate.stopped.set()  # the CLI is gone: release a held wait hook
            stderr = cli.stderr_tail()
        if proxy.fatal is not None:
            raise proxy.fatal
        reply = output.reply(status, stderr, proxy.upstream_errors)
        final = self._final_rollout(codex_home, output.thread)
        result: dict[str, Any] = {"reply": reply, "thread": output.thread}
        if not self.journal.replay_only and final is not None:
            path, data = final
            saved = self.store.save(data)
            rollout = Rollout(str(output.thread), path, saved.digest)
            result["rollout"] = rollout.as_json()
        # The HOME (with the rollout) goes only once the launch is journaled (the caller's
        # host.finish): a worker that dies before re-attaches and reads the rollout again.
        return result

    def _session_workspace(self) -> str | None:
        """The newest workspace snapshot of the session's earlier, finished turns."""
        digest: str | None = None
        for turn in self.world.list_turns(self.turn.session_id):
            if turn.index < self.turn.index and turn.status is TurnStatus.DONE:
                for step in self.world.load_steps(turn.turn_id):
                    if step.status is StepStatus.DONE and "workspace" in step.meta:
                        digest = str(step.meta["workspace"])
        return digest

    def _snapshotter(self, sandbox: Sandbox) -> Any:
        def outcome_meta() -> dict[str, Any]:
            # The workspace as this tool left it: a new container is restored from it.
            with self._save_lock:
                digest = save_workspace(sandbox, self.snapshots)
            return {} if digest is None else {"workspace": digest}

        return outcome_meta

    def _saver(self, codex_home: str) -> Any:
        def before_intent(reported: str | None, tool_use_id: str) -> None:
            if not reported:
                raise DurableHarnessError("Codex's hook named no rollout file to save")
            rollout = PurePosixPath(reported)
            match = _THREAD_IN_NAME.search(rollout.name)
            if match is None or not rollout.is_relative_to(codex_home):
                raise DurableHarnessError(f"Codex's rollout file is not where expected: {reported}")
            # Wait (briefly) until the rollout holds this call, so a resume from this save
            # knows the call exists.
            deadline = time.monotonic() + _FLUSH_WAIT
            data = b""
            while time.monotonic() < deadline:
                data = self.host.read_file(reported) or b""
                if tool_use_id.encode() in data:
                    break
                time.sleep(0.02)
            with self._save_lock:
                saved = self.store.save(data)
                relative = str(rollout.relative_to(codex_home))
                turn, epoch = self.turn, self.journal.lease.epoch
                point(
                    self.world,
                    turn.session_id,
                    turn.turn_id,
                    epoch,
                    Rollout(match.group(1), relative, saved.digest),
                )

        return before_intent

    def _on_request(self, hooks: ToolHooks) -> Any:
        def on_request(body: dict[str, Any]) -> None:
            hooks.require_started(
                _HOOKS_WAIT, "Codex did not run the durable-harness hooks (no SessionStart arrived)"
            )
            _close_from_request(hooks, body)

        return on_request

    def _launch(
        self,
        job: str,
        binary: str,
        home: str,
        url: str,
        token: str,
        plan: dict[str, Any],
        restored: Rollout | None,
    ) -> CliLaunch:
        # The hook client finds the proxy through this file (in HOME, beside the Docker
        # host's node hook client).
        endpoint = f"{home}/durable-harness-endpoint.json"
        hook = {
            event: [
                {
                    "matcher": "*",
                    "hooks": [
                        {
                            "type": "command",
                            "command": shlex.join(self.host.hook_command(endpoint, event)),
                            "timeout": 600,
                        }
                    ],
                }
            ]
            for event in _HOOK_EVENTS
        }
        files = {
            "durable-harness-endpoint.json": json.dumps({"url": url, "token": token}).encode(),
            ".codex/hooks.json": json.dumps({"hooks": hook}, indent=1).encode(),
            ".codex/config.toml": self._config_toml(url).encode(),
        }
        if restored is not None:
            files[f".codex/{restored.path}"] = self.store.load(restored.transcript)
        command = [
            binary,
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--dangerously-bypass-hook-trust",  # hooks.json is ours, written per launch
        ]
        if plan["mode"] == "resume":
            if restored is None:
                raise DurableHarnessError("a resumed Codex launch has no thread to resume")
            command += ["resume", restored.thread]
        env = {
            "HOME": home,
            "CODEX_HOME": f"{home}/.codex",
            "TERM": "dumb",
            TOKEN_ENV: token,  # the proxy's per-launch token, never a provider key
        }
        # "-": the message on stdin (piped stdin would be appended to an argument prompt).
        return CliLaunch(job, [*command, "-"], env, str(plan["message"]).encode(), files)

    def _config_toml(self, url: str) -> str:
        model = codex_model(self.run_.config)
        retries = int(os.environ.get(RETRIES_ENV, DEFAULT_CLI_RETRIES))
        return (
            f"model = {json.dumps(model)}\n"
            f'model_provider = "{PROVIDER}"\n'
            'approval_policy = "never"\n'
            'sandbox_mode = "danger-full-access"\n'
            f'\n[model_providers."{PROVIDER}"]\n'
            f'name = "{PROVIDER}"\n'
            f"base_url = {json.dumps(url + '/v1')}\n"
            'wire_api = "responses"\n'
            f'env_key = "{TOKEN_ENV}"\n'
            f"request_max_retries = {retries}\n"
            f"stream_max_retries = {retries}\n"
            # The harness's own MCP server: the host tools (streamable HTTP, the proxy's
            # per-launch token as bearer, read from the same variable as the model key).
            f'\n[mcp_servers."{SERVER_NAME}"]\n'
            f"url = {json.dumps(url + '/mcp')}\n"
            f'bearer_token_env_var = "{TOKEN_ENV}"\n'
            # Measured: without `required`, Codex starts its first model request after ~2 s
            # whether or not the server listed its tools, so the request's tools (and its
            # journal key) would depend on timing; `required` makes it wait (or fail).
            "required = true\n"
            "startup_timeout_sec = 60\n"
        )

    def _final_rollout(self, codex_home: str, thread: str | None) -> tuple[str, bytes] | None:
        if thread is None:
            return None
        found = self.host.find_files(f"{codex_home}/sessions", f"rollout-*-{thread}.jsonl")
        data = self.host.read_file(found[-1]) if found else None
        if data is None:
            return None
        return str(PurePosixPath(found[-1]).relative_to(codex_home)), data


def _close_from_request(hooks: ToolHooks, body: dict[str, Any]) -> None:
    """Record, from a model request, the output of a call whose PostToolUse never came."""
    items = body.get("input")
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("type") in _OUTPUT_ITEMS:
            value = {"tool_output": item.get("output")}
            hooks.close_open(str(item.get("call_id")), value, "proxy")


class CodexReplayPolicy(ReplayPolicy):
    """Claude Code's labels, with Codex's tool names: Codex reports its shell tool
    ``exec_command`` to the hooks as ``Bash``, so a label given to either name applies."""

    ALIASES = {"Bash": "exec_command"}

    def label(self, tool_name: str, tool_input: Any) -> Replay:
        overrides = self.config.replay.tools
        alias = self.ALIASES.get(tool_name)
        if alias is not None and tool_name not in overrides and alias in overrides:
            return overrides[alias]
        return super().label(tool_name, tool_input)
