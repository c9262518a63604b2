"""The pi agent: the real ``pi`` CLI (``@mariozechner/pi-coding-agent``) behind the proxy.

Pi speaks the Anthropic Messages API (or, chosen in the agent config, Chat Completions or
Responses: :mod:`.pi.provider`) to a provider named in its ``models.json``; the adapter
points that provider at the journaling proxy, so every model call is a journal step keyed
by its canonical request (:class:`~.pi.canonical.PiCanonicalizer`), exactly as for Claude
Code. The rest mirrors :mod:`.claude_code.adapter`:

* one turn is one or more **launches** (journal steps ``launch:<n>``, kind ``agent``);
* Pi's tool calls are journaled by an extension (``extension.js``) that posts
  Claude-Code-shaped hook payloads to :class:`~.hooks.ToolHooks` (fail closed: a tool
  never runs unless its intent was recorded), with :class:`PiReplayPolicy` labels; the
  user's host tools are registered as Pi tools that call the harness's MCP endpoint
  (Pi itself has no MCP client); their calls reach the hooks too, named
  ``mcp__durable-harness__<tool>``, so Pi's session file is saved before their intent;
* the wait tools (``wait_for_signal``, ``sleep_until``) are host tools gated by
  :class:`~.cli.waits.WaitGate` in stop mode (Pi has no ``defer``): a wait still pending
  stops the CLI and parks the turn; the next delivery settles the wait before resuming;
* Pi's session file (``--session <file>``, set up front) is saved to the World before
  every tool intent and after the launch, restored for a resume, and the resumed CLI is
  told from the journal what happened to each call (:func:`~.cli.records.resume_message`).

The CLI runs with a private HOME per launch holding ``~/.pi/agent/models.json`` (the
proxy's URL and a per-launch token as the API key, never a provider key) and
``settings.json``; extension, skill, prompt-template and theme discovery are off, so
nothing in the workspace can switch the journaling extension off. Where it runs is a
:class:`~.cli.host.CliHost` (:mod:`.cli.launches`): the session's Docker container
(``--workspace docker``: a detached job that outlives the worker; a new worker
re-attaches to it), or a host folder, the local sandbox (the CLI dies with the worker
and a new launch resumes the saved session file).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_harness.adapters.base import Adapter, TurnRun
from durable_harness.adapters.cli.hooks import ReplayPolicy, ToolHooks, save_before_host_calls
from durable_harness.adapters.cli.host import (
    CliHost,
    CliLaunch,
    CliRun,
    HostCliHost,
    find_cli,
    progress,
    supervise,
)
from durable_harness.adapters.cli.jobs import launch_token
from durable_harness.adapters.cli.launches import (
    Workspaces,
    check_where,
    close_interrupted,
    finished_reply,
    open_cli_host,
    run_launches,
)
from durable_harness.adapters.cli.mcp import SERVER_NAME, HostToolServer
from durable_harness.adapters.cli.provider_api import anthropic_view
from durable_harness.adapters.cli.records import (
    TranscriptStore,
    latest_turn_transcript,
    previous_turn_transcript,
    resume_message,
)
from durable_harness.adapters.cli.waits import WaitGate
from durable_harness.adapters.pi.provider import PiConfig, pi_canonicalizer, pi_provider
from durable_harness.adapters.pi.session import pi_session_facts
from durable_harness.adapters.proxy.server import JournalingProxy, ProxyCallbacks, Upstream
from durable_harness.core.errors import ConfigError, DurableHarnessError, ModelError, TurnFailed
from durable_harness.core.keys import tool_key
from durable_harness.core.settings import Settings
from durable_harness.core.types import Replay, StepStatus
from durable_harness.harness.journal import decode_output
from durable_harness.harness.model import is_loopback, resolve_endpoint
from durable_harness.harness.tools import Tool, load_user_tools
from durable_harness.harness.waits import WAIT_TOOL_NAMES

__all__ = ["PI_VERSION", "PiAdapter", "PiReplayPolicy", "find_pi"]

#: The one Pi version this adapter's rules were measured on (scripts/setup).
PI_VERSION = "0.73.1"
BIN_ENV = "DURABLE_HARNESS_PI_BIN"
RETRIES_ENV = "DURABLE_HARNESS_PI_MAX_RETRIES"
DEFAULT_CLI_RETRIES = 2
ENDPOINT_ENV = "DURABLE_HARNESS_PI_ENDPOINT"  # read by extension.js
PROVIDER = "durable-harness"
RECORD_PREFIX = "pi"  # session records pi/<turn>/<epoch>
EXTENSION = Path(__file__).with_name("extension.js")
#: Pi's built-in tools that only read; bash, edit, write (and anything else) are ``never``.
SAFE_TOOLS = frozenset({"read", "grep", "find", "ls"})
BUILTIN_TOOLS = SAFE_TOOLS | {"bash", "edit", "write"}
_FLUSH_WAIT = 3.0  # seconds the session file may take to show a tool call before a save
_HOOKS_WAIT = 10.0  # seconds the first model call waits for proof the extension is live
_AGENT_DIR = ".pi/agent"
_SESSION = f"{_AGENT_DIR}/sessions/durable-harness.jsonl"
_ENDPOINT_FILE = "durable-harness-endpoint.json"
_EXTENSION_FILE = "durable-harness-pi.js"
#: How the extension names a host tool (or a wait tool) to the hooks, as Claude Code does.
HOST_TOOL_PREFIX = f"mcp__{SERVER_NAME}__"
_versions_seen: dict[str, str] = {}


def find_pi() -> str:
    """The ``pi`` binary: $DURABLE_HARNESS_PI_BIN, the project's pinned install
    (``.tools/npm``, made by scripts/setup), or PATH. ConfigError if none."""
    return find_cli("pi", BIN_ENV, "Pi", f"@mariozechner/pi-coding-agent@{PI_VERSION}")


def check_version(binary: str, host: CliHost | None = None) -> None:
    """ConfigError unless ``binary --version`` (run where the CLI runs) is exactly
    :data:`PI_VERSION`."""
    version = _versions_seen.get(binary) if host is None or not host.durable else None
    if version is None:
        try:
            # Pi prints its version on stderr.
            where = host or HostCliHost(Path.cwd(), {})
            version = where.version(binary, {"PI_OFFLINE": "1"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run {binary} --version: {exc}") from None
        _versions_seen[binary] = version
    if version != PI_VERSION:
        raise ConfigError(
            f"{binary} is Pi {version}, but durable-harness needs exactly {PI_VERSION} "
            f"(its request canonicalization is measured on that version): run "
            f"scripts/setup, or point {BIN_ENV} at that version"
        )


def package_dir(binary: str, host: CliHost | None = None) -> str:
    """The folder Pi is installed in (``…/pi-coding-agent``), named in its system prompt."""
    resolved = host.realpath(binary) if host is not None else str(Path(binary).resolve())
    return str(Path(resolved).parents[1])


class PiReplayPolicy(ReplayPolicy):
    """Replay labels of Pi's tools: ``read``/``grep``/``find``/``ls`` are safe; ``bash`` is
    safe only for a command the agent config's ``safe_bash`` patterns match; the rest
    ``never``. ``[replay] tools`` overrides any of them by name."""

    def label(self, tool_name: str, tool_input: Any) -> Replay:
        override = self.config.replay.tools.get(tool_name)
        if override is not None:
            return override
        if (
            tool_name == "bash"
            and isinstance(tool_input, dict)
            and self.safe_command(str(tool_input.get("command", "")).strip())
        ):
            return "safe"
        return "safe" if tool_name in SAFE_TOOLS else "never"


class PiAdapter(Adapter):
    name = "pi"

    def check(self, config: dict[str, Any], settings: Settings) -> None:
        docker = check_where(config, self.name)
        # A host tool may not take the name of one of Pi's built-in tools or a wait tool.
        load_user_tools(config.get("tools", []), [*sorted(BUILTIN_TOOLS), *WAIT_TOOL_NAMES])
        PiConfig.parse(config.get("agent_config"), "in the turn")
        resolve_endpoint(config.get("base_url"))
        if not docker:
            check_version(find_pi())

    def run_turn(self, run: TurnRun) -> str:
        reply = finished_reply(run)
        if reply is not None:
            return reply
        binaries = lambda: {"pi": find_pi()}  # noqa: E731
        with open_cli_host(run.config, run.turn.session_id, self.name, binaries) as host:
            return run_launches(run, self.name, host, _Launch(run, host))


@dataclass
class _Events:
    """What a launch's ``--mode json`` output said."""

    last_assistant: dict[str, Any] | None = None  # the newest finished assistant message
    ended: bool = False  # agent_end arrived: Pi finished the turn


