"""The commands that drive turns: ``run``, ``worker``, ``resume``, ``replay``, ``fork``."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from durable_harness.cli.common import (
    TRAILING,
    Commands,
    policy_flags,
    report,
    settings_of,
    world_flags,
)
from durable_harness.worlds import open_configured

if TYPE_CHECKING:
    from durable_harness.cli.common import Subparsers
    from durable_harness.core.settings import Settings
    from durable_harness.core.types import Turn
    from durable_harness.core.world import World
    from durable_harness.runtime.worker import Worker


def register(sub: Subparsers) -> Commands:
    run = sub.add_parser("run", help="start a turn and drive it here (or --detach)")
    run.add_argument("prompt", metavar="PROMPT")
    run.add_argument(
        "--agent",
        default="builtin",
        help="builtin (default), claude-code, codex, opencode, pi (docs/<agent>.md), or an ACP "
        "agent: acp:opencode, acp:claude-code, acp:codex, or acp:NAME of the operator's "
        "DURABLE_HARNESS_ACP_AGENTS file (docs/acp.md; a turn names one, never a command)",
    )
    run.add_argument(
        "--workspace",
        help="'virtual' (in-memory: the built-in agent's default), 'docker' (a container "
        "per session, docs/docker.md: every CLI agent's default) or a host folder",
    )
    run.add_argument(
        "--tools",
        action="append",
        default=[],
        metavar="FILE.py:NAME|SET",
        help="host tools: NAME is a list of tools in FILE.py, or SET a tool set registered "
        "with DURABLE_HARNESS_TOOL_SETS (repeatable); a file given here may run in this "
        "process, a worker elsewhere runs it only if its operator registered it",
    )
    run.add_argument(
        "--image",
        metavar="IMAGE|PATH",
        help="the repository's toolchain image (Docker workspace; e.g. python:3.12, on the "
        "Docker host already), or a Dockerfile (or a folder holding one) built now: the "
        "container runs it with node, the agent CLIs and user 1000 added, built on first "
        "use (docs/docker.md); a worker elsewhere runs it only if it is in its "
        "DURABLE_HARNESS_ALLOWED_IMAGES. Without it, the repository's devcontainer.json "
        "(its image, or its Dockerfile built now) is used",
    )
    run.add_argument(
        "--no-devcontainer",
        action="store_true",
        help="ignore the repository's devcontainer.json: the default agent image, no setup from it",
    )
    run.add_argument(
        "--setup",
        metavar="CMD",
        help="a command run in the session's container before the agent (e.g. "
        "'pip install -e .[dev]'), each time the container is new, with only the package "
        "registries of DURABLE_HARNESS_SETUP_REGISTRIES reachable (through the harness's "
        "egress proxy); the agent then runs with no network (docs/coding-task.md)",
    )
    run.add_argument("--session", help="add the turn to this session (it sees the earlier turns)")
    repo_flags(run)
    run.add_argument(
        "--agent-config",
        metavar="FILE.toml",
        help="the agent's options (CLI agents: replay labels, see docs/claude-code.md)",
    )
    run.add_argument("--model", help="model name (env DURABLE_HARNESS_MODEL)")
    run.add_argument(
        "--base-url",
        help="model endpoint; default: env ANTHROPIC_BASE_URL for the agents on the Anthropic "
        "Messages API (builtin, claude-code, opencode, pi, acp:opencode, acp:claude-code), "
        "env OPENAI_BASE_URL for codex and acp:codex (OpenAI's API; its key "
        "OPENAI_API_KEY); a worker elsewhere runs the turn only if "
        "it is its own or in its DURABLE_HARNESS_ALLOWED_BASE_URLS",
    )
    run.add_argument(
        "--push-remote",
        metavar="URL|PATH",
        help="offer the agent the git_push tool, which pushes its commits there from this "
        "host with your git credentials (never copied into the sandbox); the URL must not "
        "hold them (use a credential helper or url.<base>.insteadOf); a worker elsewhere "
        "pushes only to its DURABLE_HARNESS_ALLOWED_PUSH_REMOTES",
    )
    run.add_argument(
        "--ci-repo",
        metavar="github:OWNER/NAME|gitlab:GROUP/PROJECT",
        help="the repository whose CI reports by webhook (docs/webhooks.md): each commit "
        "git_push pushes is watched, and its CI result is the next wait_for_signal('ci')",
    )
    run.add_argument("--max-files", type=int, help="virtual workspace file cap (default 500)")
    run.add_argument("--max-bytes", type=int, help="virtual workspace byte cap (default 10 MiB)")
    run.add_argument(
        "--max-model-calls",
        type=int,
        help="model calls per turn, any agent (default 50): past it the turn fails",
    )
    budget = run.add_argument_group(
        "spend limits (docs/costs.md): reached before a model call, the turn ends 'budget "
        "exceeded'; a worker elsewhere allows at most its DURABLE_HARNESS_BUDGET_* ceilings"
    )
    for scope, what in (("turn", "this turn"), ("session", "the session's turns together")):
        budget.add_argument(
            f"--budget-{scope}-tokens",
            type=int,
            metavar="N",
            help=f"tokens {what} may spend (every usage count summed; a call lost to a "
            "crash counts as the model step before it plus max_tokens)",
        )
        budget.add_argument(
            f"--budget-{scope}-usd",
            type=float,
            metavar="USD",
            help=f"US dollars {what} may spend (the price table, DURABLE_HARNESS_PRICES)",
        )
    run.add_argument("--detach", action="store_true", help="only enqueue; a worker runs it")
    run.add_argument("--quiet", "-q", action="store_true", help="no step progress on stderr")
    world_flags(run)

    worker = sub.add_parser(
        "worker",
        help="claim turns and drive them; finishes dead turns",
        description="Claim turns and drive them. A turn whose holder is provably dead "
        "(local World: its process on this host is gone; PostgreSQL: its claim connection "
        "closed) is taken over at once. On SIGTERM: claim nothing more, let the step in "
        "flight finish (up to DURABLE_HARNESS_STOP_GRACE_SECONDS), hand the turn back, "
        "exit 0.",
    )
    worker.add_argument("--until-idle", action="store_true", help="exit when nothing is runnable")
    worker.add_argument("--max-turns", type=int, help="exit after driving this many turns")
    worker.add_argument("--quiet", "-q", action="store_true")
    world_flags(worker)
    policy_flags(worker)

    resume = sub.add_parser("resume", help="finish one turn here")
    resume.add_argument("turn", metavar="TURN")
    resume.add_argument(
        "--force",
        action="store_true",
        help="take the turn now, fencing out its current holder, instead of waiting for its lease",
    )
    resume.add_argument("--quiet", "-q", action="store_true")
    world_flags(resume)
    policy_flags(resume)

    replay = sub.add_parser(
        "replay", help="re-run a finished turn from its journal alone (0 model calls)"
    )
    replay.add_argument("turn", metavar="TURN")
    world_flags(replay)

    fork = sub.add_parser(
        "fork",
        help="continue a turn in a new session from before one of its steps",
        description="A new session whose history is TURN's steps before SEQ (read back from "
        "the journal, never asked of the model again), with the workspace as it was there, "
        "continued with PROMPT (without one: from where the cut leaves it). The original "
        "session is not changed. The built-in agent's and Claude Code's turns, for now "
        "(docs/fork.md).",
    )
    fork.add_argument("turn", metavar="TURN")
    fork.add_argument(
        "--at",
        type=int,
        required=True,
        metavar="SEQ",
        help="the step the fork is cut before (`durable-harness show TURN` numbers them); a "
        "tool call of the last kept reply at or after it is answered 'not run'",
    )
    fork.add_argument(
        "prompt",
        metavar="PROMPT",
        nargs="?",
        default="",
        help="what the fork's first turn is asked (before or after the options)",
    )
    fork.set_defaults(**{TRAILING: "prompt"})
    fork.add_argument(
        "--workspace",
        help="'virtual', 'docker', or a new, empty host folder (needed when TURN ran in a "
        "host folder: a fork never works in the original's); default: as TURN",
    )
    fork.add_argument("--detach", action="store_true", help="only enqueue; a worker runs it")
    fork.add_argument("--quiet", "-q", action="store_true", help="no step progress on stderr")
    world_flags(fork)
    policy_flags(fork)
    return {
        "run": cmd_run,
        "worker": cmd_worker,
        "resume": cmd_resume,
        "replay": cmd_replay,
        "fork": cmd_fork,
    }


def repo_flags(run: argparse.ArgumentParser) -> None:
    group = run.add_argument_group(
        "repository in",
        "A new session's workspace starts as a clone of a git repository, made on this "
        "machine (the sandbox has no network): by default the one holding the current "
        "folder, for the virtual and Docker workspaces. Its commit is recorded in the "
        "session, so a worker anywhere restores it from the World. Credentials in the "
        "repository's URL or config never reach the workspace (docs/coding-task.md).",
    )
    which = group.add_mutually_exclusive_group()
    which.add_argument(
        "--repo",
        metavar="PATH|URL",
        help="seed the workspace from this repository (a folder, or a URL cloned with this "
        "machine's git credentials)",
    )
    which.add_argument(
        "--no-repo",
        action="store_true",
        help="start with an empty workspace even inside a git repository",
    )
    group.add_argument(
        "--ref",
        help="check out this branch, tag or commit (default: the folder's current commit, "
        "or the URL's default branch)",
    )
    group.add_argument(
        "--include-uncommitted",
        action="store_true",
        help="carry the folder's uncommitted changes (modified tracked files, untracked "
        "files that are not ignored) over the checkout; without it they are left out, "
        "and `run` says so",
    )


def seed_source(args: argparse.Namespace, workspace: str) -> str | None:
    """The repository ``run`` seeds the new session from, or None (see :func:`repo_flags`)."""
    from durable_harness.core.errors import ConfigError
    from durable_harness.core.turn_config import DOCKER, VIRTUAL
    from durable_harness.runtime.seed import default_repository

    source: str | None = args.repo
    # A host folder the user names is already their choice of files: seeded only when
    # asked (--repo), never implicitly.
    if (
        source is None
        and not args.no_repo
        and args.session is None
        and workspace in (VIRTUAL, DOCKER)
    ):
        found = default_repository()
        source = None if found is None else str(found)
    if source is not None and args.session is not None:
        raise ConfigError(
            f"--repo seeds a new session, and session {args.session} has its workspace "
            "already: drop --session to start a new one from the repository, or drop --repo"
        )
    if source is None and (args.ref or args.include_uncommitted):
        flag = "--ref" if args.ref else "--include-uncommitted"
        raise ConfigError(f"{flag} needs a repository: give --repo PATH|URL")
    return source


def cmd_run(args: argparse.Namespace) -> int:
    from durable_harness.harness.budget import TURN_LIMITS
    from durable_harness.runtime.turns import start_turn, turn_config

    # Typed here by the operator: this process's own ceilings too, as --max-model-calls.
    limits = {name: getattr(args, name) for name in TURN_LIMITS if getattr(args, name) is not None}
    settings = settings_of(
        args,
        max_files=args.max_files,
        max_bytes=args.max_bytes,
        max_model_calls=args.max_model_calls,
        model=args.model,
        **limits,
    )
    config = turn_config(
        agent=args.agent,
        workspace=args.workspace,
        tools=args.tools,
        model=args.model,
        base_url=args.base_url,
        settings=settings,
        push_remote=args.push_remote,
        ci_repo=args.ci_repo,
    )
    config.update(limits)
    if args.setup is not None:
        config["setup"] = args.setup
    if args.agent_config:
        from durable_harness.adapters import read_agent_config

        config["agent_config"] = read_agent_config(args.agent_config)
    from durable_harness.runtime.toolchain import image_argument, repository_toolchain
    from durable_harness.sandbox.session_image import stderr_say

    if args.image:
        config["image"] = image_argument(args.image, str(config["workspace"]), settings, stderr_say)
    seed = None
    source = seed_source(args, str(config["workspace"]))
    if source is not None:
        from durable_harness.runtime.seed import prepare_seed

        def toolchain(checkout: Path) -> None:
            repository_toolchain(
                checkout,
                config,
                settings,
                stderr_say,
                source=source,
                setup_given=getattr(args, "setup", None) is not None or "setup" in config,
                devcontainer=not args.no_devcontainer,
            )

        seed = prepare_seed(
            source,
            config,
            ref=args.ref,
            include_uncommitted=args.include_uncommitted,
            on_checkout=None if args.image else toolchain,
        )
        print(f"durable-harness: {seed.describe()} (--no-repo: start empty)", file=sys.stderr)
        if seed.left_out:
            print(
                f"durable-harness: {seed.left_out} uncommitted change(s) in {seed.repo} left "
                "out of the workspace: commit them, or give --include-uncommitted to carry them",
                file=sys.stderr,
            )
    from durable_harness.runtime.admission import grant

    # Typed here by the operator (or declared by the repository they seeded from, which
    # they chose): this process may run it.
    grant(config)
    with open_configured(settings) as world:
        turn = start_turn(
            world,
            settings,
            args.prompt,
            config,
            args.session,
            queue_behind=args.detach,
            seed=seed,
        )
        return drive_here(world, settings, turn, args)


def drive_here(world: World, settings: Settings, turn: Turn, args: argparse.Namespace) -> int:
    """What ``run`` and ``fork`` do with the turn they queued: print its ids, then drive
    it in this process (or, with ``--detach``, leave it to a worker)."""
    from durable_harness.runtime.turns import make_worker

    print(f"session {turn.session_id}\nturn {turn.turn_id}", flush=True)
    if args.detach:
        print("queued: `durable-harness worker` will run it", file=sys.stderr)
        return 0
    worker = make_worker(world, settings, quiet=args.quiet)
    lease = world.claim_turn(turn.turn_id, worker.owner, settings.lease_seconds)
    if lease is not None:
        with handing_back_on_sigterm(worker, f"`{args.command}` got SIGTERM"):
            worker.drive(lease)
    return report(world.get_turn(turn.turn_id))


@contextlib.contextmanager
def handing_back_on_sigterm(worker: Worker, reason: str) -> Iterator[None]:
    """While the body runs, SIGTERM (a deploy, a terminal closed by its manager) stops the
    worker as ``worker``'s doc says: nothing more is claimed, the step in flight finishes
    (up to the stop grace period), the turn is handed back at once for another process to
    take. On a thread of its own: the handler may interrupt the main thread in a lock."""

    def on_sigterm(*_: object) -> None:
        threading.Thread(target=worker.stop, args=(reason,)).start()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_worker(args: argparse.Namespace) -> int:
    from durable_harness.runtime.telemetry import export_metrics
    from durable_harness.runtime.turns import make_worker

    settings = settings_of(args)
    with open_configured(settings) as world, export_metrics(world):
        worker = make_worker(world, settings, quiet=args.quiet)
        if not args.quiet:
            print(f"durable-harness: worker {worker.owner} on {settings.world}", file=sys.stderr)

        with handing_back_on_sigterm(worker, "the worker got SIGTERM"):
            n = worker.run(until_idle=args.until_idle, max_turns=args.max_turns)
        if not args.quiet:
            print(f"durable-harness: worker drove {n} turn(s)", file=sys.stderr)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from durable_harness.runtime.turns import claim_for_resume, make_worker

    settings = settings_of(args)
    with open_configured(settings) as world:
        worker = make_worker(world, settings, quiet=args.quiet)
        lease = claim_for_resume(
            world,
            settings,
            args.turn,
            worker.owner,
            force=args.force,
            say=lambda m: print(f"durable-harness: {m}", file=sys.stderr, flush=True),
        )
        if lease is not None:
            with handing_back_on_sigterm(worker, "`resume` got SIGTERM"):
                worker.drive(lease)
        return report(world.get_turn(args.turn))


def cmd_fork(args: argparse.Namespace) -> int:
    from durable_harness.runtime.admission import grant
    from durable_harness.runtime.fork import fork_turn

    settings = settings_of(args)
    if args.workspace is not None:
        # Typed here by the operator, as `run --workspace` is; the rest of the origin's
        # config is admitted as a turn read from the World is (as `resume` does).
        grant({"agent": "builtin", "workspace": args.workspace})
    with open_configured(settings) as world:
        turn = fork_turn(world, settings, args.turn, args.at, args.prompt, workspace=args.workspace)
        print(
            f"durable-harness: forked {args.turn} before step {args.at} into session "
            f"{turn.session_id} (the original is unchanged)",
            file=sys.stderr,
        )
        return drive_here(world, settings, turn, args)


def cmd_replay(args: argparse.Namespace) -> int:
    from durable_harness.runtime.turns import replay_turn

    settings = settings_of(args)
    with open_configured(settings) as world:
        reply, steps = replay_turn(world, settings, args.turn)
        recorded = world.get_turn(args.turn).result
    print(reply)
    print(
        f"durable-harness: {steps} steps read back from the journal, 0 calls made", file=sys.stderr
    )
    if reply != recorded:
        print(
            f"durable-harness: the replayed reply differs from the recorded one: {recorded!r}",
            file=sys.stderr,
        )
        return 1
    return 0
