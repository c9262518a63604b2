"""What one CLI agent is, as plain values and small callables: a :class:`CliSpec`.

The four CLI agents (Claude Code, Codex, OpenCode, Pi) run through one adapter,
:class:`~.cli.agent.CliAdapter`, which does what they share (check the turn, open the
host, restore and snapshot the workspace, plan and run the launches, wire hooks, proxy
and MCP together, save the session record) and asks the agent's spec for the rest. A
spec is composed, never subclassed: each agent's package builds one in its ``spec.py``
and the registry (``adapters/__init__.py``) points at it.

Per launch the adapter builds a :class:`LaunchContext` and hands it to the spec's
callables; the spec's :class:`RecordCodec` owns the CLI's session record (how it is found,
saved before each tool intent, restored, and quoted in a resume message) and its
:class:`CliOutput` reads the CLI's stdout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from durable_harness.adapters.base import TurnRun
from durable_harness.adapters.cli.hooks import (
    AgentConfig,
    ReplayPolicy,
    SameCall,
    ToolHooks,
    same_call,
)
from durable_harness.adapters.cli.host import CliHost, CliLaunch, Finished
from durable_harness.adapters.cli.launches import LaunchPlan
from durable_harness.adapters.cli.waits import WaitGate
from durable_harness.adapters.proxy.canonical import Canonicalizer
from durable_harness.core.types import Step, Turn
from durable_harness.core.world import World
from durable_harness.harness.tools import Tool

__all__ = [
    "BeforeIntent",
    "CliOutput",
    "CliSpec",
    "Control",
    "LaunchContext",
    "RecordCodec",
    "Wiring",
]

#: Saves the session record before a tool's intent: ``(reported path, tool_use_id)``.
BeforeIntent = Callable[[str | None, str], None]
#: ``POST /_dh/<event>`` from the CLI's hooks -> the JSON reply.
Control = Callable[[str, dict[str, Any]], dict[str, Any]]
#: ``POST /mcp`` JSON-RPC -> JSON-RPC reply, or None for a notification.
Mcp = Callable[[dict[str, Any]], dict[str, Any] | None]


@dataclass
class LaunchContext:
    """One launch, as the spec's callables see it."""

    run: TurnRun
    host: CliHost
    config: AgentConfig  # the turn's agent config, parsed by the spec
    gate: WaitGate
    tools: list[Tool]  # the host tools served over MCP: the user's, and the wait tools
    plan: LaunchPlan
    job: str
    binary: str  # the CLI as invoked where it runs
    home: str  # the launch's private HOME, as the CLI sees it
    token: str  # the proxy's per-launch token (never a provider key)
    #: The CLI's session (or thread) id when known before it starts (set by the codec).
    session: str | None = None
    #: What the codec restores into HOME (HOME-relative path -> bytes).
    restored: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class Wiring:
    """How the proxy serves one launch's hooks and host tools."""

    control: Control
    mcp: Mcp


class RecordCodec(Protocol):
    """The CLI's session record in the World (transcript, rollout, database)."""

    @property
    def key(self) -> str:
        """The plan's key for the record to restore (``transcript``, Codex's ``rollout``)."""

    def latest(self, run: TurnRun) -> Any:
        """This turn's newest saved record (under this lease's epoch or an earlier one),
        as the plan stores it; None if none was saved."""

    def previous(self, run: TurnRun) -> Any:
        """The session's previous turn's final record, as the plan stores it, or None."""

    def resume_message(self, run: TurnRun, steps: list[Step], saved: Any) -> str:
        """The message a resumed CLI gets: the prompt and, from the journal, what
        happened to each call the saved record ``saved`` holds."""

    def prepare(self, ctx: LaunchContext) -> None:
        """Before the launch: fill ``ctx.restored`` (and ``ctx.session``) from the plan."""

    def saver(self, ctx: LaunchContext, lock: Any) -> BeforeIntent:
        """Saves the record as the CLI wrote it so far (under ``lock``) before each tool
        intent, so a resume from that save knows the call exists."""

    def final(self, ctx: LaunchContext, outcome: dict[str, Any]) -> dict[str, Any]:
        """After the launch: save the final record; the fields it adds to the outcome."""