class _Launch:
    """One run of the CLI for a turn (see the module docstring)."""

    def __init__(self, run: TurnRun, host: CliHost) -> None:
        self.run_ = run
        self.host = host
        self.world = run.world
        self.journal = run.journal
        self.turn = run.turn
        self.config = PiConfig.parse(run.config.get("agent_config"), "in the turn")
        self.store = TranscriptStore(self.world, record_prefix=RECORD_PREFIX)
        self._save_lock = threading.Lock()
        self.workspaces = Workspaces(run, self._save_lock)
        # Pi has no `defer`: the gate's stop mode (cli/waits.py) stops the CLI at a pending
        # wait; run_launches settles the wait before the next launch.
        self.gate = WaitGate.for_turn(run)
        #: The host tools served over MCP: the user's, and the wait tools.
        self.tools: list[Tool] = [
            *load_user_tools(run.config.get("tools", []), WAIT_TOOL_NAMES),
            *self.gate.tools,
        ]

    # -- what to run -----------------------------------------------------------------
    def plan(self, number: int) -> dict[str, Any]:
        """How launch ``number`` starts: the message and the session file to restore."""
        turn, epoch = self.turn, self.journal.lease.epoch
        saved = latest_turn_transcript(
            self.world, turn.session_id, turn.turn_id, epoch, record_prefix=RECORD_PREFIX
        )
        if saved is None:
            previous = previous_turn_transcript(self.world, turn.session_id, turn.index)
            mode = "resume" if previous is not None else "new"
            return {"mode": mode, "message": turn.prompt, "transcript": previous}
        close_interrupted(self.journal, self.world, PiReplayPolicy(self.config), self.tools)
        steps = sorted(self.journal.recorded.values(), key=lambda s: s.seq)
        message = resume_message(
            self.world, turn.prompt, steps, self.store.load(saved), facts_of=pi_session_facts
        )
        return {"mode": "resume", "message": message, "transcript": saved, "launch": number}

    # -- running it ----------------------------------------------------------------------
    def run(self, plan: dict[str, Any], job: str, cli: CliRun | None = None) -> dict[str, Any]:
        """Run the launch ``job`` (or follow ``cli``, the same launch started by an earlier
        worker) to its end; its reply and final session file."""
        host = self.host
        binary = host.binary("pi")
        check_version(binary, host)
        url, key = resolve_endpoint(self.run_.config.get("base_url"))
        token = launch_token(self.turn.config, job) if host.durable else secrets.token_urlsafe(32)
        home = host.home(job)
        session = f"{home}/{_SESSION}"
        sandbox = getattr(host, "sandbox", None)
        if cli is None and sandbox is not None and not self.journal.replay_only:
            self.workspaces.restore(sandbox)  # a new container gets the workspace back
        saver = None if self.journal.replay_only else self._saver(session)
        hooks = ToolHooks(
            self.journal,
            PiReplayPolicy(self.config),
            host_tool_prefix=HOST_TOOL_PREFIX,  # how the extension names a host tool
            before_intent=saver,
            waits=self.gate,
            outcome_meta=None if sandbox is None else self.workspaces.saver(sandbox),
            adopt=cli is not None,
        )
        if cli is not None:
            hooks.session_started.set()  # it started under the earlier worker
        mcp = HostToolServer(
            self.journal, self.tools, self.turn.session_id, self.gate.signal_secret
        )
        control = save_before_host_calls(
            self.journal, self._control(hooks), saver, prefix=HOST_TOOL_PREFIX
        )
        callbacks = ProxyCallbacks(
            on_request=self._on_request(hooks), control=control, mcp=mcp.handle
        )
        proxy = JournalingProxy(
            self.journal,
            pi_canonicalizer(self.config.provider.api, package_dir(binary, host)),
            Upstream(url, key, send_key=is_loopback(url)),
            token,
            callbacks,
        )
        events = _Events()
        with proxy:
            endpoint = host.endpoint(proxy.url, job)
            self.gate.stop = proxy.fail  # a pending wait stops the CLI (then parks)
            if cli is None:
                cli = host.start(self._launch(job, binary, home, endpoint, token, plan))
            try:
                finished = supervise(cli, proxy, lambda line: self._event(line, events))
            finally:
                self.gate.stopped.set()  # the CLI is gone: release a held wait hook
        reply = self._reply(events, finished.status, finished.stderr, proxy)
        final = host.read_file(session) or b""
        result: dict[str, Any] = {"reply": reply}
        if not self.journal.replay_only:
            saved = self.store.save(final)
            epoch = self.journal.lease.epoch
            self.store.point(self.turn.session_id, self.turn.turn_id, epoch, saved)
            result["transcript"] = saved.digest
        # The job's HOME goes once the launch is journaled (run_launches).
        return result

    def _launch(
        self, job: str, binary: str, home: str, url: str, token: str, plan: dict[str, Any]
    ) -> CliLaunch:
        """Pi's models.json and settings.json, the extension and its endpoint file, the
        session file to continue, and the command."""
        model = str(self.run_.config.get("model") or self.run_.settings.model)
        provider = {
            **pi_provider(self.config.provider.api, url),  # the proxy, in the chosen API
            "apiKey": token,  # the proxy's per-launch token, never a provider key
            "models": [{"id": model}],
        }
        retries = int(os.environ.get(RETRIES_ENV, DEFAULT_CLI_RETRIES))
        settings = {"retry": {"enabled": retries > 0, "maxRetries": retries}}
        host_tools = [
            {"name": t.name, "description": t.description, "inputSchema": t.json_schema()}
            for t in self.tools
        ]
        endpoint: dict[str, Any] = {
            "url": url,
            "token": token,
            "hostTools": host_tools,
            "hostToolPrefix": HOST_TOOL_PREFIX,
        }
        if self.host.durable:
            endpoint["retry"] = True  # the CLI outlives a dead worker: wait for the next
        files = {
            f"{_AGENT_DIR}/models.json": json.dumps({"providers": {PROVIDER: provider}}).encode(),
            f"{_AGENT_DIR}/settings.json": json.dumps(settings).encode(),
            f"{_AGENT_DIR}/{_ENDPOINT_FILE}": json.dumps(endpoint).encode(),
            _EXTENSION_FILE: EXTENSION.read_bytes(),
        }
        if plan.get("transcript"):
            files[_SESSION] = self.store.load(str(plan["transcript"]))
        argv = [
            binary,
            "-p",
            "--mode", "json",
            "--model", f"{PROVIDER}/{model}",
            "--session", f"{home}/{_SESSION}",
            # Nothing found in the workspace or HOME may load: an extension there
            # could switch the journaling extension's hooks off.
            "--no-extensions", "-e", f"{home}/{_EXTENSION_FILE}",
            "--no-skills", "--no-prompt-templates", "--no-themes",
        ]  # fmt: skip
        env = {
            "HOME": home,
            "TERM": "dumb",
            "PI_OFFLINE": "1",  # no update checks or other startup traffic
            ENDPOINT_ENV: f"{home}/{_AGENT_DIR}/{_ENDPOINT_FILE}",
        }
        # The message on stdin, not argv: a prompt can look like a flag or an @file.
        return CliLaunch(job, argv, env, str(plan["message"]).encode(), files)

    def _saver(self, session: str) -> Any:
        def before_intent(reported: str | None, tool_use_id: str) -> None:
            # Pi appends the assistant message before it runs the tool_call handlers; wait
            # (briefly) until the file holds this call, so a resume knows the call exists.
            deadline = time.monotonic() + _FLUSH_WAIT
            data = b""
            while time.monotonic() < deadline:
                data = self.host.read_file(session) or b""
                if tool_use_id.encode() in data:
                    break
                time.sleep(0.01)
            with self._save_lock:
                saved = self.store.save(data)
                lease = self.journal.lease
                self.store.point(self.turn.session_id, self.turn.turn_id, lease.epoch, saved)

        return before_intent

    def _control(self, hooks: ToolHooks) -> Any:
        def control(event: str, payload: dict[str, Any]) -> dict[str, Any]:
            if event != "PostToolUse":
                return hooks.handle(event, payload)
            tool_use_id = str(payload.get("tool_use_id") or "")
            opened = tool_use_id in hooks.open
            hooks.handle(event, payload)
            recorded = None if opened else self.journal.lookup(tool_key(tool_use_id))
            if recorded is not None and recorded.status is StepStatus.DONE:
                # Ran although the journal already had its outcome: the model must see
                # the recorded result, as every other run of this turn did.
                value = decode_output(self.world, recorded)
                response = value.get("tool_response") if isinstance(value, dict) else None
                if isinstance(response, dict):
                    return {"replace": response}
            return {}

        return control

    def _on_request(self, hooks: ToolHooks) -> Any:
        def on_request(body: dict[str, Any]) -> None:
            hooks.require_started(
                _HOOKS_WAIT,
                "Pi did not load the durable-harness extension (no session_start arrived)",
            )
            hooks.close_from_request(anthropic_view(body))

        return on_request

    def _event(self, line: bytes, events: _Events) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "agent_end":
            events.ended = True
            return
        message = event.get("message")
        if kind != "message_end" or not isinstance(message, dict):
            return
        if message.get("role") != "assistant":
            return
        events.last_assistant = message
        if self.journal.on_step is None:
            return
        for block in message.get("content") or []:
            if block.get("type") == "text" and block.get("text"):
                progress(f"pi: {block['text']}")
            elif block.get("type") == "toolCall":
                progress(f"pi: {block.get('name')} {json.dumps(block.get('arguments'))}")

    def _reply(
        self, events: _Events, status: int | None, stderr: str, proxy: JournalingProxy
    ) -> str:
        message = events.last_assistant
        upstream = "; ".join(dict.fromkeys(proxy.upstream_errors[-3:])) or None
        if message is None or not events.ended:
            raise DurableHarnessError(
                f"Pi exited with status {status} without finishing the turn"
                + (f" (last model error: {upstream})" if upstream else "")
                + f": {stderr.strip()[-500:] or 'no output'}"
            )
        if message.get("stopReason") in ("error", "aborted"):
            text = str(message.get("errorMessage") or message.get("stopReason"))
            if upstream or message.get("stopReason") == "error":
                raise ModelError(
                    f"the model call failed ({upstream or text}); the turn will be resumed"
                )
            raise TurnFailed(f"Pi ended the turn with an error: {text}")
        texts = [
            str(b.get("text") or "")
            for b in message.get("content") or []
            if isinstance(b, dict) and b.get("type") == "text"
        ]
        return "".join(texts)
