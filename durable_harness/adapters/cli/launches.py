"""The launches of a turn, for every CLI adapter (Claude Code, Codex, Pi, OpenCode):
which launch runs next, where the CLI runs (Pi, OpenCode), and the session's workspace in
a new container.

Which launch (:func:`run_launches`; a launch is one run of the CLI, a journal step keyed
``launch:<n>`` whose input is the adapter's plan and whose outcome holds the reply):

* the last launch finished and was journaled, but its worker died before the turn was
  marked done: its reply, no CLI started;
* the last launch is an intent and its CLI still runs in the container (or ended) after
  its worker died: follow it again from its first output line and finish that launch;
* otherwise a new launch, planned by the adapter (a resume from the saved session record
  when there is one). Before it is planned, the waits the last launch stopped at are
  settled (:meth:`~.cli.waits.WaitGate.settle`): an outcome recorded now is quoted by the
  resume message; a wait still pending parks the turn again, no CLI started. A launch
  stopped at a pending wait (stop mode: Codex, Pi, OpenCode) stays an intent (its CLI is
  gone, its session record saved before the wait's intent) and its ``TurnSuspended``
  parks the turn. A launch that ended *deferred* at a wait (defer mode: Claude Code) is
  journaled with ``deferred`` set, and the wait parks the turn the same way;
* ``durable-harness replay`` runs the last finished launch again under its own job id,
  the proxy answering only from the journal.

A launch's job (its HOME, in the container its output files) is removed only once the
launch is journaled: a worker that dies in between leaves it to the next worker, which
re-attaches and reads the session record again.

Where (:func:`open_cli_host`, Pi and OpenCode): ``--workspace docker`` is the session's
container (:class:`~.cli.docker_host.DockerCliHost`); any other folder is the local sandbox,
the CLI as a child of the worker on that folder (:class:`~.cli.host.HostCliHost`).
Unlike Claude Code and Codex, Pi and OpenCode need no developer opt-in for a host
folder: their issue asks for "Docker or local sandbox".
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from durable_harness.adapters.base import TurnRun
from durable_harness.adapters.cli.hooks import ReplayPolicy
from durable_harness.adapters.cli.host import (
    CliHost,
    CliRun,
    HostCliHost,
    launch_steps,
    stored_input,
)
from durable_harness.adapters.cli.jobs import job_id, workspace_of
from durable_harness.adapters.cli.waits import WaitGate
from durable_harness.core.errors import (
    ConfigError,
    DurableHarnessError,
    ReplayDivergence,
    TurnFailed,
    TurnSuspended,
)
from durable_harness.core.keys import launch_key
from durable_harness.core.sandbox import Sandbox
from durable_harness.core.types import StepStatus, TurnStatus
from durable_harness.core.world import World
from durable_harness.harness.journal import Journal, OpenStep, Outcome, StepResult, decode_output
from durable_harness.harness.tools import Tool
from durable_harness.harness.workspace import SnapshotStore, restore_workspace, save_workspace

__all__ = [
    "Launcher",
    "Workspaces",
    "check_where",
    "close_interrupted",
    "finished_reply",
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
        from durable_harness.adapters.cli.docker_host import DockerCliHost

        return DockerCliHost(session_id)
    return HostCliHost(
        workspace_of(config, agent), binaries(), home_prefix=f"durable-harness-{agent}-"
    )


class Launcher(Protocol):
    #: The launch's wait gate: settled before a new launch is planned.
    gate: WaitGate

    def plan(self, number: int) -> dict[str, Any]:
        """How launch ``number`` starts."""

    def run(self, plan: dict[str, Any], job: str, cli: CliRun | None = None) -> dict[str, Any]:
        """Run launch ``job`` (or follow ``cli``, started by an earlier worker) to its end;
        its outcome: ``reply``, and ``deferred`` when the CLI stopped at a deferred wait."""


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
        result = launcher.run(plan, job)
        host.finish(job)
        return str(result["reply"])
    last = launches[-1] if launches else None
    if last is not None and last.status is StepStatus.INTENT and host.durable:
        job = job_id(turn.turn_id, len(launches) - 1)
        cli = host.attach(job)
        if cli is not None:  # the CLI of an earlier worker runs on (Docker): finish it
            plan = json.loads(stored_input(run.world, last))
            result = _run(launcher, host, plan, job, cli)
            meta = {"source": "cli", "reattached": True}
            journal.end(OpenStep(last, time.monotonic()), Outcome(result, meta))
            host.finish(job)
            return _reply(result, launcher, reattached=True)
    number = len(launches)
    launcher.gate.settle()  # a wait still pending raises TurnSuspended: parks again
    plan = launcher.plan(number)
    begun = journal.begin_keyed(
        kind="agent",
        name=agent,
        key=launch_key(number),
        input=plan,
        replay="safe",
        store_input=True,
    )
    if isinstance(begun, StepResult):  # cannot happen: the key is new
        return str(begun.value["reply"])
    job = job_id(turn.turn_id, number)
    result = _run(launcher, host, plan, job)
    journal.end(begun, Outcome(result, {"source": "cli"}))
    host.finish(job)
    return _reply(result, launcher, reattached=False)


def finished_reply(run: TurnRun) -> str | None:
    """The reply of the turn's last launch when it finished (not deferred at a wait) and
    was journaled, the turn not yet marked done (its worker died in between): a new
    delivery answers with it and starts nothing. ``None`` otherwise, and in a replay."""
    launches = launch_steps(run.journal)
    if run.journal.replay_only or not launches or launches[-1].status is not StepStatus.DONE:
        return None
    outcome = decode_output(run.world, launches[-1])
    return None if outcome.get("deferred") else str(outcome["reply"])


def close_interrupted(
    journal: Journal, world: World, policy: ReplayPolicy, host_tools: list[Tool]
) -> None:
    """Before a resume: finish every interrupted ``never`` tool call *possibly ran* (it will
    not run again, and the resume message says so); a ``safe`` one stays open, to run again
    if the CLI calls it. Host tools carry their own label, the CLI's tools the policy's."""
    host = {t.name: t for t in host_tools}
    for step in list(journal.recorded.values()):
        if step.kind != "tool" or step.status is not StepStatus.INTENT:
            continue
        tool_input = json.loads(stored_input(world, step))
        host_tool = host.get(step.name)
        label = host_tool.replay if host_tool else policy.label(step.name, tool_input)
        if label == "never":
            journal.begin_keyed(
                kind="tool", name=step.name, key=step.key, input=tool_input, replay="never"
            )


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


def _reply(result: dict[str, Any], launcher: Launcher, *, reattached: bool) -> str:
    """The launch's reply; or, when the CLI ended deferred at a wait (defer mode), park
    the turn: the next delivery settles the wait and resumes the CLI."""
    if not result.get("deferred"):
        return str(result["reply"])
    if launcher.gate.suspended is not None:
        raise launcher.gate.suspended
    if reattached:
        # The dead worker's hook deferred the call: the next delivery settles the wait
        # (or parks again) and resumes the CLI.
        raise DurableHarnessError("the CLI stopped at a wait; the turn resumes to ask again")
    raise TurnFailed("the CLI deferred a tool call that durable-harness did not defer")


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