class CliOutput(Protocol):
    """Reads one launch's stdout lines and says how it ended."""

    def feed(self, line: bytes) -> None: ...

    def reply(self, finished: Finished, upstream_errors: list[str]) -> str:
        """The reply; ModelError/TurnFailed/DurableHarnessError when there is none."""

    def fields(self) -> dict[str, Any]:
        """Outcome fields besides ``reply`` (the CLI's session id, ``deferred``)."""


@dataclass(frozen=True)
class CliSpec:
    """One CLI agent (see the module docstring)."""

    name: str  # the agent's name: ``--agent <name>``
    binary: str  # the CLI's command name
    product: str  # its name in messages
    version: str  # the one version its rules were measured on (scripts/setup)
    package: str  # the npm package scripts/setup installs, with that version
    bin_env: str  # the variable naming a host binary instead of the pinned one
    #: ``(host, binary) -> version``: how ``binary --version`` reads where it runs.
    read_version: Callable[[CliHost, str], str]
    #: Claude Code, Codex: a host folder only with the developer opt-in.
    docker_only: bool
    #: ``agent_config`` of the turn -> its parsed form (ConfigError when invalid).
    parse_config: Callable[[Any], AgentConfig]
    replay_policy: Callable[[AgentConfig], ReplayPolicy]
    #: ``base_url`` of the turn -> ``(url, key)`` of the upstream (the harness's key).
    upstream: Callable[[str | None], tuple[str, str]]
    canonicalizer: Callable[[LaunchContext], Canonicalizer]
    record: RecordCodec
    #: ``(ctx, endpoint)`` -> the command, env, HOME files and stdin of the launch.
    launch: Callable[[LaunchContext, str], CliLaunch]
    output: Callable[[LaunchContext], CliOutput]
    #: ``(ctx, hooks, saver)`` -> the proxy's hook and MCP handlers.
    wiring: Callable[[LaunchContext, ToolHooks, BeforeIntent | None], Wiring]
    #: How the CLI names a host tool to its hooks.
    host_tool_prefix: str
    #: ``defer``: the CLI defers a pending wait's call itself (Claude Code); ``stop``:
    #: the gate stops the CLI at it and the next delivery resumes (cli/waits.py).
    waits: Literal["defer", "stop"]
    #: Seconds the first model call waits for proof the hooks are live, and the error.
    hooks_wait: float
    hooks_missing: str
    #: Records, from a model request, outputs of calls whose PostToolUse never came.
    close_from_request: Callable[[ToolHooks, dict[str, Any]], None]
    #: Names a host tool may not take (the CLI's own tools).
    reserved_tools: frozenset[str] = frozenset()
    #: Whether a hook's ``(tool_name, tool_input)`` of the CLI's own tool is the model's
    #: tool use (cli/ledger.py): by default the same name and input.
    same_call: SameCall = same_call
    #: The models the launch's CLI is configured to call (what its proxy lets through,
    #: with the operator's extras); None: the turn's model.
    models: Callable[[LaunchContext], tuple[str, ...]] | None = None
    #: The journaled paths of the model APIs the launch's CLI speaks (the proxy refuses
    #: the others); None: the Anthropic Messages API.
    wires: Callable[[LaunchContext], tuple[str, ...]] | None = None
    #: Whether a resumed launch's stored plan names its number (``launch``): OpenCode's
    #: never did, and the stored plan keeps its spelling.
    numbered_resumes: bool = True
    #: ``(world, turn, kept steps, new session id) -> record digest``: the CLI's own
    #: session record cut at a fork point (``durable-harness fork``); None: not offered.
    fork: Callable[[World, Turn, list[Step], str], str] | None = None

    @property
    def home_prefix(self) -> str:
        """The prefix of a host launch's HOME folder (tests find its processes by it)."""
        return f"durable-harness-{self.binary}-"
