"""``durable-harness fork TURN --at SEQ [PROMPT]``: a new session that continues a turn
from before one of its steps.

What the fork keeps is read from the origin's journal once, when the fork is made, and
stored in the new session (``core/fork.py``): the conversation up to step ``SEQ`` (the
session's earlier turns, the turn's prompt, its model replies and tool results before
``SEQ``: never asked of the model again) and the workspace snapshot of the last finished
step before ``SEQ`` (else what the turn started from). The new session's first turn
starts from there with ``PROMPT`` (or, without one, goes on where the cut left it); its
steps are journaled in the new session only. The origin is only read: its turns, steps
and records stay as they were.

A tool use of the last kept reply whose step is at or after ``SEQ`` is answered *not run*
(it is after the cut, and the workspace is as it was before it). Each agent says what it
keeps (``Adapter.fork_cut``): the built-in agent its conversation; Claude Code its
transcript cut at the reply of step ``SEQ`` (``claude_code/fork.py``); the other CLI
agents, whose own session records are not cut yet, refuse.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from durable_harness.adapters import get_adapter
from durable_harness.core.errors import ConfigError
from durable_harness.core.fork import Fork
from durable_harness.core.seed import load_seed
from durable_harness.core.settings import Settings
from durable_harness.core.turn_config import DOCKER, VIRTUAL, TurnConfig
from durable_harness.core.types import FINISHED, Step, StepStatus, Turn, TurnStatus
from durable_harness.core.world import World
from durable_harness.harness.workspace import session_snapshot
from durable_harness.runtime.turns import new_id, start_turn

__all__ = ["fork_turn", "prepare_fork"]

#: The origin config's fields a fork never copies: each turn gets its own (the trace id
#: from start_turn, a new signal secret here).
_OWN_FIELDS = ("trace_id", "signal_secret")


def prepare_fork(
    world: World,
    turn_id: str,
    at: int,
    prompt: str,
    session_id: str,
    *,
    workspace: str | None = None,
) -> tuple[Fork, dict[str, Any]]:
    """The fork of ``turn_id`` before step ``at`` into the new session ``session_id``
    (not created here) and the config of its first turn; ConfigError (nothing recorded
    but blobs) when it cannot be made: see the module docstring."""
    origin = world.get_turn(turn_id)
    config = TurnConfig.of(origin.config)
    steps = sorted(world.load_steps(turn_id), key=lambda s: s.seq)
    if not steps:
        raise ConfigError(f"turn {turn_id} has no step yet: there is nothing to fork")
    seqs = [s.seq for s in steps]
    # One past the last step of a finished turn: the fork keeps all of it (a new branch
    # of the conversation, asked the new prompt).
    end = [seqs[-1] + 1] if origin.status is TurnStatus.DONE else []
    if at not in seqs + end:
        after = f" (or {end[0]}: after its reply)" if end else ""
        raise ConfigError(
            f"turn {turn_id} has steps {seqs[0]}..{seqs[-1]}{after}: --at names the step "
            f"the fork is cut before (`durable-harness show {turn_id}` lists them), not {at}"
        )
    kept = [s for s in steps if s.seq < at]
    open_steps = [s.seq for s in kept if s.status is StepStatus.INTENT]
    if open_steps:
        finish = (
            ""
            if origin.status in FINISHED
            else f", or finish the turn first (`durable-harness resume {turn_id}`)"
        )
        raise ConfigError(
            f"step {open_steps[0]} of turn {turn_id} has not finished: fork at "
            f"{open_steps[0]} or before{finish}"
        )
    cut = get_adapter(config.agent).fork_cut(world, origin, kept, session_id)
    history = cut.history
    if not prompt and cut.record is not None:
        raise ConfigError(
            f"a fork of a {config.agent} turn needs a new prompt: its CLI resumes the cut "
            "session with one"
        )
    if not prompt and history and history[-1].get("role") == "assistant":
        raise ConfigError(
            f"the cut before step {at} ends with the agent's reply: give a new prompt"
        )
    done_tools = [s for s in kept if s.kind == "tool" and s.status is StepStatus.DONE]
    if (
        config.workspace not in (VIRTUAL, DOCKER)
        and done_tools
        and not any("workspace" in s.meta for s in done_tools)
    ):
        raise ConfigError(
            f"turn {turn_id} ran in the host folder {config.workspace}, whose state at step "
            f"{at} its journal does not hold (a CLI agent's host folder is not snapshotted): "
            "only a turn in the virtual workspace, in Docker, or the built-in agent's on a "
            "host folder can be forked there"
        )
    digest = _workspace_at(world, origin, kept)
    seed = load_seed(world, world, origin.session_id)
    if seed is not None and digest is not None:
        seed = seed.model_copy(update={"snapshot": digest})
    stored = {k: v for k, v in origin.config.items() if k not in _OWN_FIELDS}
    stored["signal_secret"] = secrets.token_urlsafe(24)  # its own, as every turn's
    stored["workspace"] = _fork_workspace(config.workspace, workspace)
    if stored["workspace"] != DOCKER:
        # A toolchain image and its setup belong to a container: moved out of Docker,
        # the fork runs without them (as `run` refuses them off Docker).
        stored.pop("image", None)
        stored.pop("setup", None)
    fork = Fork(
        session_id=origin.session_id,
        turn_id=turn_id,
        at=at,
        history=history,
        record=cut.record,
        workspace=digest,
        seed=seed,
    )
    return fork, stored


def fork_turn(
    world: World,
    settings: Settings,
    turn_id: str,
    at: int,
    prompt: str = "",
    *,
    workspace: str | None = None,
    new_turn_id: str | None = None,
) -> Turn:
    """Make the fork (:func:`prepare_fork`) and queue its first turn in a new session;
    the turn's config is the origin's, admitted under this process's policy as a turn
    read from the World is (a fork is never granted what the origin was)."""
    session_id = new_id("ses")
    fork, config = prepare_fork(world, turn_id, at, prompt, session_id, workspace=workspace)
    return start_turn(
        world,
        settings,
        prompt,
        config,
        fork=fork,
        turn_id=new_turn_id,
        new_session_id=session_id,
    )


def _workspace_at(world: World, origin: Turn, kept: list[Step]) -> str | None:
    """The snapshot the origin's workspace was in before the fork point: its last
    finished step's before it, else what the turn started from."""
    digest: str | None = None
    for step in kept:
        if step.status is StepStatus.DONE and "workspace" in step.meta:
            digest = str(step.meta["workspace"])
    if digest is None:
        digest = session_snapshot(world, origin.session_id, origin.index)
    return digest


def _fork_workspace(origin: str, given: str | None) -> str:
    """Where the fork runs: the virtual workspace or a container of its own as the origin
    did (or as ``given``); a host folder only if it is a new, empty one (never the
    origin's, whose files are the origin's work)."""
    spec = given or origin
    if spec in (VIRTUAL, DOCKER):
        return spec
    folder = Path(spec).resolve()
    if given is None or folder == Path(origin).resolve():
        raise ConfigError(
            f"the turn ran in the host folder {origin}: a fork works in its own, give "
            "--workspace with a new, empty folder (or virtual, or docker)"
        )
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError(
            f"--workspace {folder} is not empty: a fork starts from the snapshot at its "
            "fork point, in an empty folder"
        )
    return str(folder)
