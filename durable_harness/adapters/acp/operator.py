"""The operator's own ACP agents: presets defined in the worker's environment, never in
a turn.

``DURABLE_HARNESS_ACP_AGENTS`` names a TOML file of the operator's (read by the process
that checks or runs the turn: ``run``, a worker, ``serve``), one table per agent::

    [acp.agents.mine]
    command = ["/opt/mine/bin/mine", "acp"]   # its program and the arguments for ACP
    version = "1.4.2"             # optional: initialize's agentInfo.version must be it
    docker_only = false           # true: a host folder only with the developer opt-in
    wire = "anthropic"            # its model API: anthropic | responses | chat
    # Its environment besides the allow-listed one; {endpoint} is the journaling proxy
    # (no path), {token} the per-launch token, {model} the turn's model, {home} and
    # {workspace} as the agent sees them. Everything here reaches the agent: no secret.
    env = { MINE_BASE_URL = "{endpoint}/v1", MINE_API_KEY = "{token}" }
    record_files = [".local/share/mine/*.db"]   # its session record, HOME-relative
    load_session = false          # whether it advertises loadSession (measured)
    safe_tools = ["read"]         # its own tools that only read (replay label safe)

``run --agent acp:mine`` (and a queued turn, and the HTTP API's session) names one; the
turn carries only that name. An unknown name is refused before anything runs
(``get_adapter``), and a turn's ``--agent-config`` cannot carry a command, arguments or
environment (its schema has no such field: :class:`~.acp.tools.AcpConfig`). A name of a
built-in preset cannot be redefined.
"""

from __future__ import annotations

import os
import re
import tomllib
from functools import cache
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from durable_harness.adapters.acp.preset import AcpHome, AcpPreset, Wire
from durable_harness.core.errors import ConfigError

__all__ = ["ACP_AGENTS_ENV", "PLACEHOLDERS", "operator_agents", "operator_preset"]

ACP_AGENTS_ENV = "DURABLE_HARNESS_ACP_AGENTS"
#: What an ``env`` value may name, filled in per launch.
PLACEHOLDERS = ("{endpoint}", "{token}", "{model}", "{home}", "{workspace}")
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")


class _Agent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    product: str = ""
    version: str = ""
    docker_only: bool = False
    wire: Wire = "anthropic"
    env: dict[str, str] = Field(default_factory=dict)
    record_files: list[str] = Field(default_factory=list)
    load_session: bool = False
    safe_tools: list[str] = Field(default_factory=list)
    initialize_timeout: float = Field(default=60.0, gt=0, le=600)


def _fill(template: str, launch: AcpHome) -> str:
    values = {
        "{endpoint}": launch.endpoint,
        "{token}": launch.token,
        "{model}": launch.model,
        "{home}": launch.home,
        "{workspace}": launch.workspace,
    }
    # One pass over the template: a value (the turn's model) is never read as a template.
    return re.sub("|".join(map(re.escape, values)), lambda m: values[m.group(0)], template)


def _preset(name: str, agent: _Agent) -> AcpPreset:
    env = dict(agent.env)

    def home(launch: AcpHome) -> tuple[dict[str, bytes], dict[str, str]]:
        return {}, {key: _fill(value, launch) for key, value in env.items()}

    return AcpPreset(
        name=name,
        product=agent.product or f"the operator's ACP agent {name!r}",
        binary=agent.command[0],
        package=f"(the operator's: {ACP_AGENTS_ENV})",
        version=agent.version,
        bin_env="",  # its command is the operator's setting: no override of its own
        argv=tuple(agent.command[1:]),
        home=home,
        docker_only=agent.docker_only,
        wire=agent.wire,
        record_files=tuple(agent.record_files),
        load_session=agent.load_session,
        version_args=(),  # checked at initialize (agentInfo.version), if a version is set
        initialize_timeout=agent.initialize_timeout,
        safe_tools=frozenset(agent.safe_tools),
        model_endpoint=any("{endpoint}" in value for value in env.values()),
    )


@cache
def _load(path: str, mtime: float) -> dict[str, AcpPreset]:
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{ACP_AGENTS_ENV}: cannot read {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{ACP_AGENTS_ENV}: {path} is not valid TOML: {exc}") from None
    table = data.get("acp", {}).get("agents", {}) if isinstance(data.get("acp"), dict) else {}
    if not isinstance(table, dict):
        raise ConfigError(f"{ACP_AGENTS_ENV}: [acp.agents] in {path} is not a table")
    from durable_harness.adapters import ADAPTERS

    presets = {}
    for name, raw in table.items():
        where = f"{ACP_AGENTS_ENV}: [acp.agents.{name}] in {path}"
        if not _NAME.fullmatch(name):
            raise ConfigError(f"{where}: a name is lowercase letters, digits, '-' and '_'")
        if f"acp:{name}" in ADAPTERS:
            raise ConfigError(f"{where}: acp:{name} is a built-in preset; choose another name")
        try:
            agent = _Agent.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
            )
            raise ConfigError(f"{where}: {problems}") from None
        presets[name] = _preset(name, agent)
    return presets


def operator_agents() -> dict[str, AcpPreset]:
    """The operator's ACP agents by name (none when ``DURABLE_HARNESS_ACP_AGENTS`` is
    unset); ConfigError for a file that cannot be read or is malformed."""
    path = os.environ.get(ACP_AGENTS_ENV)
    if not path:
        return {}
    try:
        mtime = os.stat(path).st_mtime
    except OSError as exc:
        raise ConfigError(f"{ACP_AGENTS_ENV}: cannot read {path}: {exc.strerror}") from None
    return _load(path, mtime)


def operator_preset(name: str) -> AcpPreset | None:
    """The operator's ACP agent ``acp:<name>``, or None."""
    return operator_agents().get(name)
