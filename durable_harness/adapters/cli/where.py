"""Where a CLI agent's turn runs, for all four CLI agents: the one host opener
(:func:`open_cli_host`), the one check of the turn's ``workspace`` (:func:`check_where`)
and the one workspace helper (:class:`Workspaces`).

``--workspace docker`` is the session's container (:class:`~.cli.docker_host.DockerCliHost`);
any other folder is a host folder, the CLI a child of the worker there
(:class:`~.cli.host.HostCliHost`). A *docker-only* agent (Claude Code, Codex) gets a host
folder only with the developer opt-in :data:`~.cli.host.UNSAFE_HOST_ENV` (and then runs with
the developer's uid); Pi and OpenCode need none, and run there as the unprivileged agent user
(:mod:`durable_harness.sandbox.agent_user`; same-uid only with the operator's unsafe
``DURABLE_HARNESS_UNSAFE_SAME_USER=1``). No CLI runs in the virtual workspace.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from durable_harness.adapters.base import TurnRun
from durable_harness.adapters.cli.host import CliHost, HostCliHost, require_unsafe_host
from durable_harness.adapters.cli.jobs import workspace_of
from durable_harness.core.errors import ConfigError, SandboxError
from durable_harness.core.sandbox import Sandbox
from durable_harness.core.turn_config import DOCKER, VIRTUAL, TurnConfig
from durable_harness.core.world import World
from durable_harness.harness.journal import Journal
from durable_harness.harness.workspace import (
    SnapshotStore,
    restore_workspace,
    save_workspace,
    session_snapshot,
    snapshot_failed,
)
from durable_harness.sandbox.agent_user import agent_user

__all__ = ["Workspaces", "check_where", "open_cli_host"]

Config = Mapping[str, Any] | TurnConfig


def check_where(config: Config, agent: str, *, docker_only: bool) -> bool:
    """True for the Docker sandbox (the caller checks that Docker answers); else the host
    folder is checked and made. ConfigError for the virtual workspace, and for any host
    folder of a ``docker_only`` agent without the developer opt-in, and for a host folder
    whose agent cannot run as the agent user (see :mod:`durable_harness.sandbox.agent_user`)."""
    spec = TurnConfig.of(config).workspace
    if spec == DOCKER:
        return True
    if docker_only:
        require_unsafe_host(agent, spec)
    elif spec == VIRTUAL:
        raise ConfigError(
            f"the {agent} agent runs the real CLI: give --workspace docker (the session's "
            "container) or --workspace DIR (a host folder); the virtual workspace cannot "
            "host it"
        )
    else:
        agent_user()  # ConfigError now, not at the launch, if it cannot run as one
    workspace_of(config, agent)
    return False


def open_cli_host(
    config: Config,
    session_id: str,
    agent: str,
    binaries: Callable[[], dict[str, str]],
    *,
    docker_only: bool,
    home_prefix: str,
) -> CliHost:
    """The session's container, or the host folder (``binaries`` finds the host CLIs;
    ``home_prefix`` names the launches' HOME folders, by which tests find their
    processes)."""
    if check_where(config, agent, docker_only=docker_only):
        from durable_harness.adapters.cli.docker_host import DockerCliHost

        return DockerCliHost(session_id, toolchain=TurnConfig.of(config).image)
    # A docker-only agent on a host folder is the developer's opt-in to their own uid;
    # Pi and OpenCode run there as the agent user (sandbox/agent_user.py).
    user = None if docker_only else agent_user()
    return HostCliHost(workspace_of(config, agent), binaries(), home_prefix=home_prefix, user=user)


class Workspaces:
    """The container's workspace in the World: restored into a new container before a
    launch, saved after every tool outcome (a lost container comes back as the tool
    left it)."""

    def __init__(self, run: TurnRun, lock: threading.Lock) -> None:
        self.world: World = run.world
        self.journal: Journal = run.journal
        self.turn = run.turn
        self.config = TurnConfig.of(run.config)
        self.settings = run.settings
        self.snapshots = SnapshotStore(self.world)
        self._lock = lock  # the adapter's save lock: one save at a time

    def restore(self, sandbox: Sandbox) -> None:
        digest = self.journal.latest_meta("workspace") or session_snapshot(
            self.world, self.turn.session_id, self.turn.index
        )
        restore_workspace(sandbox, self.snapshots, None if digest is None else str(digest))
        if self.config.setup is not None:  # once per container (imports the Docker SDK)
            from durable_harness.adapters.cli.setup import ensure_setup

            ensure_setup(sandbox, self.config, self.settings)

    def saver(self, sandbox: Sandbox) -> Callable[[], dict[str, Any]]:
        def outcome_meta() -> dict[str, Any]:
            # The workspace as this tool left it: a new container is restored from it.
            try:
                with self._lock:
                    digest = save_workspace(sandbox, self.snapshots)
            except SandboxError as exc:  # too big or too deep: the outcome stands without
                print(f"durable-harness: {snapshot_failed(exc)}", file=sys.stderr, flush=True)
                return {"snapshot_error": str(exc)}
            return {} if digest is None else {"workspace": digest}

        return outcome_meta
