"""The launches of an ACP agent's turn (a :class:`~.cli.launches.Launcher` for
:func:`~.cli.launches.run_launches`, as every CLI's).

One launch is one run of the agent's ACP command, a journal step ``launch:<n>`` whose
input is its :class:`~.cli.launches.LaunchPlan`. Inside it:

* model calls go through :class:`~.proxy.server.JournalingProxy` on the preset's wire,
  keyed by its canonicalizer, upstream the harness's own key; the agent gets the
  per-launch token (the preset writes endpoint and token into its HOME or env);
* the agent's own tools are journaled at ``session/request_permission``
  (:mod:`.acp.tools`), its ``fs/*`` and ``terminal/*`` requests are journaled sandbox
  steps (:mod:`.acp.requests`), the host tools and the wait tools are served over MCP
  (``session/new``'s ``mcpServers``: the proxy's ``/mcp``) under their own labels;
* the session record (:mod:`.acp.record`) is saved before each tool intent and after the
  launch; a resumed launch restores it and loads the session (``session/load``) when the
  agent advertises ``loadSession``, else starts a new one; either way its prompt is the
  resume message written from the journal (finished / possibly ran / never started).

A pending wait stops the agent (stop mode, as for Codex, Pi and OpenCode): the launch
stays an intent and the next delivery settles the wait and resumes.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

from durable_harness.adapters.acp.client import HarnessClient
from durable_harness.adapters.acp.docker import start_in_docker
from durable_harness.adapters.acp.preset import (
    AcpHome,
    AcpPreset,
    resolve_upstream,
    turn_model,
    wire_canonicalizer,
    wire_path,
)
from durable_harness.adapters.acp.process import Agent, start_on_host
from durable_harness.adapters.acp.record import AcpRecord, load
from durable_harness.adapters.acp.requests import SandboxRequests
from durable_harness.adapters.acp.session import Conversation, converse
from durable_harness.adapters.acp.tools import AcpConfig, AcpReplayPolicy, PermissionHook
from durable_harness.adapters.acp.transport import DEFAULT_MAX_LINE
from durable_harness.adapters.acp.version import check_initialized, check_version
from durable_harness.adapters.base import TurnRun
from durable_harness.adapters.cli.docker_host import DockerCliHost
from durable_harness.adapters.cli.hooks import ToolHooks
from durable_harness.adapters.cli.host import CliHost, CliRun, HostCliHost
from durable_harness.adapters.cli.jobs import xdg_env
from durable_harness.adapters.cli.launches import LaunchPlan, close_interrupted
from durable_harness.adapters.cli.ledger import ToolLedger
from durable_harness.adapters.cli.mcp import TOOL_USE_META, HostToolServer
from durable_harness.adapters.cli.provider_api import anthropic_view
from durable_harness.adapters.cli.records import (
    TranscriptFacts,
    previous_turn_transcript,
    resume_message_from_facts,
)
from durable_harness.adapters.cli.waits import WaitGate
from durable_harness.adapters.cli.where import Workspaces
from durable_harness.adapters.proxy.policy import policy_of
from durable_harness.adapters.proxy.server import JournalingProxy, ProxyCallbacks, Upstream
from durable_harness.adapters.push_tool import GIT_PUSH, push_tools
from durable_harness.core.errors import DurableHarnessError, TurnCancelled
from durable_harness.core.sandbox import Sandbox
from durable_harness.harness.endpoint import is_loopback
from durable_harness.harness.tools import Tool, load_user_tools
from durable_harness.harness.waits import WAIT_TOOL_NAMES

__all__ = ["INITIALIZE_TIMEOUT_ENV", "AcpLauncher"]

#: The operator's ceiling on the seconds ``initialize`` may take (the preset's otherwise).
INITIALIZE_TIMEOUT_ENV = "DURABLE_HARNESS_ACP_INITIALIZE_TIMEOUT"
_NO_FACTS = TranscriptFacts(frozenset(), frozenset(), frozenset())


class AcpLauncher:
    """Plans and runs the launches of one turn of an ACP agent."""

    def __init__(self, preset: AcpPreset, run: TurnRun, host: CliHost) -> None:
        self.preset = preset
        self.run_ = run
        self.host = host
        self.journal = run.journal
        self.turn_config = run.turn_config
        self.config = AcpConfig.parse(self.turn_config.agent_config, "in the turn")
        self.policy = AcpReplayPolicy(self.config, preset.safe_tools)
        self._save_lock = threading.Lock()
        self.workspaces = Workspaces(run, self._save_lock)
        self.gate = WaitGate.for_turn(run)
        self.ledger = ToolLedger(run.journal)
        self.record = AcpRecord(run.world, preset.name, preset.record_files)
        self.tools: list[Tool] = [
            *load_user_tools(self.turn_config.tools, [*WAIT_TOOL_NAMES, GIT_PUSH]),
            *self.gate.tools,
            *push_tools(
                self.turn_config,
                self._sandbox,
                run.settings.push_max_bytes,
                run.world,
                run.settings.push_branches,
            ),
        ]

    def _sandbox(self) -> AbstractContextManager[Sandbox]:
        """The turn's sandbox: the session's container, or the host folder opened as one
        (its bash runs as the agent user, like the agent)."""
        sandbox = getattr(self.host, "sandbox", None)
        if isinstance(sandbox, Sandbox):
            return nullcontext(sandbox)
        from durable_harness.sandbox import open_sandbox

        return open_sandbox(self.turn_config.workspace)

    # -- which launch ------------------------------------------------------------------

    def plan(self, number: int) -> LaunchPlan:
        run = self.run_
        turn = run.turn
        saved = self.record.latest(turn.session_id, turn.turn_id, run.journal.lease.epoch)
        if saved is None:
            previous = previous_turn_transcript(run.world, turn.session_id, turn.index)
            mode: Literal["new", "resume"] = "resume" if previous is not None else "new"
            return LaunchPlan(mode, turn.prompt, previous, None, "transcript")
        secret = run.turn_config.signal_secret or ""
        close_interrupted(self.journal, run.world, self.policy, self.tools, secret)
        steps = sorted(self.journal.recorded.values(), key=lambda s: s.seq)
        message = resume_message_from_facts(run.world, turn.prompt, steps, _NO_FACTS)
        return LaunchPlan("resume", message, saved, number, "transcript")

    # -- one launch --------------------------------------------------------------------

    def run(self, plan: LaunchPlan, job: str, cli: CliRun | None = None) -> dict[str, Any]:
        if cli is not None:  # an ACP launch never outlives its worker (acp/docker.py)
            cli.kill()
            raise DurableHarnessError("the agent's earlier launch was stopped; resuming")
        preset, host, journal, run = self.preset, self.host, self.journal, self.run_
        turn = run.turn
        home = host.home(job)
        token = secrets.token_urlsafe(32)
        model = turn_model(preset, self.turn_config.model, run.settings.model)
        restored = load(run.world, str(plan.record)) if plan.record else None
        self.record.session = restored.session if restored is not None else None
        epoch = journal.lease.epoch

        def save() -> None:
            if journal.replay_only:
                return
            with self._save_lock:
                self.record.save(host, home, turn.session_id, turn.turn_id, epoch)

        def before_intent(reported: str | None, tool_use_id: str) -> None:
            if self.ledger.find(tool_use_id) is not None:
                save()

        sandbox = host.sandbox if isinstance(host, DockerCliHost) else None
        snapshot = None if sandbox is None else self.workspaces.saver(sandbox)
        hooks = ToolHooks(
            journal,
            self.policy,
            host_tool_prefix=preset.host_tool_prefix,
            before_intent=before_intent,
            waits=self.gate,
            outcome_meta=snapshot,
            ledger=self.ledger,
            host_tools=frozenset(t.name for t in self.tools),
        )
        hooks.session_started.set()  # the permission requests are the hooks: always live
        permissions = PermissionHook(hooks, frozenset(self.config.deny), preset.client_served_tools)
        server = HostToolServer(
            journal, self.tools, turn.session_id, self.gate.signal_secret, self.ledger
        )
        url, key = resolve_upstream(preset.wire, self.turn_config.base_url)

        def on_request(body: dict[str, Any]) -> None:
            view = anthropic_view(body)
            permissions.settle(_result_ids(view), 60.0)
            hooks.close_from_request(view)

        proxy = JournalingProxy(
            journal,
            wire_canonicalizer(preset, AcpHome(home, "", token, model, host.workspace)),
            Upstream(url, key, send_key=is_loopback(url)),
            token,
            ProxyCallbacks(
                on_request=on_request,
                control=lambda event, payload: {},
                mcp=_with_call_ids(server, permissions),
            ),
            models=(model, *preset.extra_models),
            wires=(wire_path(preset.wire),),
            policy=policy_of(run.settings),
        )
        self.ledger.settle = proxy.steps.wait_idle
        requests = SandboxRequests(
            journal,
            self._sandbox,
            labels={m: r for m, r in self.config.replay.tools.items() if "/" in m},
            outcome_meta=snapshot,
            timeout=run.settings.max_tool_timeout,
            before_intent=save,
        )
        client = HarnessClient(requests, permissions, show=journal.on_step is not None)
        check_version(preset, host, host.binary(preset.binary))
        if sandbox is not None and not journal.replay_only:
            self.workspaces.restore(sandbox)  # a new container gets the workspace back
        with proxy:
            endpoint = host.endpoint(proxy.url, job, plan.port)
            binary = host.binary(preset.binary)
            files, env = preset.home(
                AcpHome(home, endpoint, token, model, host.workspace, binary=binary)
            )
            if restored is not None:
                files.update(restored.files)
            env = {**xdg_env(home), **env}
            talk = Conversation(
                message=plan.message,
                workspace=host.workspace,
                load=self.record.session if plan.mode == "resume" else None,
                mcp_url=f"{endpoint}/mcp" if self.tools else None,
                token=token,
                initialize_timeout=_initialize_timeout(preset),
                check_initialize=lambda info: check_initialized(preset, binary, info),
            )
            self.gate.stop = proxy.fail  # a pending wait stops the agent (then parks)
            unregister = run.cancel.add_stopper(lambda why: proxy.fail(TurnCancelled(why)))
            argv = [binary, *preset.argv]

            async def launch() -> Any:
                agent: Agent
                if isinstance(host, HostCliHost):
                    agent = await start_on_host(host, job, argv, env, files, DEFAULT_MAX_LINE)
                else:
                    assert isinstance(host, DockerCliHost)
                    agent = await start_in_docker(
                        host, job, argv, env, files, DEFAULT_MAX_LINE, talk.initialize_timeout
                    )
                try:
                    return await converse(agent, client, talk, proxy.fatal_event, _fatal(proxy))
                finally:
                    await agent.stop()
                    # The agent is gone: release a held wait hook (its thread must end
                    # before asyncio.run can).
                    self.gate.stopped.set()

            try:
                ended = asyncio.run(launch())
            except TurnCancelled:
                save()  # what the agent wrote up to the cancel: a later turn continues it
                raise
            finally:
                unregister()
                self.gate.stopped.set()
                requests.close()
        self.record.session = ended.session
        outcome: dict[str, Any] = {"reply": ended.reply, "session": ended.session}
        if not journal.replay_only:
            with self._save_lock:
                outcome["transcript"] = self.record.save(
                    host, home, turn.session_id, turn.turn_id, epoch
                )
        return outcome


def _result_ids(body: dict[str, Any]) -> list[str]:
    """The tool-use ids whose results the request's last user message carries."""
    messages = body.get("messages")
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            blocks = content if isinstance(content, list) else []
            return [
                str(b.get("tool_use_id"))
                for b in blocks
                if isinstance(b, dict) and b.get("type") == "tool_result"
            ]
    return []


