"""``--agent acp:<preset>``: an ACP agent with the harness as its client.

:class:`AcpAdapter` checks the turn and runs its launches with
:func:`~.cli.launches.run_launches` (the CLI agents' launch rules: a finished launch's
reply, a resume from the saved session record, waits settled first) and an
:class:`~.acp.launcher.AcpLauncher`. Where the agent runs is the CLI agents' one host
opener (:func:`~.cli.where.open_cli_host`): in this version a host folder, as the
unprivileged agent user under the reaper; a ``docker_only`` preset needs the developer
opt-in there, as Claude Code and Codex do. ``--workspace docker`` is refused with a
clear error until the container path lands.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from durable_harness.adapters.acp.launcher import AcpLauncher
from durable_harness.adapters.acp.preset import AcpPreset
from durable_harness.adapters.acp.tools import AcpConfig
from durable_harness.adapters.base import Adapter, TurnRun
from durable_harness.adapters.cli.host import HostCliHost, find_cli
from durable_harness.adapters.cli.launches import finished_reply, run_launches
from durable_harness.adapters.cli.where import check_where, open_cli_host
from durable_harness.adapters.push_tool import GIT_PUSH
from durable_harness.core.errors import ConfigError
from durable_harness.core.settings import Settings
from durable_harness.core.turn_config import DOCKER, TurnConfig
from durable_harness.harness.model import resolve_endpoint
from durable_harness.harness.tools import load_user_tools
from durable_harness.harness.waits import WAIT_TOOL_NAMES

__all__ = ["AcpAdapter", "find_agent"]

_versions: dict[str, str] = {}  # host binary -> the version it printed


def find_agent(preset: AcpPreset) -> str:
    """The host binary: ``$<bin_env>``, the pinned install (.tools/npm), or PATH."""
    return find_cli(preset.binary, preset.bin_env, preset.product, preset.package)


def check_version(preset: AcpPreset, host: HostCliHost, binary: str) -> None:
    """ConfigError unless the agent is exactly the preset's pinned version."""
    version = _versions.get(binary)
    if version is None:
        try:
            version = host.version(binary) if preset.version_args == ("--version",) else ""
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run {binary} --version: {exc}") from None
        _versions[binary] = version
    if preset.version_args == ("--version",) and version != preset.version:
        raise ConfigError(
            f"{binary} is {preset.product} {version}, but acp:{preset.name} needs exactly "
            f"{preset.version}: run scripts/setup, or point {preset.bin_env} at that version"
        )


class AcpAdapter(Adapter):
    """The adapter of one ACP agent, all of whose own parts are its ``preset``."""

    default_workspace = DOCKER

    def __init__(self, preset: AcpPreset) -> None:
        self.preset = preset
        self.name = f"acp:{preset.name}"

    def check(self, config: dict[str, Any], settings: Settings) -> None:
        preset, turn = self.preset, TurnConfig.of(config)
        if turn.workspace == DOCKER:
            raise ConfigError(
                f"the {self.name} agent runs on a host folder in this version: give "
                "--workspace DIR (the Docker sandbox for ACP agents is not built yet)"
            )
        check_where(turn, self.name, docker_only=preset.docker_only)
        load_user_tools(turn.tools, [*WAIT_TOOL_NAMES, GIT_PUSH])
        AcpConfig.parse(turn.agent_config, "in the turn")
        resolve_endpoint(turn.base_url)
        binary = find_agent(preset)
        check_version(preset, HostCliHost(Path.cwd(), {}), binary)

    def run_turn(self, run: TurnRun) -> str:
        reply = finished_reply(run)
        if reply is not None:
            return reply
        preset = self.preset
        with open_cli_host(
            run.turn_config,
            run.turn.session_id,
            self.name,
            lambda: {preset.binary: find_agent(preset)},
            docker_only=preset.docker_only,
            home_prefix=f"durable-harness-acp-{preset.binary}-",
        ) as host:
            return run_launches(run, self.name, host, AcpLauncher(preset, run, host))
