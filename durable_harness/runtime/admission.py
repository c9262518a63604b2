"""Admission: a turn is data, not configuration.

Whoever can enqueue a turn into a shared World is not trusted; the operator who runs the
worker is. So every field of a stored turn that could widen what the worker does is
checked here, against the claiming worker's policy (its :class:`~.core.settings.Settings`),
before anything of the turn is imported or run:

==================  ==============================================================
``base_url``        the worker's key goes there: one of the worker's own endpoints
                    (``ANTHROPIC_BASE_URL``, ``OPENAI_BASE_URL``) or of
                    ``DURABLE_HARNESS_ALLOWED_BASE_URLS``
``tools``           a registered tool set's name, or a ``path:LIST`` spec whose file is
                    registered (``DURABLE_HARNESS_TOOL_SETS``): the file is imported
``workspace``       ``virtual``, ``docker``, or a host folder that resolves (symlinks
                    followed) inside ``DURABLE_HARNESS_WORKSPACE_ROOTS``
``image``           one of ``DURABLE_HARNESS_ALLOWED_IMAGES`` (its programs run in
                    the sandbox; the session image is derived from it)
``max_*``           at most the worker's own setting (the ceiling): lower, never raise
``budget_*``        the same (harness/budget.py); none set: the worker's own. The
                    tenant's budget is the worker's setting alone, never the turn's
``push_remote``     the ``git_push`` tool pushes there with the worker's credentials: a
                    remote of ``DURABLE_HARNESS_ALLOWED_PUSH_REMOTES``, with no
                    credentials in its URL
``ci_repo``         the turn's choice: which repository's CI results ``git_push``
                    routes to this turn (it receives them, it causes nothing)
``setup``           one of ``DURABLE_HARNESS_ALLOWED_SETUP_COMMANDS`` (or ``*`` there):
                    it runs with the operator's registries reachable
``agent_config``    labels a tool ``safe`` only if that is its label anyway or it is in
                    ``DURABLE_HARNESS_SAFE_TOOLS``; ``safe_bash`` patterns only those
                    of ``DURABLE_HARNESS_SAFE_BASH``; ``never`` labels and the
                    provider's wire API are the turn's choice (they widen nothing)
==================  ==============================================================

:func:`admit` gives the effective configuration (tool set names resolved to their files,
the workspace resolved, every limit filled in) or raises :class:`TurnRefused` naming
every field that asks for more. A field a later version adds to :class:`TurnConfig`
gets its check here too (``tests/security/test_admission.py`` fails until it has one).

What the person running ``durable-harness run`` (or the Python API's ``run_turn`` /
``enqueue_turn``) types is the operator's own choice: :func:`grant` records it for this
process, so ``run --tools ./x.py:TOOLS --base-url URL`` works on one machine as before,
and a worker in another process still needs the operator's settings for it.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import ConfigError, TurnRefused
from durable_harness.core.settings import Settings
from durable_harness.core.turn_config import DOCKER, VIRTUAL, TurnConfig
from durable_harness.harness.budget import TURN_LIMITS

__all__ = [
    "CHECKED_FIELDS",
    "Admitted",
    "Policy",
    "admit",
    "grant",
    "is_tool_set_name",
    "parse_tool_sets",
]

#: The limits whose worker setting is the ceiling a turn may only lower.
LIMITS = ("max_model_calls", "max_tokens", "max_files", "max_bytes")
#: Every TurnConfig field and what admission does with it (a new field needs a line).
CHECKED_FIELDS = {
    "agent": "one of the registered agents or of the worker's DURABLE_HARNESS_ACP_AGENTS "
    "(an unknown one is refused by get_adapter)",
    "workspace": "virtual, docker, or a folder under the workspace roots",
    "tools": "registered tool sets by name, or registered paths",
    "model": "the turn's choice (the proxy checks requests against it)",
    "max_tokens": "at most the worker's ceiling",
    "max_model_calls": "at most the worker's ceiling",
    "max_files": "at most the worker's ceiling",
    "max_bytes": "at most the worker's ceiling",
    "budget_turn_tokens": "at most the worker's ceiling (none: any, as a lowering of none)",
    "budget_turn_usd": "at most the worker's ceiling (none: any, as a lowering of none)",
    "budget_session_tokens": "at most the worker's ceiling (none: any, as a lowering of none)",
    "budget_session_usd": "at most the worker's ceiling (none: any, as a lowering of none)",
    "signal_secret": "the turn's own: authenticates signals to this turn only",
    "base_url": "the worker's own endpoints or the allowed base URLs",
    "agent_config": "no safe label or safe_bash pattern the operator did not allow",
    "image": "one of the allowed images",
    "push_remote": "one of the allowed push remotes, with no credentials in it",
    "ci_repo": "the turn's choice: it routes CI results to this turn only (no side effect)",
    "setup": "one of the allowed setup commands (it reaches the allowed registries)",
    "trace_id": "the turn's choice: names its trace (32 lowercase hex, else derived from the "
    "turn id at claim: runtime/telemetry); it causes nothing",
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_DEFAULT_LIST = "TOOLS"


def is_tool_set_name(entry: str) -> bool:
    """Whether a ``tools`` entry names a registered set (a spec holds ``path:LIST``)."""
    return _NAME.fullmatch(entry) is not None


def parse_tool_sets(entries: tuple[str, ...] | list[str]) -> tuple[dict[str, str], set[str]]:
    """``DURABLE_HARNESS_TOOL_SETS`` entries -> (name -> spec, the registered files, each
    resolved). ``name=/path/tools.py`` means the file's ``TOOLS`` list; an entry without
    a name registers its file for the specs stored with turns (as older turns have)."""
    names: dict[str, str] = {}
    files: set[str] = set()
    for entry in entries:
        name, sep, spec = entry.partition("=")
        if not sep:
            name, spec = "", entry
        elif not is_tool_set_name(name.strip()):
            raise ConfigError(
                f"DURABLE_HARNESS_TOOL_SETS: {name!r} is not a tool set name "
                "(letters, digits, '_', '.', '-')"
            )
        spec = spec.strip()
        path, colon, attr = spec.rpartition(":")
        if not colon or not path or "/" in attr:
            path, attr = spec, _DEFAULT_LIST
        if not path:
            raise ConfigError(f"DURABLE_HARNESS_TOOL_SETS: {entry!r} names no file")
        file = str(Path(path).expanduser().resolve())
        files.add(file)
        if name:
            names[name.strip()] = f"{file}:{attr}"
    return names, files


def _file_of(entry: str) -> str | None:
    """The resolved file of a ``/path/tools.py:LIST`` spec (``None``: not such a spec)."""
    path, sep, attr = entry.rpartition(":")
    if not sep or not path or not attr or not Path(path).is_absolute():
        return None
    return str(Path(path).resolve())


def endpoint_key(url: str) -> str | None:
    """A model endpoint as compared: scheme, host and port, path without ``/`` or
    ``/v1`` at its end. ``None`` for a URL that is not a plain endpoint (credentials,
    query, fragment, an unknown scheme or a bad port): never allowed."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        return None
    port = port or (443 if scheme == "https" else 80)
    path = parts.path.rstrip("/").removesuffix("/v1").rstrip("/")
    return f"{scheme}://{parts.hostname.lower()}:{port}{path}"


