"""The one CLI adapter: a real agent CLI behind the journaling proxy, driven by its
:class:`~.cli.spec.CliSpec`.

One turn is one or more **launches** of the CLI, each a journal step ``launch:<n>`` (kind
``agent``) whose input is its :class:`~.cli.launches.LaunchPlan` and whose outcome is the
reply and the final session record (:func:`~.cli.launches.run_launches` decides which
launch runs next). Inside a launch:

* model calls go through :class:`~.proxy.server.JournalingProxy`, keyed by the spec's
  canonicalizer, upstream the harness's own key (the CLI gets a per-launch token);
* the CLI's tool calls are journaled by its hooks (:class:`~.cli.hooks.ToolHooks`, labels
  from the spec's replay policy); the user's host tools and the wait tools are served over
  MCP by the harness under their own labels (the spec's wiring);
* the session record is saved before every tool intent and after the launch (the spec's
  :class:`~.cli.spec.RecordCodec`); a resumed launch restores it and is told, from the
  journal, what happened to each call;
* in the session's container the workspace is restored into a new container and
  snapshotted after each tool outcome (:class:`~.cli.where.Workspaces`).

Where it runs is :func:`~.cli.where.open_cli_host`; the CLI's version is checked there
against the spec's pin before every launch.

A cancelled turn (``run.cancel``) ends its launch as the proxy's fatal error does: the
CLI and everything it started are killed (the reaper on a host folder, the job's process
group and what it left running in the container), the session record is saved once more
(what the CLI wrote up to then: a later turn of the session continues from it) and the
launch stays an intent.
"""

from __future__ import annotations

import logging
import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Literal

from durable_harness.adapters.base import Adapter, TurnRun
from durable_harness.adapters.cli.hooks import ToolHooks
from durable_harness.adapters.cli.host import (
    CliHost,
    CliRun,
    HostCliHost,
    find_cli,
    launch_steps,
    supervise,
)
from durable_harness.adapters.cli.jobs import launch_token
from durable_harness.adapters.cli.launches import (
    LaunchPlan,
    close_interrupted,
    finished_reply,
    run_launches,
)
from durable_harness.adapters.cli.ledger import ToolLedger
from durable_harness.adapters.cli.spec import BeforeIntent, CliSpec, LaunchContext
from durable_harness.adapters.cli.waits import WaitGate
from durable_harness.adapters.cli.where import Workspaces, check_where, open_cli_host
from durable_harness.adapters.proxy.policy import policy_of
from durable_harness.adapters.proxy.server import JournalingProxy, ProxyCallbacks, Upstream
from durable_harness.adapters.proxy.wire.anthropic import ANTHROPIC
from durable_harness.adapters.push_tool import GIT_PUSH, push_tools
from durable_harness.core.errors import ConfigError, TurnCancelled
from durable_harness.core.fork import Cut
from durable_harness.core.sandbox import Sandbox
from durable_harness.core.settings import Settings
from durable_harness.core.turn_config import DOCKER, TurnConfig
from durable_harness.core.types import Step, StepStatus, Turn
from durable_harness.core.world import World
from durable_harness.harness.endpoint import is_loopback
from durable_harness.harness.journal import decode_output
from durable_harness.harness.tools import Tool, load_user_tools
from durable_harness.harness.waits import WAIT_TOOL_NAMES

__all__ = ["CliAdapter", "check_version", "find_binary", "wait_for_record"]

log = logging.getLogger(__name__)

#: (where, binary) -> the version it reported: a host binary or an image's is asked once.
_versions_seen: dict[tuple[str, str], str] = {}


def find_binary(spec: CliSpec) -> str:
    """The host binary of the spec's CLI: ``$<bin_env>``, a pinned install (``.tools/npm``
    of a checkout, or the user cache of ``setup-agents``), or PATH. ConfigError if none."""
    return find_cli(spec.binary, spec.bin_env, spec.product, spec.package)


def check_version(spec: CliSpec, binary: str, host: CliHost | None = None) -> None:
    """ConfigError unless ``binary --version`` (run where the CLI runs: ``host``, or this
    machine) is exactly the spec's pinned version."""
    sandbox = getattr(host, "sandbox", None)
    where = "host" if sandbox is None else f"image {sandbox.image}"
    version = _versions_seen.get((where, binary))
    if version is None:
        try:
            version = spec.read_version(host or HostCliHost(Path.cwd(), {}), binary)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run {binary} --version: {exc}") from None
        _versions_seen[(where, binary)] = version
    if version != spec.version:
        raise ConfigError(
            f"{binary} is {spec.product} {version}, but durable-harness needs exactly "
            f"{spec.version} (its request canonicalization is measured on that version): "
            f"run `durable-harness setup-agents` (scripts/setup in a checkout), or point "
            f"{spec.bin_env} at that version"
        )


