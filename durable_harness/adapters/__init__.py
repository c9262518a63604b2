"""Adapters: one package per agent (builtin, claude_code, codex, opencode, pi, acp, custom).

:data:`ADAPTERS` names each agent's adapter class, or a CLI agent's spec (run by the one
CLI adapter, ``cli/agent.py``); ``get_adapter(name)`` imports the chosen one lazily. The
CLI agents share cli/ (where a CLI runs, its launches, hooks, MCP host
tools, waits, session records), which sits on proxy/ (the journaling model proxy, its wire
formats and request canonicalizers), which sits on base.py (the Adapter seam). An agent's
package never imports another's. Adapters may import harness, worlds, sandbox and core,
never the runtime or testing/.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_harness.core.errors import ConfigError

if TYPE_CHECKING:
    from durable_harness.adapters.base import Adapter

#: Agent name -> ``module:name`` of its adapter class, or of a CLI agent's
#: :class:`~.cli.spec.CliSpec` (run by :class:`~.cli.agent.CliAdapter`); imported only
#: when chosen.
ADAPTERS: dict[str, str] = {
    "builtin": "durable_harness.adapters.builtin.agent:BuiltinAdapter",
    "claude-code": "durable_harness.adapters.claude_code.spec:SPEC",
    "codex": "durable_harness.adapters.codex.spec:SPEC",
    "pi": "durable_harness.adapters.pi.spec:SPEC",
    "opencode": "durable_harness.adapters.opencode.spec:SPEC",
    # ACP agents (adapters/acp/): the harness is the agent's ACP client; one preset each.
    "acp:opencode": "durable_harness.adapters.acp.presets.opencode:PRESET",
    "acp:claude-code": "durable_harness.adapters.acp.presets.claude:PRESET",
    "acp:codex": "durable_harness.adapters.acp.presets.codex:PRESET",
    # A program's own loop on the Python API: workers only park its turns (custom/).
    "custom": "durable_harness.adapters.custom.adapter:CustomAdapter",
}
PLANNED = tuple(n for n in ("codex", "opencode", "pi") if n not in ADAPTERS)
AVAILABLE = tuple(ADAPTERS)


def get_adapter(name: str) -> Adapter:
    target = ADAPTERS.get(name)
    if target is not None:
        module_name, _, class_name = target.partition(":")
        found = getattr(importlib.import_module(module_name), class_name)
        if isinstance(found, type):
            adapter: Adapter = found()
            return adapter
        from durable_harness.adapters.acp.preset import AcpPreset

        if isinstance(found, AcpPreset):
            from durable_harness.adapters.acp.adapter import AcpAdapter

            return AcpAdapter(found)
        from durable_harness.adapters.cli.agent import CliAdapter

        return CliAdapter(found)
    if name.startswith("acp:"):
        from durable_harness.adapters.acp.operator import operator_preset

        preset = operator_preset(name.removeprefix("acp:"))
        if preset is not None:
            from durable_harness.adapters.acp.adapter import AcpAdapter

            return AcpAdapter(preset)
    if name in PLANNED:
        raise ConfigError(
            f"agent {name!r} is not available in this version yet; use one of "
            f"{', '.join(AVAILABLE)}"
        )
    coming = f" (coming: {', '.join(PLANNED)})" if PLANNED else ""
    theirs = ""
    if name.startswith("acp:"):
        from durable_harness.adapters.acp.operator import ACP_AGENTS_ENV, operator_agents

        names = [f"acp:{n}" for n in operator_agents()]
        theirs = (
            f", or one of the operator's ACP agents ({ACP_AGENTS_ENV}): "
            f"{', '.join(names) or 'none defined'}"
        )
    raise ConfigError(
        f"unknown agent {name!r}: choose one of {', '.join(AVAILABLE)}{coming}{theirs}"
    )


def read_agent_config(path: str) -> dict[str, Any]:
    """An ``--agent-config`` TOML file as a dict, stored in the turn's configuration (so
    every worker applies the same options); the adapter's ``check`` validates it."""
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read --agent-config {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--agent-config {path} is not valid TOML: {exc}") from None