def own_endpoints() -> list[str]:
    """The endpoints this worker is configured with: a turn naming one gets what it gets
    without naming any."""
    from durable_harness.adapters.codex.setup import DEFAULT_BASE_URL as OPENAI_DEFAULT
    from durable_harness.harness.endpoint import DEFAULT_BASE_URL as ANTHROPIC_DEFAULT

    return [
        os.environ.get("ANTHROPIC_BASE_URL") or ANTHROPIC_DEFAULT,
        os.environ.get("OPENAI_BASE_URL") or OPENAI_DEFAULT,
    ]


@dataclass
class _Grants:
    """What this process's own operator typed (``run``, the Python API)."""

    tools: set[str] = field(default_factory=set)
    base_urls: set[str] = field(default_factory=set)
    workspaces: set[str] = field(default_factory=set)
    agent_configs: set[str] = field(default_factory=set)
    images: set[str] = field(default_factory=set)
    push_remotes: set[str] = field(default_factory=set)
    setups: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


_GRANTS = _Grants()


def grant(config: Mapping[str, Any]) -> None:
    """Allow, in this process, what ``config`` holds: it was typed by the operator here
    (``durable-harness run``, ``run_turn``/``enqueue_turn``), not read from the World."""
    turn = TurnConfig.of(config)
    with _GRANTS.lock:
        for entry in turn.tools:
            file = _file_of(entry)
            if file is not None:
                _GRANTS.tools.add(file)
        if turn.base_url:
            key = endpoint_key(turn.base_url)
            if key is not None:
                _GRANTS.base_urls.add(key)
        if turn.workspace not in (VIRTUAL, DOCKER):
            _GRANTS.workspaces.add(str(Path(turn.workspace).resolve()))
        if turn.agent_config is not None:
            _GRANTS.agent_configs.add(canonical_json(turn.agent_config))
        if turn.image is not None:
            _GRANTS.images.add(turn.image)
        if turn.push_remote:
            _GRANTS.push_remotes.add(_remote_key(turn.push_remote))
        if turn.setup is not None:
            _GRANTS.setups.add(turn.setup)