def wait_for_record(
    read: Callable[[], bytes], holds: Callable[[bytes], bool], seconds: float, poll: float
) -> bytes:
    """The record as ``read`` gives it, once it ``holds`` the call or after ``seconds``:
    a CLI writes its record a little after (or before) its hook runs, and a resume from a
    save must know the call exists."""
    deadline = time.monotonic() + seconds
    data = read()
    while not holds(data) and time.monotonic() < deadline:
        time.sleep(poll)
        data = read()
    return data


class CliAdapter(Adapter):
    """The adapter of one CLI agent, all of whose own parts are its ``spec``."""

    #: A CLI runs a real shell: never the virtual workspace; a host folder only by name.
    default_workspace = DOCKER

    def __init__(self, spec: CliSpec) -> None:
        self.spec = spec
        self.name = spec.name

    def check(self, config: dict[str, Any], settings: Settings) -> None:
        spec, turn = self.spec, TurnConfig.of(config)
        docker = check_where(turn, spec.name, docker_only=spec.docker_only)
        load_user_tools(turn.tools, [*sorted(spec.reserved_tools), *WAIT_TOOL_NAMES, GIT_PUSH])
        spec.parse_config(turn.agent_config)
        spec.upstream(turn.base_url)
        if docker:
            from durable_harness.sandbox import open_sandbox

            # Docker answers and the image is built (on first use, here: with progress).
            open_sandbox("docker", toolchain=turn.image).close()
        else:
            check_version(spec, find_binary(spec))

    def fork_cut(self, world: World, turn: Turn, steps: list[Step], session_id: str) -> Cut:
        if self.spec.fork is None:
            return super().fork_cut(world, turn, steps, session_id)
        return Cut(record=self.spec.fork(world, turn, steps, session_id))

    def run_turn(self, run: TurnRun) -> str:
        reply = finished_reply(run)
        if reply is not None:
            return reply
        spec = self.spec
        binaries = lambda: {spec.binary: find_binary(spec)}  # noqa: E731
        with open_cli_host(
            run.turn_config,
            run.turn.session_id,
            spec.name,
            binaries,
            docker_only=spec.docker_only,
            home_prefix=spec.home_prefix,
        ) as host:
            return run_launches(run, spec.name, host, CliLauncher(spec, run, host))