def _fatal(proxy: JournalingProxy) -> Any:
    def error() -> BaseException:
        return proxy.fatal or DurableHarnessError("the launch was stopped")

    return error


def _initialize_timeout(preset: AcpPreset) -> float:
    raw = os.environ.get(INITIALIZE_TIMEOUT_ENV)
    try:
        ceiling = float(raw) if raw else preset.initialize_timeout
    except ValueError:
        ceiling = preset.initialize_timeout
    return max(0.1, min(ceiling, preset.initialize_timeout))


def _with_call_ids(server: HostToolServer, permissions: PermissionHook) -> Any:
    """The MCP handler, giving a ``tools/call`` that carries no tool-use id the id of the
    permission request the agent made for it (OpenCode asks before each host tool and
    sends no id of its own); without one the server refuses the call."""

    def handle(message: dict[str, Any]) -> dict[str, Any] | None:
        if isinstance(message, dict) and message.get("method") == "tools/call":
            params = message.get("params")
            if isinstance(params, dict):
                meta = params.setdefault("_meta", {})
                if isinstance(meta, dict) and not meta.get(TOOL_USE_META):
                    call_id = permissions.take_host_call(str(params.get("name") or ""))
                    if call_id is not None:
                        meta[TOOL_USE_META] = call_id
        reply: dict[str, Any] | None = server.handle(message)
        return reply

    return handle
