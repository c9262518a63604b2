"""Starting and resuming turns: what ``run`` and ``resume`` do, apart from printing."""

from __future__ import annotations

import secrets
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from durable_harness.adapters import get_adapter
from durable_harness.adapters.base import TurnRun
from durable_harness.core.errors import ConfigError
from durable_harness.core.fork import Fork, save_fork
from durable_harness.core.seed import save_seed
from durable_harness.core.settings import Settings
from durable_harness.core.turn_config import DOCKER, VIRTUAL, TurnConfig
from durable_harness.core.types import FINISHED, UNFINISHED, Lease, Turn, TurnStatus
from durable_harness.core.world import World
from durable_harness.harness.ci_watch import check_repo
from durable_harness.harness.events import turn_created
from durable_harness.harness.journal import SETTLED, SETTLED_DONE, Journal, StepEvent
from durable_harness.runtime.admission import admit
from durable_harness.runtime.seed import PreparedSeed, record_seed
from durable_harness.runtime.telemetry import new_trace_id
from durable_harness.runtime.worker import Worker


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def turn_config(
    *,
    agent: str,
    workspace: str | None,
    tools: list[str],
    model: str | None,
    base_url: str | None,
    settings: Settings,
    push_remote: str | None = None,
    ci_repo: str | None = None,
) -> dict[str, Any]:
    """What a worker anywhere needs to run the turn (never a secret): a
    :class:`~.core.turn_config.TurnConfig`, as the JSON object stored with the turn.
    No ``workspace``: the agent's default (the virtual one for the built-in agent, the
    session's Docker container for a CLI agent)."""
    if workspace is None:
        workspace = get_adapter(agent).default_workspace
    if workspace not in (VIRTUAL, DOCKER):
        workspace = str(Path(workspace).resolve())
    optional: dict[str, Any] = {"base_url": base_url} if base_url else {}
    if push_remote is not None:
        from durable_harness.repo.push import reachable_remote

        # Checked before anything is recorded: a remote that cannot be read is bad input.
        optional["push_remote"] = reachable_remote(push_remote)
    if ci_repo is not None:
        if push_remote is None:
            raise ConfigError(
                "--ci-repo routes the CI results of git_push's pushes: give --push-remote too"
            )
        optional["ci_repo"] = check_repo(ci_repo).group(0)
    return TurnConfig(
        agent=agent,
        workspace=workspace,
        tools=[absolute_tools_spec(s) for s in tools],
        model=model or settings.model,
        max_tokens=settings.max_tokens,
        max_model_calls=settings.max_model_calls,
        max_files=settings.max_files,
        max_bytes=settings.max_bytes,
        # Authenticates webhook signals for this turn (`durable-harness signal-server`).
        signal_secret=secrets.token_urlsafe(24),
        **optional,
    ).stored()


def start_turn(
    world: World,
    settings: Settings,
    prompt: str,
    config: dict[str, Any],
    session_id: str | None = None,
    *,
    queue_behind: bool = False,
    seed: PreparedSeed | None = None,
    fork: Fork | None = None,
    turn_id: str | None = None,
    new_session_id: str | None = None,
    session_meta: dict[str, Any] | None = None,
) -> Turn:
    """Check the configuration (against this process's own policy too, so a turn its
    workers would refuse fails here), then create (or extend) the session and enqueue a
    turn.

    ``seed`` (from :func:`~.seed.prepare_seed`) starts a new session from a repository:
    it is stored before the turn is queued, so any worker starts from it. An existing
    ``session_id`` with a ``seed`` is refused: that session has its workspace already.

    Turns of a session run in order. With ``queue_behind`` a turn may be added while an
    earlier one is unfinished (workers park it until that one ends); without, that is an
    error, since the caller means to drive the new turn now.

    ``fork`` (from :func:`~.fork.fork_turn`) starts a new session from a cut of another
    one's turn, as ``seed`` does from a repository; its turn may have an empty prompt (it
    continues from the cut without a new message).

    ``turn_id``: the new turn's id, when the caller recorded something under it first
    (``serve`` records its owner before the turn exists); else a fresh one. The same for
    ``new_session_id``, a new session's, which also gets ``session_meta``."""
    if not prompt.strip() and (fork is None or prompt):
        raise ConfigError("the prompt is empty: say what the agent should do")
    typed = TurnConfig.of(config)
    if typed.image is not None and not typed.docker:
        raise ConfigError(
            f"--image {typed.image} is the Docker workspace's toolchain: add --workspace docker "
            f"(not {typed.workspace!r})"
        )
    if typed.setup is not None and not typed.docker:
        raise ConfigError(
            "--setup runs in the session's container, before the agent: add --workspace "
            f"docker (not {typed.workspace!r})"
        )
    if typed.setup is not None and not typed.setup.strip():
        raise ConfigError("--setup is empty: give the command that installs the toolchain")
    get_adapter(str(config["agent"])).check(admit(config, settings).config, settings)
    if session_id is not None and fork is not None:
        raise ConfigError(f"a fork starts a new session: it cannot be added to {session_id}")
    if session_id is not None and seed is not None:
        raise ConfigError(
            f"--repo seeds a new session, and session {session_id} has its workspace already: "
            "drop --session to start a new one from the repository, or drop --repo"
        )
    if session_id is not None:
        world.get_session(session_id)
        unfinished = [t for t in world.list_turns(session_id) if t.status in UNFINISHED]
        if unfinished and not queue_behind:
            raise ConfigError(
                f"turn {unfinished[0].turn_id} of session {session_id} has not finished: "
                f"wait for it, run `durable-harness resume {unfinished[0].turn_id}`, or "
                "queue this one behind it with --detach"
            )
    else:
        session_id = new_session_id or new_id("ses")
        meta: dict[str, Any] = {**(session_meta or {}), "agent": config["agent"]}
        if fork is not None:
            meta["forked_from"] = {"turn": fork.turn_id, "at": fork.at}
        world.create_session(session_id, meta)
        if seed is not None:
            record_seed(world, session_id, seed)
        if fork is not None:
            save_fork(world, world, session_id, fork)
            if fork.seed is not None:
                save_seed(world, world, session_id, fork.seed)
    # The trace every delivery's spans join, even when the exporter is off now: a worker
    # that exports later still gives the turn one trace.
    config = {"trace_id": new_trace_id(), **config}
    turn = world.create_turn(session_id, turn_id or new_id("turn"), prompt, config)
    turn_created(world, turn)
    return turn