@dataclass(frozen=True)
class Policy:
    """The operator's policy, from a worker's settings and this process's grants."""

    base_urls: frozenset[str]
    tool_names: Mapping[str, str]
    tool_files: frozenset[str]
    roots: tuple[Path, ...]
    safe_tools: frozenset[str]
    safe_bash: frozenset[str]
    agent_configs: frozenset[str]
    images: frozenset[str]
    ceilings: Mapping[str, int]
    push_remotes: frozenset[str] = frozenset()
    setups: frozenset[str] = frozenset()

    @classmethod
    def of(cls, settings: Settings) -> Policy:
        names, files = parse_tool_sets(settings.tool_sets)
        urls = [*own_endpoints(), *settings.allowed_base_urls]
        keys = {k for k in map(endpoint_key, urls) if k is not None}
        with _GRANTS.lock:
            return cls(
                base_urls=frozenset(keys | _GRANTS.base_urls),
                tool_names=names,
                tool_files=frozenset(files | _GRANTS.tools),
                roots=tuple(
                    Path(r).expanduser().resolve()
                    for r in (*settings.workspace_roots, *_GRANTS.workspaces)
                ),
                safe_tools=frozenset(settings.safe_tools),
                safe_bash=frozenset(settings.safe_bash),
                agent_configs=frozenset(_GRANTS.agent_configs),
                images=frozenset(set(settings.allowed_images) | _GRANTS.images),
                ceilings={name: int(getattr(settings, name)) for name in LIMITS},
                push_remotes=frozenset(
                    {_remote_key(r) for r in settings.allowed_push_remotes} | _GRANTS.push_remotes
                ),
                setups=frozenset(set(settings.allowed_setup_commands) | _GRANTS.setups),
            )


@dataclass(frozen=True)
class Admitted:
    """A turn the worker may run: its effective configuration (what the adapter reads:
    tool names resolved to files, the workspace resolved, every limit filled in)."""

    config: dict[str, Any]
    max_model_calls: int


def admit(config: Mapping[str, Any] | TurnConfig, settings: Settings) -> Admitted:
    """Check a stored turn against the worker's policy (see the module docstring).
    :class:`TurnRefused` names every field that asks for more than it allows; nothing
    of the turn is imported, run or sent here."""
    turn = TurnConfig.of(config)
    policy = Policy.of(settings)
    effective = turn.stored()
    problems: list[str] = []
    if turn.base_url is not None and endpoint_key(turn.base_url) not in policy.base_urls:
        problems.append(
            f"base_url {turn.base_url!r} is not an endpoint this worker uses or allows "
            "(DURABLE_HARNESS_ALLOWED_BASE_URLS)"
        )
    tools, refused = _tools(turn.tools, policy)
    problems += refused
    if turn.tools:
        effective["tools"] = tools
    workspace = _workspace(turn.workspace, policy, problems)
    if workspace is not None:
        effective["workspace"] = workspace
    for name in LIMITS:
        ceiling, asked = policy.ceilings[name], getattr(turn, name)
        if asked is not None and asked > ceiling:
            problems.append(
                f"{name} {asked} is above this worker's ceiling {ceiling} "
                f"(DURABLE_HARNESS_{name.upper()})"
            )
        effective[name] = ceiling if asked is None else asked
    for name in TURN_LIMITS:
        cap, wanted = getattr(settings, name), getattr(turn, name)
        if wanted is not None and cap is not None and wanted > cap:
            problems.append(
                f"{name} {wanted} is above this worker's ceiling {cap} "
                f"(DURABLE_HARNESS_{name.upper()})"
            )
        elif wanted is not None or cap is not None:
            effective[name] = cap if wanted is None else wanted
    problems += _agent_config(turn, policy)
    if turn.image is not None and turn.image not in policy.images:
        problems.append(
            f"image {turn.image!r} is not an image this worker allows "
            "(DURABLE_HARNESS_ALLOWED_IMAGES)"
        )
    if turn.push_remote is not None:
        problems += _push_remote(turn.push_remote, policy)
    if turn.setup is not None and not ({"*", turn.setup} & policy.setups):
        problems.append(
            f"setup {turn.setup!r} is not a setup command this worker allows "
            "(DURABLE_HARNESS_ALLOWED_SETUP_COMMANDS)"
        )
    if problems:
        raise TurnRefused("refused by this worker's policy: " + "; ".join(problems))
    return Admitted(effective, int(effective["max_model_calls"]))