class CliLauncher:
    """Plans and runs the launches of one turn (a :class:`~.cli.launches.Launcher`)."""

    def __init__(self, spec: CliSpec, run: TurnRun, host: CliHost) -> None:
        self.spec = spec
        self.run_ = run
        self.host = host
        self.journal = run.journal
        self.turn_config = run.turn_config
        self.config = spec.parse_config(self.turn_config.agent_config)
        self._save_lock = threading.Lock()
        self.workspaces = Workspaces(run, self._save_lock)
        self.gate = WaitGate.for_turn(run)
        # The turn's model-made tool uses: hooks and host tools accept no other id.
        self.ledger = ToolLedger(run.journal)
        self.tools: list[Tool] = [
            *load_user_tools(self.turn_config.tools, [*WAIT_TOOL_NAMES, GIT_PUSH]),
            *self.gate.tools,
            *push_tools(
                self.turn_config,
                self._push_sandbox,
                run.settings.push_max_bytes,
                run.world,
                run.settings.push_branches,
            ),
        ]

    def _push_sandbox(self) -> AbstractContextManager[Sandbox]:
        """The sandbox git_push bundles in: the session's container, or the host folder
        opened as a sandbox for the push (its bash runs as the agent user, like the CLI)."""
        sandbox = getattr(self.host, "sandbox", None)
        if isinstance(sandbox, Sandbox):
            return nullcontext(sandbox)
        from durable_harness.sandbox import open_sandbox

        return open_sandbox(self.turn_config.workspace)

    def plan(self, number: int) -> LaunchPlan:
        """How launch ``number`` starts: mode, message and the session record to restore.

        When the previous launch finished deferred (at a wait, settled by now), the CLI
        resumes with an empty prompt, which runs the deferred call again."""
        run, record = self.run_, self.spec.record
        launches = launch_steps(self.journal)
        last = launches[-1] if launches else None
        if last is not None and last.status is StepStatus.DONE:
            outcome: dict[str, Any] = decode_output(run.world, last)
            if outcome.get("deferred"):
                saved = outcome[record.key]
                return LaunchPlan("resume", "", saved, number, record.key)
        saved = record.latest(run)
        if saved is None:
            previous = record.previous(run)
            mode: Literal["new", "resume"] = "resume" if previous is not None else "new"
            return LaunchPlan(mode, run.turn.prompt, previous, None, record.key)
        policy = self.spec.replay_policy(self.config)
        secret = run.turn_config.signal_secret or ""
        close_interrupted(self.journal, run.world, policy, self.tools, secret)
        steps = sorted(self.journal.recorded.values(), key=lambda s: s.seq)
        message = record.resume_message(run, steps, saved)
        numbered = number if self.spec.numbered_resumes else None
        return LaunchPlan("resume", message, saved, numbered, record.key)

    def run(self, plan: LaunchPlan, job: str, cli: CliRun | None = None) -> dict[str, Any]:
        """Run the launch ``job`` (or follow ``cli``, the same launch started by an earlier
        worker) to its end; its outcome: the reply and the final session record."""
        spec, host, journal = self.spec, self.host, self.journal
        run, turn_config = self.run_, self.turn_config
        binary = host.binary(spec.binary)
        check_version(spec, binary, host)
        url, key = spec.upstream(self.turn_config.base_url)
        token = launch_token(self.turn_config, job) if host.durable else secrets.token_urlsafe(32)
        ctx = LaunchContext(
            self.run_, host, self.config, self.gate, self.tools, plan, job, binary,
            host.home(job), token,
        )  # fmt: skip
        spec.record.prepare(ctx)
        sandbox = getattr(host, "sandbox", None)
        if cli is None and sandbox is not None and not journal.replay_only:
            self.workspaces.restore(sandbox)  # a new container gets the workspace back
        saver = None if journal.replay_only else spec.record.saver(ctx, self._save_lock)
        if saver is not None:
            saver = self._model_made(saver)
        hooks = ToolHooks(
            journal,
            spec.replay_policy(self.config),
            host_tool_prefix=spec.host_tool_prefix,
            before_intent=saver,
            waits=self.gate,
            outcome_meta=None if sandbox is None else self.workspaces.saver(sandbox),
            adopt=cli is not None,
            ledger=self.ledger,
            same_call=spec.same_call,
            host_tools=frozenset(t.name for t in self.tools),
        )
        if cli is not None:
            hooks.session_started.set()  # it started under the earlier worker
        wiring = spec.wiring(ctx, hooks, saver)
        callbacks = ProxyCallbacks(
            on_request=self._on_request(hooks), control=wiring.control, mcp=wiring.mcp
        )
        proxy = JournalingProxy(
            journal,
            spec.canonicalizer(ctx),
            Upstream(url, key, send_key=is_loopback(url)),
            token,
            callbacks,
            models=spec.models(ctx) if spec.models else (turn_config.model or run.settings.model,),
            wires=spec.wires(ctx) if spec.wires else (ANTHROPIC.path,),
            policy=policy_of(run.settings),
        )
        # A tool use may be asked for before its answer is recorded: the ledger waits it out.
        self.ledger.settle = proxy.steps.wait_idle
        output = spec.output(ctx)
        stop_mode = spec.waits == "stop"
        with proxy:
            endpoint = host.endpoint(proxy.url, job, plan.port)
            if stop_mode:
                self.gate.stop = proxy.fail  # a pending wait stops the CLI (then parks)
            if cli is None:
                cli = host.start(spec.launch(ctx, endpoint))
            # A cancel stops the launch like a fatal error of the proxy: the CLI is killed
            # (a worker fencing itself stops it with LeaseLost: a durable CLI is left running).
            unregister = run.cancel.add_stopper(lambda why: proxy.fail(run.cancel.error()))
            try:
                finished = supervise(cli, proxy, output.feed)
            except TurnCancelled:
                if not journal.replay_only:
                    self._save_cancelled(ctx, output.fields())
                raise
            finally:
                unregister()
                if stop_mode:
                    self.gate.stopped.set()  # the CLI is gone: release a held wait hook
        outcome: dict[str, Any] = {"reply": output.reply(finished, proxy.upstream_errors)}
        outcome.update(output.fields())
        if not journal.replay_only:
            outcome.update(spec.record.final(ctx, outcome))
        # The launch's HOME (with the record) goes once the launch is journaled
        # (run_launches): a worker that dies before re-attaches and reads it again.
        return outcome

    def _save_cancelled(self, ctx: LaunchContext, fields: dict[str, Any]) -> None:
        """Save the session record as the stopped CLI left it (its finished calls and
        their results, past the last save before a tool intent)."""
        try:
            with self._save_lock:
                self.spec.record.final(ctx, {"reply": "", **fields})
        except Exception:  # the saves before each tool intent remain
            log.exception("saving the session record of a cancelled launch failed")

    def _model_made(self, saver: BeforeIntent) -> BeforeIntent:
        """``saver`` for model-made tool uses only: a made-up id (refused by the hooks)
        costs no record save (nor a wait for the record to hold it)."""

        def before_intent(reported: str | None, tool_use_id: str) -> None:
            if self.ledger.find(tool_use_id) is not None:
                saver(reported, tool_use_id)

        return before_intent

    def _on_request(self, hooks: ToolHooks) -> Callable[[dict[str, Any]], None]:
        def on_request(body: dict[str, Any]) -> None:
            hooks.require_started(self.spec.hooks_wait, self.spec.hooks_missing)
            self.spec.close_from_request(hooks, body)

        return on_request
