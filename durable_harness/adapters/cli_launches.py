"""The launches of a turn, for the CLI adapters that run on a :class:`~.cli_host.CliHost`
the same way (Pi, OpenCode): where the CLI runs, which launch runs next, and the
session's workspace in a new container.

Where (:func:`open_cli_host`): ``--workspace docker`` is the session's container
(:class:`~.cli_docker.DockerCliHost`); any other folder is the local sandbox, the CLI as
a child of the worker on that folder (:class:`~.cli_host.HostCliHost`). Unlike Claude
Code and Codex, Pi and OpenCode need no developer opt-in for a host folder: their
issue asks for "Docker or local sandbox".

Which launch (:func:`run_launches`), as in :mod:`.claude_code`:

* the last launch's CLI still runs in the container (or ended well) after its worker
  died: follow it again from its first output line and finish that launch;
* otherwise a new launch, planned by the adapter (a resume from the saved session
  record when there is one). Before it is planned, the waits the last launch stopped at
  are settled (:meth:`~.cli_waits.WaitGate.settle`, stop mode: neither CLI has a
  ``defer``): an outcome recorded now is quoted by the resume message; a wait still
  pending parks the turn again, no CLI started. A launch stopped at a pending wait stays
  an intent (its CLI is gone, its session record saved before the wait's intent) and its
  ``TurnSuspended`` parks the turn;
* ``durable-harness replay`` runs the last finished launch again under its own job id,
  the proxy answering only from the journal.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from durable_harness.adapters.base import TurnRun
from durable_harness.adapters.claude_session import LAUNCH_PREFIX
from durable_harness.adapters.claude_setup import job_id, workspace_of
from durable_harness.adapters.cli_host import (
    CliHost,
    CliRun,
    HostCliHost,
    launch_steps,
    stored_input,
)
from durable_harness.adapters.cli_waits import WaitGate
from durable_harness.harness.errors import ConfigError, ReplayDivergence, TurnSuspended
from durable_harness.harness.journal import Journal, OpenStep, Outcome, StepResult
from durable_harness.harness.workspace import SnapshotStore, restore_workspace, save_workspace
from durable_harness.sandbox.base import Sandbox
from durable_harness.worlds.base import StepStatus, TurnStatus, World

__all__ = [
    "Launcher",
    "Workspaces",
    "check_where",
    "open_cli_host",
    "run_launches",
]


def check_where(config: dict[str, Any], agent: str) -> bool:
    """True for the Docker sandbox (Docker answers and the image is built); else the host
    folder is made (ConfigError for the virtual workspace)."""
    spec = str(config.get("workspace", "virtual"))
    if spec == "docker":
        from durable_harness.sandbox import open_sandbox

        open_sandbox("docker").close()
        return True
    if spec == "virtual":
        raise ConfigError(
            f"the {agent} agent runs the real CLI: give --workspace docker (the session's "
            "container) or --workspace DIR (a host folder); the virtual workspace cannot "
            "host it"
        )
    workspace_of(config, agent)
    return False


def open_cli_host(
    config: dict[str, Any], session_id: str, agent: str, binaries: Callable[[], dict[str, str]]
) -> CliHost:
    """The session's container, or the host folder (``binaries`` finds the host CLIs)."""
    if str(config.get("workspace", "virtual")) == "docker":
        from durable_harness.adapters.cli_docker import DockerCliHost

        return DockerCliHost(session_id)
    return HostCliHost(
        workspace_of(config, agent), binaries(), home_prefix=f"durable-harness-{agent}-"
    )


class Launcher(Protocol):
    #: The launch's wait gate (stop mode): settled before a new launch is planned.
    gate: WaitGate

    def plan(self, number: int) -> dict[str, Any]:
        """How launch ``number`` starts."""

    def run(self, plan: dict[str, Any], job: str, cli: CliRun | None = None) -> dict[str, Any]:
        """Run launch ``job`` (or follow ``cli``, started by an earlier worker) to its end."""


def run_launches(run: TurnRun, agent: str, host: CliHost, launcher: Launcher) -> str:
    """The turn's reply, from the launch that runs next (see the module docstring)."""
    journal, turn = run.journal, run.turn
    launches = launch_steps(journal)
    if journal.replay_only:
        done = [s for s in launches if s.status is StepStatus.DONE]
        if not done:
            raise ReplayDivergence(f"turn {turn.turn_id} has no finished launch of the CLI")
        plan = json.loads(stored_input(run.world, done[-1]))
        job = f"{turn.turn_id}-replay-{secrets.token_hex(4)}"  # not durable: its own job
        return str(launcher.run(plan, job)["reply"])
    last = launches[-1] if launches else None
    if last is not None and last.status is StepStatus.INTENT and host.durable:
        job = job_id(turn.turn_id, len(launches) - 1)
        cli = host.attach(job)
        if cli is not None:  # the CLI of an earlier worker runs on (Docker): finish it
            plan = json.loads(stored_input(run.world, last))
            result = _run(launcher, host, plan, job, cli)
            meta = {"source": "cli", "reattached": True}
            journal.end(OpenStep(last, time.monotonic()), Outcome(result, meta))
            return str(result["reply"])
    number = len(launches)
    launcher.gate.settle()  # a wait still pending raises TurnSuspended: parks again
    plan = launcher.plan(number)
    begun = journal.begin_keyed(
        kind="agent",
        name=agent,
        key=f"{LAUNCH_PREFIX}{number}",
        input=plan,
        replay="safe",
        store_input=True,
    )
    if isinstance(begun, StepResult):  # cannot happen: the key is new
        return str(begun.value["reply"])
    result = _run(launcher, host, plan, job_id(turn.turn_id, number))
    journal.end(begun, Outcome(result, {"source": "cli"}))
    return str(result["reply"])


def _run(
    launcher: Launcher, host: CliHost, plan: dict[str, Any], job: str, cli: CliRun | None = None
) -> dict[str, Any]:
    try:
        return launcher.run(plan, job, cli)
    except TurnSuspended:
        # Stopped at a pending wait (its CLI is gone): the launch stays an intent, its
        # HOME goes; the next delivery settles the wait and resumes the saved session.
        host.finish(job)
        raise


class Workspaces:
    """The container's workspace in the World: restored into a new container before a
    launch, saved after every tool outcome (a lost container comes back as the tool
    left it)."""

    def __init__(self, run: TurnRun, lock: threading.Lock) -> None:
        self.world: World = run.world
        self.journal: Journal = run.journal
        self.turn = run.turn
        self.snapshots = SnapshotStore(self.world)
        self._lock = lock  # the adapter's save lock: one save at a time

    def restore(self, sandbox: Sandbox) -> None:
        digest = self.journal.latest_meta("workspace") or self._session_workspace()
        restore_workspace(sandbox, self.snapshots, digest)

    def saver(self, sandbox: Sandbox) -> Callable[[], dict[str, Any]]:
        def outcome_meta() -> dict[str, Any]:
            with self._lock:
                digest = save_workspace(sandbox, self.snapshots)
            return {} if digest is None else {"workspace": digest}

        return outcome_meta

    def _session_workspace(self) -> str | None:
        """The newest workspace snapshot of the session's earlier, finished turns."""
        digest: str | None = None
        for turn in self.world.list_turns(self.turn.session_id):
            if turn.index < self.turn.index and turn.status is TurnStatus.DONE:
                for step in self.world.load_steps(turn.turn_id):
                    if step.status is StepStatus.DONE and "workspace" in step.meta:
                        digest = str(step.meta["workspace"])
        return digest