def _tools(entries: list[str], policy: Policy) -> tuple[list[str], list[str]]:
    specs: list[str] = []
    problems: list[str] = []
    for entry in entries:
        if is_tool_set_name(entry):
            spec = policy.tool_names.get(entry)
            if spec is None:
                problems.append(
                    f"tools {entry!r} is not a tool set registered on this worker "
                    "(DURABLE_HARNESS_TOOL_SETS)"
                )
            else:
                specs.append(spec)
        elif _file_of(entry) in policy.tool_files:
            specs.append(entry)
        else:
            problems.append(
                f"tools {entry!r} is not a tools file registered on this worker: name a "
                "registered tool set, or register the file (DURABLE_HARNESS_TOOL_SETS)"
            )
    return specs, problems


def _workspace(spec: str, policy: Policy, problems: list[str]) -> str | None:
    if spec in (VIRTUAL, DOCKER):
        return None
    if not Path(spec).is_absolute():
        problems.append(f"workspace {spec!r} is not an absolute folder")
        return None
    real = Path(spec).resolve()
    if any(real == root or root in real.parents for root in policy.roots):
        return str(real)
    shown = spec if str(real) == spec else f"{spec} ({real} with symlinks followed)"
    problems.append(
        f"workspace {shown} is outside this worker's workspace roots "
        "(DURABLE_HARNESS_WORKSPACE_ROOTS)"
    )
    return None


def _remote_key(url: str) -> str:
    """A remote as compared: without a trailing slash (the same repository either way)."""
    return url.strip().rstrip("/")


def _push_remote(url: str, policy: Policy) -> list[str]:
    from durable_harness.repo.push import check_remote

    try:
        check_remote(url)  # no credentials stored with a turn, whoever wrote it
    except ConfigError as exc:
        return [str(exc)]
    if _remote_key(url) in policy.push_remotes:
        return []
    return [
        f"push_remote {url!r} is not a remote this worker may push to "
        "(DURABLE_HARNESS_ALLOWED_PUSH_REMOTES)"
    ]


def _agent_config(turn: TurnConfig, policy: Policy) -> list[str]:
    """What in the agent config widens the replay labels: a tool labelled ``safe`` that
    is ``never`` by default (it would run again on a resume) and ``safe_bash`` patterns."""
    if turn.agent_config is None or canonical_json(turn.agent_config) in policy.agent_configs:
        return []
    from durable_harness.adapters import get_adapter
    from durable_harness.adapters.acp.adapter import AcpAdapter
    from durable_harness.adapters.acp.tools import AcpConfig, AcpReplayPolicy
    from durable_harness.adapters.cli.agent import CliAdapter
    from durable_harness.adapters.cli.hooks import AgentConfig, ReplayPolicy

    adapter = get_adapter(turn.agent)
    parsed: AgentConfig
    defaults: ReplayPolicy
    if isinstance(adapter, CliAdapter):
        spec = adapter.spec
        parsed = spec.parse_config(turn.agent_config)  # ConfigError when it is malformed
        defaults = spec.replay_policy(spec.parse_config(None))
    elif isinstance(adapter, AcpAdapter):  # the CLI agents' [replay] table, by ACP tool name
        parsed = AcpConfig.parse(turn.agent_config, "in the turn")
        defaults = AcpReplayPolicy(AcpConfig(), adapter.preset.safe_tools)
    else:
        return []  # the built-in agent reads no agent config
    problems = [
        f"agent_config labels {name!r} safe, which this worker does not allow "
        "(DURABLE_HARNESS_SAFE_TOOLS)"
        for name, label in sorted(parsed.replay.tools.items())
        if label == "safe" and name not in policy.safe_tools and defaults.label(name, {}) != "safe"
    ]
    problems += [
        f"agent_config marks Bash commands {pattern!r} safe, a pattern this worker does "
        "not allow (DURABLE_HARNESS_SAFE_BASH)"
        for pattern in parsed.replay.safe_bash
        if pattern not in policy.safe_bash
    ]
    return problems
