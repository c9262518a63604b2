"""The claude-code agent: the real ``claude`` CLI behind the journaling proxy.

One turn is one or more **launches** of the CLI, each a journal step ``launch:<n>``
(kind ``agent``) whose input says how it starts and whose outcome is the reply and the
final transcript. Inside a launch:

* model calls go through :class:`~.proxy.server.JournalingProxy` (keyed by the canonical
  request hash, :class:`~.claude_code.canonical.ClaudeCodeCanonicalizer`);
* Claude Code's own tool calls are journaled by its hooks (:class:`~.hooks.ToolHooks`),
  with :class:`~.hooks.ReplayPolicy` labels; the user's host tools are served over MCP by
  the harness (:class:`~.mcp.HostToolServer`) under their own labels;
* the CLI's transcript is saved to the World before every tool intent
  (:mod:`.cli.records`; what it already holds: :mod:`.claude_code.session`).

The CLI runs non-interactively with a fresh, private HOME, a session id derived from the
durable-harness session and a per-launch token instead of any provider key, where a
:class:`~.cli.host.CliHost` puts it: in the session's Docker container as a detached job
that outlives the worker (:mod:`.cli.docker_host`, the only place it runs by default), or
on a host folder under :mod:`.cli.reaper` (a developer-only opt-in,
:data:`~.cli.host.UNSAFE_HOST_ENV`). Which launch runs next
(:func:`~.cli.launches.run_launches`, shared by every CLI adapter):

* the last launch finished (the worker died after the CLI did): its reply, no CLI run;
* the last launch's CLI still runs in the container (or ended well) after its worker
  died: follow it again from its first output line to its end (hooks re-journal
  idempotently), and finish that launch;
* a transcript of this turn was saved: restore it and ``--resume`` with a message written
  from the journal (:func:`~.cli.records.resume_message`);
* otherwise the turn starts as it first did (the session's previous transcript and the
  prompt), so its first model call is answered from the journal if it was recorded;
* the last launch ended deferred at a wait (:mod:`.cli.waits`, defer mode): once the
  wait is settled, ``--resume`` with an empty prompt, which runs the deferred call again.

``durable-harness replay`` runs the turn's last launch again, as recorded, with the proxy
answering only from the journal: zero upstream calls, zero tool runs.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import threading
import time
from typing import Any

from durable_harness.adapters.base import Adapter, TurnRun
from durable_harness.adapters.claude_code.canonical import ClaudeCodeCanonicalizer
from durable_harness.adapters.claude_code.output import LaunchOutput
from durable_harness.adapters.claude_code.session import transcript_facts
from durable_harness.adapters.claude_code.setup import (
    CLAUDE_CODE_VERSION,
    check_version,
    claude_session_id,
    find_claude,
    open_host,
    project_dir_name,
    workspace_spec,
)
from durable_harness.adapters.cli.hooks import AgentConfig, ReplayPolicy, ToolHooks
from durable_harness.adapters.cli.host import CliHost, CliLaunch, CliRun, launch_steps, supervise
from durable_harness.adapters.cli.jobs import launch_token, workspace_of
from durable_harness.adapters.cli.launches import close_interrupted, finished_reply, run_launches
from durable_harness.adapters.cli.mcp import SERVER_NAME, HostToolServer
from durable_harness.adapters.cli.records import (
    TranscriptStore,
    latest_turn_transcript,
    previous_turn_transcript,
    resume_message,
)
from durable_harness.adapters.cli.waits import WaitGate
from durable_harness.adapters.proxy.server import JournalingProxy, ProxyCallbacks, Upstream
from durable_harness.core.sandbox import Sandbox
from durable_harness.core.settings import Settings
from durable_harness.core.types import StepStatus, TurnStatus
from durable_harness.harness.journal import decode_output
from durable_harness.harness.model import is_loopback, resolve_endpoint
from durable_harness.harness.tools import Tool, load_user_tools
from durable_harness.harness.waits import WAIT_TOOL_NAMES
from durable_harness.harness.workspace import SnapshotStore, restore_workspace, save_workspace

__all__ = [
    "CLAUDE_CODE_VERSION",
    "ClaudeCodeAdapter",
    "find_claude",
    "project_dir_name",
    "workspace_of",  # re-exported: it lives in cli/jobs.py
]

RETRIES_ENV = "DURABLE_HARNESS_CLAUDE_MAX_RETRIES"
#: Retries the CLI makes itself on a failed model call before giving up; the worker then
#: releases the turn and a later delivery resumes it.
DEFAULT_CLI_RETRIES = "2"
_HOOK_EVENTS = ("SessionStart", "PreToolUse", "PostToolUse", "PostToolUseFailure")
_FLUSH_WAIT = 3.0  # seconds the transcript may take to show a tool call before a save
_HOOKS_WAIT = 10.0  # seconds the first model call waits for proof the hooks are live


class ClaudeCodeAdapter(Adapter):
    name = "claude-code"

    def check(self, config: dict[str, Any], settings: Settings) -> None:
        spec = workspace_spec(config)
        load_user_tools(config.get("tools", []), WAIT_TOOL_NAMES)
        AgentConfig.parse(config.get("agent_config"), "in the turn")
        resolve_endpoint(config.get("base_url"))
        if spec == "docker":
            from durable_harness.sandbox import open_sandbox

            open_sandbox("docker").close()  # Docker answers and the image is built
        else:
            workspace_of(config)
            check_version(find_claude())

    def run_turn(self, run: TurnRun) -> str:
        reply = finished_reply(run)
        if reply is not None:
            return reply
        with open_host(run.config, run.turn.session_id) as host:
            return run_launches(run, self.name, host, _Launch(run, host))


class _Launch:
    """One run of the CLI for a turn (see the module docstring)."""

    def __init__(self, run: TurnRun, host: CliHost) -> None:
        self.run_ = run
        self.host = host
        self.world = run.world
        self.journal = run.journal
        self.turn = run.turn
        self.config = AgentConfig.parse(run.config.get("agent_config"), "in the turn")
        self.session = claude_session_id(self.turn.session_id)
        self.store = TranscriptStore(self.world)
        self.snapshots = SnapshotStore(self.world)
        self._save_lock = threading.Lock()
        self.gate = WaitGate.for_turn(run)
        #: The host tools served over MCP: the user's, and the wait tools.
        self.tools: list[Tool] = [
            *load_user_tools(run.config.get("tools", []), WAIT_TOOL_NAMES),
            *self.gate.tools,
        ]

    # -- what to run -----------------------------------------------------------------
    def plan(self, number: int) -> dict[str, Any]:
        """How launch ``number`` starts: mode, prompt and the transcript to restore.

        When the previous launch finished deferred (at a wait, settled by now), the CLI
        resumes with an empty prompt, which runs the deferred call again.
        """
        launches = launch_steps(self.journal)
        last = launches[-1] if launches else None
        if last is not None and last.status is StepStatus.DONE:
            last_outcome: dict[str, Any] = decode_output(self.world, last)
            if last_outcome.get("deferred"):
                transcript = last_outcome["transcript"]
                return {"mode": "resume", "message": "", "transcript": transcript, "launch": number}
        turn, epoch = self.turn, self.journal.lease.epoch
        saved = latest_turn_transcript(self.world, turn.session_id, turn.turn_id, epoch)
        if saved is None:
            previous = previous_turn_transcript(self.world, turn.session_id, turn.index)
            mode = "resume" if previous is not None else "new"
            return {"mode": mode, "message": self.turn.prompt, "transcript": previous}
        close_interrupted(self.journal, self.world, ReplayPolicy(self.config), self.tools)
        steps = sorted(self.journal.recorded.values(), key=lambda s: s.seq)
        message = resume_message(
            self.world, self.turn.prompt, steps, self.store.load(saved), transcript_facts
        )
        return {"mode": "resume", "message": message, "transcript": saved, "launch": number}

    # -- running it ----------------------------------------------------------------------
    def run(self, plan: dict[str, Any], job: str, cli: CliRun | None = None) -> dict[str, Any]:
        """Run the launch ``job`` (or follow ``cli``, the same launch started by an earlier
        worker) to its end; its reply and final transcript."""
        host = self.host
        binary = host.binary("claude")
        check_version(binary, host)
        url, key = resolve_endpoint(self.run_.config.get("base_url"))
        home = host.home(job)
        transcript = f"{home}/{self._transcript_rel()}"
        sandbox = getattr(host, "sandbox", None)
        if cli is None and sandbox is not None and not self.journal.replay_only:
            # A new container (the old one was lost) gets the workspace back from the World.
            digest = self.journal.latest_meta("workspace") or self._session_workspace()
            restore_workspace(sandbox, self.snapshots, digest)
        hooks = ToolHooks(
            self.journal,
            ReplayPolicy(self.config),
            host_tool_prefix=f"mcp__{SERVER_NAME}__",
            before_intent=None if self.journal.replay_only else self._saver(transcript),
            waits=self.gate,
            outcome_meta=None if sandbox is None else self._snapshotter(sandbox),
            adopt=cli is not None,
        )
        if cli is not None:
            hooks.session_started.set()  # it started under the earlier worker
        mcp = HostToolServer(
            self.journal, self.tools, self.turn.session_id, self.gate.signal_secret
        )
        callbacks = ProxyCallbacks(
            on_request=self._on_request(hooks), control=hooks.handle, mcp=mcp.handle
        )
        token = launch_token(self.turn.config, job) if host.durable else secrets.token_urlsafe(32)
        proxy = JournalingProxy(
            self.journal,
            ClaudeCodeCanonicalizer(home=home),
            Upstream(url, key, send_key=is_loopback(url)),
            token,
            callbacks,
        )
        with proxy:
            endpoint = host.endpoint(proxy.url, job)
            if cli is None:
                cli = host.start(self._launch(job, binary, home, endpoint, token, plan))
            outcome = self._supervise(cli, proxy)
        reply = outcome.reply(proxy.upstream_errors)
        final = host.read_file(transcript) or b""
        result: dict[str, Any] = {"reply": reply, "session": self.session}
        deferred = (outcome.result or {}).get("deferred_tool_use")
        if (outcome.result or {}).get("stop_reason") == "tool_deferred" and deferred:
            result["deferred"] = str(deferred.get("id"))
        if not self.journal.replay_only:
            saved = self.store.save(final)
            epoch = self.journal.lease.epoch
            self.store.point(self.turn.session_id, self.turn.turn_id, epoch, saved)
            result["transcript"] = saved.digest
        # The launch's HOME (with the transcript) stays until the launch is journaled: a
        # worker that dies before that re-attaches and reads it again (run_turn finishes).
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

    def _transcript_rel(self) -> str:
        """Claude Code's transcript of this session, relative to its HOME."""
        return f".claude/projects/{project_dir_name(self.host.workspace)}/{self.session}.jsonl"

    def _saver(self, transcript: str) -> Any:
        def before_intent(reported: str | None, tool_use_id: str) -> None:
            # Claude Code writes its transcript a little after the fact: wait (briefly)
            # until it holds this call, so a resume from this save knows the call exists.
            deadline = time.monotonic() + _FLUSH_WAIT
            data = b""
            while time.monotonic() < deadline:
                data = self.host.read_file(transcript) or b""
                if tool_use_id.encode() in data:
                    break
                time.sleep(0.02)
            with self._save_lock:
                saved = self.store.save(data)
                lease = self.journal.lease
                self.store.point(self.turn.session_id, self.turn.turn_id, lease.epoch, saved)

        return before_intent

    def _snapshotter(self, sandbox: Sandbox) -> Any:
        def outcome_meta() -> dict[str, Any]:
            # The workspace as this tool left it: a new container is restored from it.
            with self._save_lock:
                digest = save_workspace(sandbox, self.snapshots)
            return {} if digest is None else {"workspace": digest}

        return outcome_meta

    def _on_request(self, hooks: ToolHooks) -> Any:
        def on_request(body: dict[str, Any]) -> None:
            hooks.require_started(
                _HOOKS_WAIT,
                "Claude Code did not run the durable-harness hooks (no SessionStart arrived)",
            )
            hooks.close_from_request(body)

        return on_request

    def _launch(
        self, job: str, binary: str, home: str, url: str, token: str, plan: dict[str, Any]
    ) -> CliLaunch:
        endpoint = f"{home}/durable-harness-endpoint.json"
        settings = {
            "hooks": {
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
        }
        # Always served: the wait tools (cli/waits.py) are host tools too.
        servers = {
            SERVER_NAME: {
                "type": "http",
                "url": f"{url}/mcp",
                "headers": {"Authorization": f"Bearer {token}"},
            }
        }
        files = {
            "durable-harness-endpoint.json": json.dumps({"url": url, "token": token}).encode(),
            "durable-harness-settings.json": json.dumps(settings, indent=1).encode(),
            "durable-harness-mcp.json": json.dumps({"mcpServers": servers}).encode(),
        }
        if plan.get("transcript"):
            files[self._transcript_rel()] = self.store.load(str(plan["transcript"]))
        start = "--session-id" if plan["mode"] == "new" else "--resume"
        argv = [
            binary,
            "-p",
            "--output-format", "stream-json",
            "--verbose",
            "--model", str(self.run_.config.get("model") or self.run_.settings.model),
            "--settings", f"{home}/durable-harness-settings.json",
            # Project and local settings could switch the journaling hooks off.
            "--setting-sources", "user",
            "--mcp-config", f"{home}/durable-harness-mcp.json",
            "--strict-mcp-config",
            "--dangerously-skip-permissions",
            start, self.session,
        ]  # fmt: skip
        env = {
            "HOME": home,
            "TERM": "dumb",
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": token,  # the proxy's per-launch token, never a provider key
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",  # memory would live in the lost HOME
            "CLAUDE_CODE_MAX_RETRIES": os.environ.get(RETRIES_ENV, DEFAULT_CLI_RETRIES),
            "IS_SANDBOX": "1",  # lets --dangerously-skip-permissions run as root
        }
        stdin = str(plan["message"]).encode()
        return CliLaunch(job, argv, env, stdin, files)

    def _supervise(self, cli: CliRun, proxy: JournalingProxy) -> LaunchOutput:
        outcome = LaunchOutput()
        show = self.journal.on_step is not None
        finished = supervise(cli, proxy, lambda line: outcome.feed(line, show_progress=show))
        outcome.status, outcome.stderr = finished.status, finished.stderr
        return outcome
