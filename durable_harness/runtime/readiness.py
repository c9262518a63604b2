"""Each agent's readiness on this machine, for ``doctor``'s agent table: where its host
binary is found (in the order the adapter looks), the version that binary reports, the
version the adapter is pinned to, and the Docker agent image the CLIs run from by default.

A CLI agent is *ready* when the agent image is built and, unless it runs only in Docker
(Claude Code, Codex), its host binary is at the pinned version too (Pi and OpenCode also
run on a host folder). Nothing here changes anything: a binary is only asked for
``--version`` (with the allow-listed environment and the timeout of a version check).
"""

from __future__ import annotations

import importlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from durable_harness.adapters import ADAPTERS
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


def _specs() -> list[CliSpec]:
    found = []
    for target in ADAPTERS.values():
        module_name, _, name = target.partition(":")
        if module_name.endswith(".spec"):
            spec = getattr(importlib.import_module(module_name), name)
            if isinstance(spec, CliSpec):
                found.append(spec)
    return found


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
            )
        )
    return rows


def format_readiness(rows: list[AgentReadiness]) -> str:
    """The table ``doctor`` prints: one line per agent, aligned columns."""
    head = ("agent", "ready", "version", "pinned", "binary", "image")
    lines = [
        (r.agent, "yes" if r.ready else f"no: {r.note}", r.version, r.pinned, r.binary, r.image)
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [head, *lines]) for i in range(len(head) - 1)]
    out = []
    for row in [head, *lines]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        out.append("  " + "  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(out)