def claim_for_resume(
    world: World,
    settings: Settings,
    turn_id: str,
    owner: str,
    *,
    force: bool,
    say: Callable[[str], None],
) -> Lease | None:
    """Take the turn: at once if it is free, after its holder's lease runs out, or at once
    with ``force`` (which fences the holder out). ``None`` if it already ended."""
    announced = False
    while True:
        lease = world.claim_turn(turn_id, owner, settings.lease_seconds, force=force)
        if lease is not None:
            return lease
        turn = world.get_turn(turn_id)
        if turn.status in FINISHED:
            return None
        if not announced:
            if turn.status is TurnStatus.WAITING:
                say(
                    f"turn {turn_id} is parked, waiting for {turn.waiting_for}; waiting with "
                    "it (--force wakes it now to check again)"
                )
            else:
                left = max((turn.lease_expires_at or time.time()) - time.time(), 0.0)
                say(
                    f"turn {turn_id} is held by {turn.lease_owner} for {left:.1f}s more; "
                    "waiting for its lease to run out (--force takes it now)"
                )
            announced = True
        time.sleep(min(settings.poll_seconds, 0.2))


def progress_printer(stream: Any = None) -> Callable[[StepEvent], None]:
    out = stream or sys.stderr

    def show(event: StepEvent) -> None:
        if event.phase == "start":
            return
        extra = ""
        if event.kind == "model" and "input_tokens" in event.meta:
            extra = f"  {event.meta['input_tokens']}/{event.meta['output_tokens']} tokens"
        took = f"  {event.duration:.2f}s" if event.phase == "done" else ""
        label = {"done": "ran", "replayed": "replayed", "possibly_ran": "possibly ran"}[event.phase]
        if event.phase == "done" and event.meta.get(SETTLED) == SETTLED_DONE:
            label, took = "settled by its check", ""
        out.write(f"  step {event.seq:>3}  {event.kind:<5} {event.name:<20} {label}{took}{extra}\n")
        out.flush()

    return show


def make_worker(world: World, settings: Settings, *, quiet: bool = False) -> Worker:
    def event(msg: str) -> None:
        if not quiet:
            sys.stderr.write(f"durable-harness: {msg}\n")
            sys.stderr.flush()

    return Worker(world, settings, on_step=None if quiet else progress_printer(), on_event=event)


def absolute_tools_spec(spec: str) -> str:
    """``path.py:NAME`` with the path made absolute, so a worker anywhere can load it."""
    path, sep, attr = spec.rpartition(":")
    if not sep or not path:
        return spec  # load_tools reports the malformed spec
    return f"{Path(path).resolve()}:{attr}"


def replay_turn(world: World, settings: Settings, turn_id: str) -> tuple[str, int]:
    """Run a finished turn again from its journal alone: no model call, no tool run, no
    write. Returns the reply and the number of steps read back."""
    turn = world.get_turn(turn_id)
    if turn.status is not TurnStatus.DONE:
        raise ConfigError(
            f"turn {turn_id} is {turn.status.value}: only a finished turn can be replayed "
            f"(`durable-harness resume {turn_id}` finishes it)"
        )
    lease = Lease(turn_id, turn.session_id, "replay", turn.epoch, turn.attempts, float("inf"))
    # Nothing is called, but the adapter imports the turn's tools: the same admission.
    turn = replace(turn, config=admit(turn.config, settings).config)
    journal = Journal(world, lease, replay_only=True)
    reply = get_adapter(str(turn.config["agent"])).run_turn(TurnRun(world, turn, journal, settings))
    return reply, journal.replayed
