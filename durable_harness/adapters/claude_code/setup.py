"""Finding Claude Code and the place it runs (see :mod:`.claude_code.adapter`).

* :func:`find_claude` and :func:`check_version`: the one pinned version, on the host
  (``.tools/npm``) or in the agent image;
* :func:`open_host`: the session's Docker container (``--workspace docker``), or a host
  folder only with the developer opt-in :data:`~.cli.host.UNSAFE_HOST_ENV`;
* the names every worker derives alike: the CLI's session id, a launch's job id and the
  proxy token of a durable launch (from the turn's secret, so a worker that re-attaches
  accepts the token the CLI was started with).
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

from durable_harness.adapters.cli.host import CliHost, HostCliHost, find_cli, require_unsafe_host
from durable_harness.adapters.cli.jobs import workspace_of
from durable_harness.core.errors import ConfigError

__all__ = [
    "BIN_ENV",
    "CLAUDE_CODE_VERSION",
    "check_version",
    "claude_session_id",
    "find_claude",
    "open_host",
    "project_dir_name",
]

#: The one Claude Code version this adapter's rules were measured on (scripts/setup).
CLAUDE_CODE_VERSION = "2.1.332"
BIN_ENV = "DURABLE_HARNESS_CLAUDE_BIN"
_SESSION_NAMESPACE = uuid.UUID("5d0b8f5e-5b39-4bb5-9a55-3c1f1f4b0d2a")
_versions_seen: dict[str, str] = {}


def find_claude() -> str:
    """The ``claude`` binary: $DURABLE_HARNESS_CLAUDE_BIN, the project's pinned install
    (``.tools/npm``, made by scripts/setup), or PATH. ConfigError if none."""
    return find_cli(
        "claude", BIN_ENV, "Claude Code", f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"
    )


def check_version(binary: str, host: CliHost | None = None) -> None:
    """ConfigError unless ``binary --version`` (run where the CLI runs) is exactly
    :data:`CLAUDE_CODE_VERSION`."""
    version = _versions_seen.get(binary) if host is None or not host.durable else None
    if version is None:
        try:
            version = (host or HostCliHost(Path.cwd(), {})).version(binary)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run {binary} --version: {exc}") from None
        _versions_seen[binary] = version
    if version != CLAUDE_CODE_VERSION:
        raise ConfigError(
            f"{binary} is Claude Code {version}, but durable-harness needs exactly "
            f"{CLAUDE_CODE_VERSION} (its request canonicalization is measured on that "
            f"version): run scripts/setup, or point {BIN_ENV} at that version"
        )


def project_dir_name(workspace: str) -> str:
    """Claude Code's folder for a workspace's transcripts: the path, non-alphanumerics as -."""
    return re.sub(r"[^a-zA-Z0-9]", "-", workspace)


def claude_session_id(session_id: str) -> str:
    """The Claude Code session id of a durable-harness session (the same on every worker)."""
    return str(uuid.uuid5(_SESSION_NAMESPACE, session_id))


def open_host(config: dict[str, Any], session_id: str) -> CliHost:
    """Where the turn's CLI runs: the session's container, or (opt-in) a host folder."""
    if workspace_spec(config) == "docker":
        from durable_harness.adapters.cli.docker_host import DockerCliHost

        return DockerCliHost(session_id)
    return HostCliHost(workspace_of(config), {"claude": find_claude()})


def workspace_spec(config: dict[str, Any]) -> str:
    """``docker``, or a host folder when the developer opted in; ConfigError otherwise."""
    spec = str(config.get("workspace", "virtual"))
    if spec != "docker":
        require_unsafe_host("claude-code", spec)
    return spec
