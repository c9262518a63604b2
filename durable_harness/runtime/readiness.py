"""Each agent's readiness on this machine, for ``doctor``'s agent table: where its host
binary is found (in the order the adapter looks), the version that binary reports, the
version the adapter is pinned to, and the Docker agent image the CLIs run from by default.

A CLI agent is *ready* when the agent image is built and, unless it runs only in Docker
(Claude Code, Codex), its host binary is at the pinned version too (Pi and OpenCode also
run on a host folder). Nothing here changes anything: a binary is only asked for
``--version`` (with the allow-listed environment and the timeout of a version check).

The ACP presets (``acp:<name>``, built-in and the operator's ``DURABLE_HARNESS_ACP_AGENTS``)
get a row each too: claude-code-acp and codex-acp have no ``--version`` (a launch checks
the ``initialize`` result's ``agentInfo.version``), so their version here is the installed
package's ``package.json``; an operator's agent's version is checked at launch only. The
last columns say whether an agent runs only in Docker and whether its model endpoint is
the journaling proxy (no: tool-level durability only).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from durable_harness.adapters import ADAPTERS
from durable_harness.adapters.acp.operator import operator_agents
from durable_harness.adapters.acp.preset import AcpPreset
from durable_harness.adapters.cli.host import HostCliHost, locate_cli
from durable_harness.adapters.cli.spec import CliSpec
from durable_harness.sandbox.docker_admin import image_state

__all__ = ["AgentReadiness", "agent_readiness", "format_readiness"]


@dataclass(frozen=True)
class AgentReadiness:
    agent: str
    binary: str  # "where: path", or what to run when there is none
    version: str
    pinned: str
    image: str  # "tag (built|outdated|missing|unknown: …)"
    ready: bool
    note: str  # what to do when not ready
    docker_only: bool = False
    model_endpoint: bool = True  # its model calls go through the journaling proxy


def _specs() -> list[CliSpec]:
    found = []
    for target in ADAPTERS.values():
        module_name, _, name = target.partition(":")
        if module_name.endswith(".spec"):
            spec = getattr(importlib.import_module(module_name), name)
            if isinstance(spec, CliSpec):
                found.append(spec)
    return found


def _presets() -> list[AcpPreset]:
    """The built-in ACP presets, then the operator's."""
    found = []
    for name, target in ADAPTERS.items():
        module_name, _, attr = target.partition(":")
        if name.startswith("acp:"):
            preset = getattr(importlib.import_module(module_name), attr)
            if isinstance(preset, AcpPreset):
                found.append(preset)
    return [*found, *operator_agents().values()]


def _package_version(binary: str, package: str) -> str:
    """The version in the ``package.json`` of ``package`` in the npm install that holds
    ``binary`` (``…/node_modules/.bin/<binary>``): for agents without ``--version``."""
    name = package.rpartition("@")[0] or package
    meta = Path(binary).parent.parent / name / "package.json"
    try:
        return str(json.loads(meta.read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown (no --version)"


def _acp_row(preset: AcpPreset, tag: str, state: str) -> AgentReadiness:
    builtin = bool(preset.bin_env)
    if builtin:
        located = locate_cli(preset.binary, preset.bin_env)
    else:
        path = preset.binary if os.path.isabs(preset.binary) else None
        located = ("operator", path) if path and os.access(path, os.X_OK) else None
    if located is None:
        version = "-"
    elif preset.version_args == ("--version",):
        try:
            version = HostCliHost(Path.cwd(), {}).version(located[1])
        except (OSError, subprocess.SubprocessError) as exc:
            version = f"error: {type(exc).__name__}"
    elif builtin:
        version = _package_version(located[1], preset.package)
    else:
        version = "at launch"
    notes = []
    if builtin and state in ("missing", "outdated"):
        notes.append(f"image {state}: run `durable-harness sandbox build`")
    elif builtin and state != "built":
        notes.append(f"image {state}")
    if builtin and version != preset.version and not preset.docker_only:
        notes.append("run `durable-harness setup-agents`")
    if not builtin and located is None and not preset.docker_only:
        notes.append(f"{preset.binary} is not an executable path here")
    return AgentReadiness(
        f"acp:{preset.name}",
        f"{located[0]}: {located[1]}" if located else "not found",
        version,
        preset.version or "-",
        f"{tag} ({state})" if builtin else "the turn's image",
        not notes,
        ", ".join(notes),
        preset.docker_only,
        preset.model_endpoint,
    )


def _host_version(spec: CliSpec, binary: str) -> str:
    try:
        return spec.read_version(HostCliHost(Path.cwd(), {}), binary)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"error: {type(exc).__name__}"


def agent_readiness(docker_host: str | None = None) -> list[AgentReadiness]:
    """One row per agent (the built-in one first); see the module docstring."""
    tag, state = image_state(docker_host)
    # An outdated image holds other CLI versions than the pins: not ready until rebuilt.
    image_ok = state == "built"
    rows = [AgentReadiness("builtin", "(in the worker)", "-", "-", "not needed", True, "")]
    for spec in _specs():
        located = locate_cli(spec.binary, spec.bin_env)
        version = _host_version(spec, located[1]) if located else "-"
        host_ok = version == spec.version
        notes = []
        if state in ("missing", "outdated"):
            notes.append(f"image {state}: run `durable-harness sandbox build`")
        elif not image_ok:
            notes.append(f"image {state}")
        if not host_ok and not spec.docker_only:
            notes.append(
                f"point {spec.bin_env} at {spec.version}"
                if located is not None and located[0] == f"${spec.bin_env}"
                else "run `durable-harness setup-agents`"
            )
        binary = f"{located[0]}: {located[1]}" if located else "not found"
        rows.append(
            AgentReadiness(
                spec.name,
                binary,
                version,
                spec.version,
                f"{tag} ({state})",
                not notes,
                ", ".join(notes),
                spec.docker_only,
            )
        )
    rows.extend(_acp_row(preset, tag, state) for preset in _presets())
    return rows


def format_readiness(rows: list[AgentReadiness]) -> str:
    """The table ``doctor`` prints: one line per agent, aligned columns."""
    head = (
        "agent",
        "ready",
        "version",
        "pinned",
        "docker only",
        "model endpoint",
        "binary",
        "image",
    )
    lines = [
        (
            r.agent,
            "yes" if r.ready else f"no: {r.note}",
            r.version,
            r.pinned,
            "yes" if r.docker_only else "no",
            "proxy" if r.model_endpoint else "not settable",
            r.binary,
            r.image,
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [head, *lines]) for i in range(len(head) - 1)]
    out = []
    for row in [head, *lines]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        out.append("  " + "  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(out)
