"""What one ACP agent is, as plain values and small callables: an :class:`AcpPreset`.

The ACP adapter (:mod:`.acp.adapter`) is the agent's ACP client: it starts the agent's
command where the turn's sandbox runs it, speaks ACP to it over its stdio and serves
the ``fs/*``, ``terminal/*`` and ``session/request_permission`` requests as journaled
steps. What differs between agents is in a preset: how the agent is found and
started, how its model endpoint and the proxy's per-launch token are given to it
(environment, or files written into the launch's private HOME), the model API it
speaks (the proxy's wire format and request canonicalizer) and where it keeps its
session record. A preset is composed, never subclassed; its registry line is
``"acp:<name>": "durable_harness.adapters.acp.presets.<module>:PRESET"`` in
``adapters/__init__.py``.

The interface is stable: fields are added with defaults only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from durable_harness.adapters.proxy.canonical import AnthropicMessagesCanonicalizer, Canonicalizer
from durable_harness.adapters.proxy.canonical_chat import ChatCanonicalizer
from durable_harness.adapters.proxy.canonical_responses import ResponsesCanonicalizer
from durable_harness.adapters.proxy.wire.anthropic import ANTHROPIC
from durable_harness.adapters.proxy.wire.chat import CHAT
from durable_harness.adapters.proxy.wire.responses import RESPONSES
from durable_harness.core.settings import Settings
from durable_harness.harness.endpoint import resolve_endpoint

__all__ = [
    "OPENAI_DEFAULT_URL",
    "AcpHome",
    "AcpPreset",
    "HomeBuilder",
    "Wire",
    "resolve_upstream",
    "turn_model",
    "wire_canonicalizer",
    "wire_path",
]

#: The model API an agent speaks to the proxy.
Wire = Literal["anthropic", "responses", "chat"]
#: Where an OpenAI-API agent's calls go when neither the turn nor OPENAI_BASE_URL says.
OPENAI_DEFAULT_URL = "https://api.openai.com"


@dataclass(frozen=True)
class AcpHome:
    """What a preset's :data:`HomeBuilder` is given for one launch."""

    home: str  # the launch's private HOME, as the agent sees it
    endpoint: str  # the proxy's base URL as the agent reaches it (no path, no /v1)
    token: str  # the proxy's per-launch token: the agent's "API key" (never a provider key)
    model: str  # the turn's model
    workspace: str  # the agent's working directory, as it sees it
    #: The agent's binary as the agent's side invokes it (absolute where it is installed):
    #: a preset finds what is installed beside it (claude-code-acp's Claude Code).
    binary: str = ""


#: ``AcpHome -> (files, env)``: files (HOME-relative path -> bytes) written, private,
#: into the launch's HOME before it starts, and the environment the agent gets besides
#: the host's allow-listed one (HOME and the XDG folders are set by the adapter).
HomeBuilder = Callable[[AcpHome], tuple[dict[str, bytes], dict[str, str]]]


