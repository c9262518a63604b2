"""``--agent acp:<preset>``: an ACP agent with the harness as its client.

:class:`AcpAdapter` checks the turn and runs its launches with
:func:`~.cli.launches.run_launches` (the CLI agents' launch rules: a finished launch's
reply, a resume from the saved session record, waits settled first) and an
:class:`~.acp.launcher.AcpLauncher`. Where the agent runs is the CLI agents' one host
opener (:func:`~.cli.where.open_cli_host`): a host folder, as the unprivileged agent
user under the reaper (a ``docker_only`` preset needs the developer opt-in there, as
Claude Code and Codex do), or the session's container (:mod:`.acp.docker`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from durable_harness.adapters.acp.docker import stop_job
from durable_harness.adapters.acp.launcher import AcpLauncher
from durable_harness.adapters.acp.preset import AcpPreset, resolve_upstream
from durable_harness.adapters.acp.tools import AcpConfig
from durable_harness.adapters.acp.version import check_version, find_agent
from durable_harness.adapters.base import Adapter, TurnRun
from durable_harness.adapters.cli.docker_host import DockerCliHost
from durable_harness.adapters.cli.host import HostCliHost, launch_steps
from durable_harness.adapters.cli.jobs import job_id
from durable_harness.adapters.cli.launches import finished_reply, run_launches
from durable_harness.adapters.cli.where import check_where, open_cli_host
from durable_harness.adapters.push_tool import GIT_PUSH
from durable_harness.core.settings import Settings
from durable_harness.core.turn_config import DOCKER, TurnConfig
from durable_harness.core.types import StepStatus
from durable_harness.harness.tools import load_user_tools
from durable_harness.harness.waits import WAIT_TOOL_NAMES

__all__ = ["AcpAdapter"]


class AcpAdapter(Adapter):
    """The adapter of one ACP agent, all of whose own parts are its ``preset``."""

    default_workspace = DOCKER

    def __init__(self, preset: AcpPreset) -> None:
        self.preset = preset
        self.name = f"acp:{preset.name}"

    def check(self, config: dict[str, Any], settings: Settings) -> None:
        preset, turn = self.preset, TurnConfig.of(config)
        docker = check_where(turn, self.name, docker_only=preset.docker_only)
        load_user_tools(turn.tools, [*WAIT_TOOL_NAMES, GIT_PUSH])
        AcpConfig.parse(turn.agent_config, "in the turn")
        resolve_upstream(preset.wire, turn.base_url)
        if docker:
            from durable_harness.sandbox import open_sandbox

            # Docker answers and the image is built (on first use, here: with progress).
            open_sandbox("docker", toolchain=turn.image).close()
        else:
            check_version(preset, HostCliHost(Path.cwd(), {}), find_agent(preset))

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
            home_prefix=f"durable-harness-acp-{os.path.basename(preset.binary)}-",
        ) as host:
            if isinstance(host, DockerCliHost):
                # An ACP launch never outlives its worker (acp/docker.py): no launch is
                # re-attached, and what is left of an interrupted one is stopped.
                host.durable = False
                launches = launch_steps(run.journal)
                if launches and launches[-1].status is StepStatus.INTENT:
                    stop_job(host, job_id(run.turn.turn_id, len(launches) - 1))
                    # Its terminal/create commands run on too; when one ended it would
                    # reap the new launch, started during its life (docker/scripts.py).
                    host.sandbox.stop_commands()
            return run_launches(run, self.name, host, AcpLauncher(preset, run, host))
