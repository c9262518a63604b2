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

Where the CLI runs is :mod:`.cli.where`; what each launch runs, :mod:`.cli.agent`.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from durable_harness.adapters.base import TurnRun
from durable_harness.adapters.cli.hooks import ReplayPolicy
from durable_harness.adapters.cli.host import (
    CliHost,
    CliRun,
    launch_steps,
    stored_input,
)
from durable_harness.adapters.cli.jobs import job_id
from durable_harness.adapters.cli.mcp import begin_host_tool, invoke_host
from durable_harness.adapters.cli.waits import WaitGate
from durable_harness.core.errors import (
    DurableHarnessError,
    ReplayDivergence,
    TurnFailed,
    TurnSuspended,
)
from durable_harness.core.keys import launch_key, tool_use_id_of
from durable_harness.core.types import StepStatus
from durable_harness.core.world import World
from durable_harness.harness.journal import Journal, OpenStep, Outcome, StepResult, decode_output
from durable_harness.harness.tools import Tool, ToolContext

__all__ = [
    "LaunchPlan",
    "Launcher",
    "close_interrupted",
    "finished_reply",
    "run_launches",
]


@dataclass(frozen=True)
class LaunchPlan:
    """How a launch starts: the input of its ``launch:<n>`` step, stored in the journal
    (``store_input``) and read back to re-attach to the launch or replay it.

    The stored JSON is part of the journal's format: :meth:`stored` spells it as every
    earlier version did, ``{"mode", "message", <record_key>, ["launch"]}``, where
    ``record_key`` names the session record to restore (``transcript``: a blob digest;
    Codex's ``rollout``: an object) and ``launch`` is present only when it was given;
    ``port`` (the Docker bridge's port, drawn at random per launch by
    :meth:`~.cli.host.CliHost.launch_port`) only when there is one: a launch stored
    without it (an older version's) keeps the port its job id derives.
    """

    mode: Literal["new", "resume"]
    message: str
    record: Any = None  # the session record to restore (None: none)
    launch: int | None = None
    record_key: str = "transcript"
    port: int | None = None

    def stored(self) -> dict[str, Any]:
        data: dict[str, Any] = {"mode": self.mode, "message": self.message}
        data[self.record_key] = self.record
        if self.launch is not None:
            data["launch"] = self.launch
        if self.port is not None:
            data["port"] = self.port
        return data

    @classmethod
    def of(cls, data: dict[str, Any]) -> LaunchPlan:
        """The plan a launch step stored (:meth:`stored`'s JSON)."""
        key = "rollout" if "rollout" in data else "transcript"
        mode: Literal["new", "resume"] = "resume" if data.get("mode") == "resume" else "new"
        launch, port = data.get("launch"), data.get("port")
        return cls(
            mode,
            str(data.get("message", "")),
            data.get(key),
            launch,
            key,
            port if isinstance(port, int) else None,
        )


class Launcher(Protocol):
    #: The launch's wait gate: settled before a new launch is planned.
    gate: WaitGate

    def plan(self, number: int) -> LaunchPlan:
        """How launch ``number`` starts."""

    def run(self, plan: LaunchPlan, job: str, cli: CliRun | None = None) -> dict[str, Any]:
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
        plan = LaunchPlan.of(json.loads(stored_input(run.world, done[-1])))
        # Not durable: its own job, and its own port (the stored one is the original's).
        plan = dataclasses.replace(plan, port=host.launch_port())
        job = f"{turn.turn_id}-replay-{secrets.token_hex(4)}"
        result = launcher.run(plan, job)
        host.finish(job)
        return str(result["reply"])
    last = launches[-1] if launches else None
    if last is not None and last.status is StepStatus.INTENT and host.durable:
        job = job_id(turn.turn_id, len(launches) - 1)
        cli = host.attach(job)
        if cli is not None:  # the CLI of an earlier worker runs on (Docker): finish it
            plan = LaunchPlan.of(json.loads(stored_input(run.world, last)))
            result = _run(launcher, host, plan, job, cli)
            meta = {"source": "cli", "reattached": True}
            journal.end(OpenStep(last, time.monotonic()), Outcome(result, meta))
            host.finish(job)
            return _reply(result, launcher, reattached=True)
    number = len(launches)
    launcher.gate.settle()  # a wait still pending raises TurnSuspended: parks again
    # The port is drawn before the plan is journaled: a worker that re-attaches to the
    # launch finds its bridge there, and nothing in the container can know it in advance.
    plan = dataclasses.replace(launcher.plan(number), port=host.launch_port())
    begun = journal.begin_keyed(
        kind="agent",
        name=agent,
        key=launch_key(number),
        input=plan.stored(),
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
    journal: Journal,
    world: World,
    policy: ReplayPolicy,
    host_tools: list[Tool],
    signal_secret: str = "",
) -> None:
    """Before a resume: finish every interrupted ``never`` tool call *possibly ran* (it will
    not run again, and the resume message says so); a ``safe`` one stays open, to run again
    if the CLI calls it. Host tools carry their own label, the CLI's tools the policy's.
    A ``never`` host tool with a check is settled by it first (``begin_host_tool``): done,
    the step is finished with its result (which the resume message quotes); absent under a
    key its downstream honours, it is run again here, under that key."""
    host = {t.name: t for t in host_tools}
    for step in list(journal.recorded.values()):
        if step.kind != "tool" or step.status is not StepStatus.INTENT:
            continue
        tool_input = json.loads(stored_input(world, step))
        host_tool = host.get(step.name)
        label = host_tool.replay if host_tool else policy.label(step.name, tool_input)
        if label != "never":
            continue
        if host_tool is None or host_tool.check is None:
            journal.begin_keyed(
                kind="tool", name=step.name, key=step.key, input=tool_input, replay="never"
            )
            continue
        ctx = ToolContext(journal.turn_id, journal.lease.session_id, step.seq, signal_secret)
        begun = begin_host_tool(
            journal, host_tool, step.name, tool_use_id_of(step.key), tool_input, ctx
        )
        if isinstance(begun, OpenStep):
            value = invoke_host(host_tool, tool_input, ctx)
            journal.end(begun, Outcome(value, {"source": "mcp"}))


def _run(
    launcher: Launcher, host: CliHost, plan: LaunchPlan, job: str, cli: CliRun | None = None
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