@dataclass(frozen=True)
class AcpPreset:
    """One ACP agent (see the module docstring)."""

    name: str  # ``--agent acp:<name>``
    product: str  # its name in messages
    binary: str  # the command name: .tools/npm/node_modules/.bin/<binary>, or PATH
    package: str  # the npm package with its pinned version (tools/npm, scripts/setup)
    #: The pinned version, as ``<binary> --version`` prints it (first word) and the
    #: ``initialize`` result's ``agentInfo.version`` reports it ("": not checked, an
    #: operator's agent that names none).
    version: str
    bin_env: str  # the variable naming a host binary instead of the pinned one
    #: The arguments after the binary that make it speak ACP on its stdio (``("acp",)``).
    argv: tuple[str, ...]
    #: Files and environment of a launch: the model endpoint and token go here.
    home: HomeBuilder
    #: Agents built on Claude Code or Codex: a host folder only with the developer opt-in.
    docker_only: bool = False
    #: The model API it speaks to the proxy; the proxy journals only that path.
    wire: Wire = "anthropic"
    #: The request canonicalizer of its model calls (None: the wire's structural one).
    canonicalizer: Callable[[AcpHome], Canonicalizer] | None = None
    #: HOME-relative files (shell patterns allowed) that hold the agent's session record:
    #: saved to the World before each tool intent and after the launch, restored into the
    #: next launch's HOME before ``session/load``.
    record_files: tuple[str, ...] = ()
    #: Whether the agent is expected to advertise ``loadSession`` (measured); the adapter
    #: uses ``session/load`` only when it does, else a new session told what happened.
    load_session: bool = False
    #: ``--version`` arguments (some agents print their version another way).
    version_args: tuple[str, ...] = ("--version",)
    #: Extra models the agent calls besides the turn's (a title or small model).
    extra_models: tuple[str, ...] = ()
    #: Seconds ``initialize`` may take (an agent that starts a server first is slow).
    initialize_timeout: float = 60.0
    #: Names of the agent's own tools (ACP ``tool_call`` titles or kinds) that only read:
    #: journaled ``safe`` at their permission request; every other one is ``never``.
    safe_tools: frozenset[str] = field(default_factory=frozenset)
    #: How the agent names a host tool (served over MCP as server ``durable-harness``).
    host_tool_prefix: str = "mcp__durable-harness__"
    #: The agent's tools whose every effect reaches the client as ``fs/*`` or
    #: ``terminal/*`` requests (claude-code-acp's ``mcp__acp__*``): those requests are the
    #: journaled steps, so their permission request is allowed (a call the model made)
    #: and journals nothing. A second step would be redundant, and answering a finished
    #: one "rejected" ends such an agent's whole turn (claude-code-acp interrupts it).
    client_served_tools: frozenset[str] = field(default_factory=frozenset)
    #: Whether the agent's model endpoint is the journaling proxy (its model calls are
    #: journaled); an operator's agent without ``{endpoint}`` in its env gets tool-level
    #: durability only.
    model_endpoint: bool = True
    #: The model when the turn names none, for an agent that cannot take the harness's
    #: default (a Claude model) ("": that default).
    default_model: str = ""


def turn_model(preset: AcpPreset, named: str | None, operator_model: str) -> str:
    """The model of a turn: the one it names, else the operator's (``DURABLE_HARNESS_MODEL``).
    Where the preset has a default of its own, the harness's built-in default (a Claude
    model, which ``run`` fills in) counts as naming none, as for the codex adapter."""
    model = named or operator_model
    if preset.default_model and model == Settings.model_fields["model"].default:
        return preset.default_model
    return model


def wire_path(wire: Wire) -> str:
    """The journaled path of a wire format."""
    return {"anthropic": ANTHROPIC.path, "responses": RESPONSES.path, "chat": CHAT.path}[wire]


def wire_canonicalizer(preset: AcpPreset, home: AcpHome) -> Canonicalizer:
    """The preset's canonicalizer, or the wire's structural one."""
    if preset.canonicalizer is not None:
        return preset.canonicalizer(home)
    if preset.wire == "responses":
        return ResponsesCanonicalizer()
    if preset.wire == "chat":
        return ChatCanonicalizer(f"acp-{preset.name}")
    return AnthropicMessagesCanonicalizer()


def resolve_upstream(wire: Wire, base_url: str | None) -> tuple[str, str]:
    """``(base_url, api_key)`` of the upstream a preset's model calls go to, with the
    harness's own key: ``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY`` for the Anthropic wire,
    ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` for Responses and Chat (as for codex)."""
    if wire == "anthropic":
        return resolve_endpoint(base_url)
    url, key = resolve_endpoint(base_url, "OPENAI", OPENAI_DEFAULT_URL)
    return url.rstrip("/").removesuffix("/v1"), key
