"""The ``durable-harness`` command: parses arguments and calls the layers below (the
runtime; testing/ for ``demo``, ``fake-model`` and ``crash-matrix``). Nothing else.

Exit codes: 0 success, 1 the turn failed, 2 bad input (one line on stderr saying what to
do), 86 a crash injected with DURABLE_HARNESS_CRASH_AT.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from durable_harness.core.errors import DurableHarnessError
from durable_harness.core.settings import Settings
from durable_harness.core.version import __version__
from durable_harness.harness.crash import CRASH_POINTS
from durable_harness.worlds import open_configured

EPILOG = """\
Every model and tool call of a turn is journaled in a World (intent before, outcome
after). If the process dies, `durable-harness worker` (or `resume TURN`) finishes the turn:
finished calls are read back, never re-run; an interrupted tool follows its replay label.

Environment: DURABLE_HARNESS_WORLD (local), DURABLE_HARNESS_DATA_DIR (the local World's
folder), DURABLE_HARNESS_LEASE_SECONDS, DURABLE_HARNESS_MODEL, ANTHROPIC_BASE_URL,
ANTHROPIC_API_KEY (never stored), DURABLE_HARNESS_CRASH_AT=<seq>:<point> (crash injection).
Start with `durable-harness demo`.
"""


def _world_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("World")
    g.add_argument(
        "--world",
        help="World backend: local (default), postgres, s3sqs, or a folder path; "
        "env DURABLE_HARNESS_WORLD",
    )
    g.add_argument("--data-dir", help="local World folder; env DURABLE_HARNESS_DATA_DIR")
    g.add_argument(
        "--lease-seconds",
        type=float,
        help="lease length; a dead worker's turn is redelivered after it (default 30)",
    )


def _policy_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "policy over stored turns (docs/configuration.md): a turn may choose among these, "
        "never widen them"
    )
    g.add_argument(
        "--tool-set",
        action="append",
        dest="tool_sets",
        metavar="NAME=FILE.py[:LIST]",
        help="a host tool set turns may name (repeatable); env DURABLE_HARNESS_TOOL_SETS",
    )
    g.add_argument(
        "--allowed-base-url",
        action="append",
        dest="allowed_base_urls",
        metavar="URL",
        help="a model endpoint turns may name besides this worker's own (repeatable); "
        "env DURABLE_HARNESS_ALLOWED_BASE_URLS",
    )
    g.add_argument(
        "--workspace-root",
        action="append",
        dest="workspace_roots",
        metavar="DIR",
        help="a folder host-folder workspaces must be in (repeatable); "
        "env DURABLE_HARNESS_WORKSPACE_ROOTS",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durable-harness",
        description="Crash-safe AI coding agents: journal every call, finish dead turns.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"durable-harness {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="start a turn and drive it here (or --detach)")
    run.add_argument("prompt", metavar="PROMPT")
    run.add_argument(
        "--agent",
        default="builtin",
        help="builtin (default), claude-code, codex, opencode or pi (docs/<agent>.md)",
    )
    run.add_argument(
        "--workspace",
        default="virtual",
        help="'virtual' (in-memory, default), 'docker' (a container per session, "
        "docs/docker.md) or a host folder (the local sandbox, opt-in)",
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
    run.add_argument("--session", help="add the turn to this session (it sees the earlier turns)")
    run.add_argument(
        "--agent-config",
        metavar="FILE.toml",
        help="the agent's options (CLI agents: replay labels, see docs/claude-code.md)",
    )
    run.add_argument("--model", help="model name (env DURABLE_HARNESS_MODEL)")
    run.add_argument(
        "--base-url",
        help="model endpoint (default: env ANTHROPIC_BASE_URL); a worker elsewhere runs the "
        "turn only if it is its own or in its DURABLE_HARNESS_ALLOWED_BASE_URLS",
    )
    run.add_argument("--max-files", type=int, help="virtual workspace file cap (default 500)")
    run.add_argument("--max-bytes", type=int, help="virtual workspace byte cap (default 10 MiB)")
    run.add_argument(
        "--max-model-calls",
        type=int,
        help="model calls per turn, any agent (default 50): past it the turn fails",
    )
    run.add_argument("--detach", action="store_true", help="only enqueue; a worker runs it")
    run.add_argument("--quiet", "-q", action="store_true", help="no step progress on stderr")
    _world_flags(run)

    worker = sub.add_parser("worker", help="claim turns and drive them; finishes dead turns")
    worker.add_argument("--until-idle", action="store_true", help="exit when nothing is runnable")
    worker.add_argument("--max-turns", type=int, help="exit after driving this many turns")
    worker.add_argument("--quiet", "-q", action="store_true")
    _world_flags(worker)
    _policy_flags(worker)

    resume = sub.add_parser("resume", help="finish one turn here")
    resume.add_argument("turn", metavar="TURN")
    resume.add_argument(
        "--force",
        action="store_true",
        help="take the turn now, fencing out its current holder, instead of waiting for its lease",
    )
    resume.add_argument("--quiet", "-q", action="store_true")
    _world_flags(resume)
    _policy_flags(resume)

    replay = sub.add_parser(
        "replay", help="re-run a finished turn from its journal alone (0 model calls)"
    )
    replay.add_argument("turn", metavar="TURN")
    _world_flags(replay)

    ls = sub.add_parser("ls", help="list turns and sessions, newest first")
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--limit", type=int, default=50)
    _world_flags(ls)

    show = sub.add_parser("show", help="one line per step of a turn")
    show.add_argument("turn", metavar="TURN")
    show.add_argument("--json", action="store_true")
    _world_flags(show)

    sig = sub.add_parser("signal", help="send a signal to a turn (wakes it if it waits)")
    sig.add_argument("turn", metavar="TURN")
    sig.add_argument("name", metavar="NAME")
    sig.add_argument("--data", help="JSON payload the waiting agent receives")
    _world_flags(sig)

    sigsrv = sub.add_parser(
        "signal-server",
        help="HTTP endpoint for webhooks: POST /v1/turns/TURN/signals/NAME (bearer secret)",
    )
    sigsrv.add_argument("--host", default="127.0.0.1")
    sigsrv.add_argument("--port", type=int, default=8787)
    _world_flags(sigsrv)

    doctor = sub.add_parser("doctor", help="check the World and the model endpoint settings")
    _world_flags(doctor)

    box = sub.add_parser("sandbox", help="the Docker sandbox: build its image, list, remove")
    box_sub = box.add_subparsers(dest="sandbox_command", metavar="ACTION", required=True)
    build = box_sub.add_parser(
        "build", help="build the agent image (the CLIs at pinned versions; docs/docker.md)"
    )
    build.add_argument(
        "--offline",
        action="store_true",
        help="no registry: a debootstrap base with this host's node, CLIs by this host's npm",
    )
    build.add_argument("--base", help="base image (default node:20-bookworm-slim)")
    build.add_argument("--tag", help="image name (default durable-harness/agent:<version>)")
    build.add_argument("--network", help="network of the RUN steps (host: a daemon without bridge)")
    build.add_argument("--cache-dir", help="offline build cache (default ~/.cache/durable-harness)")
    build.add_argument("--force", action="store_true", help="rebuild even if up to date")
    box_sub.add_parser("ls", help="list the sandbox containers on this Docker host")
    rm = box_sub.add_parser("rm", help="remove sessions' containers and volumes")
    rm.add_argument("sessions", nargs="+", metavar="SESSION")

    demo = sub.add_parser("demo", help="crash a turn on purpose, resume it, show the journal")
    demo.add_argument("--data-dir", help="keep the demo's World here (default: a temp folder)")
    demo.add_argument(
        "--crash-at",
        default=None,
        help="crash point <seq>:<point> (default: the refund tool, after it ran)",
    )

    matrix = sub.add_parser(
        "crash-matrix",
        help="crash a turn at every step x every point, resume each, count repeats",
        description="Runs PROMPT once cleanly against the scripted fake model, then once per "
        "step and crash point in a fresh local World: the worker is killed at that point, a "
        "new one resumes the turn, and the model calls answered twice, the never tools run "
        "twice and the final reply are checked.",
    )
    matrix.add_argument("prompt", metavar="PROMPT")
    matrix.add_argument("--script", required=True, help="the fake model's TOML script")
    matrix.add_argument("--tools", action="append", default=[], metavar="FILE.py:NAME")
    matrix.add_argument(
        "--points",
        default=",".join(CRASH_POINTS),
        help=f"comma-separated crash points (default: all of {', '.join(CRASH_POINTS)})",
    )

    fake = sub.add_parser("fake-model", help="scripted fake model (Anthropic, OpenAI Responses)")
    fake.add_argument("--script", required=True, help="TOML script of rules")
    fake.add_argument("--port", type=int, default=0)
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument("--log", help="append one JSON line per answered request")
    return parser


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    return Settings.load(
        world=getattr(args, "world", None),
        data_dir=getattr(args, "data_dir", None),
        lease_seconds=getattr(args, "lease_seconds", None),
        tool_sets=getattr(args, "tool_sets", None),
        allowed_base_urls=getattr(args, "allowed_base_urls", None),
        workspace_roots=getattr(args, "workspace_roots", None),
        **extra,
    )


def cmd_run(args: argparse.Namespace) -> int:
    from durable_harness.runtime.turns import make_worker, start_turn, turn_config

    settings = _settings(
        args,
        max_files=args.max_files,
        max_bytes=args.max_bytes,
        max_model_calls=args.max_model_calls,
        model=args.model,
    )
    config = turn_config(
        agent=args.agent,
        workspace=args.workspace,
        tools=args.tools,
        model=args.model,
        base_url=args.base_url,
        settings=settings,
    )
    if args.agent_config:
        from durable_harness.adapters import read_agent_config

        config["agent_config"] = read_agent_config(args.agent_config)
    from durable_harness.runtime.admission import grant

    grant(config)  # typed here by the operator: this process may run it
    with open_configured(settings) as world:
        turn = start_turn(
            world, settings, args.prompt, config, args.session, queue_behind=args.detach
        )
        print(f"session {turn.session_id}\nturn {turn.turn_id}", flush=True)
        if args.detach:
            print("queued: `durable-harness worker` will run it", file=sys.stderr)
            return 0
        worker = make_worker(world, settings, quiet=args.quiet)
        lease = world.claim_turn(turn.turn_id, worker.owner, settings.lease_seconds)
        if lease is not None:
            worker.drive(lease)
        return _report(world.get_turn(turn.turn_id))


def cmd_worker(args: argparse.Namespace) -> int:
    from durable_harness.runtime.turns import make_worker

    settings = _settings(args)
    with open_configured(settings) as world:
        worker = make_worker(world, settings, quiet=args.quiet)
        if not args.quiet:
            print(f"durable-harness: worker {worker.owner} on {settings.world}", file=sys.stderr)
        n = worker.run(until_idle=args.until_idle, max_turns=args.max_turns)
        if not args.quiet:
            print(f"durable-harness: worker drove {n} turn(s)", file=sys.stderr)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from durable_harness.runtime.turns import claim_for_resume, make_worker

    settings = _settings(args)
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
            worker.drive(lease)
        return _report(world.get_turn(args.turn))


def cmd_replay(args: argparse.Namespace) -> int:
    from durable_harness.runtime.turns import replay_turn

    settings = _settings(args)
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


def cmd_ls(args: argparse.Namespace) -> int:
    from durable_harness.runtime.views import format_ls, ls_data

    with open_configured(_settings(args)) as world:
        rows = ls_data(world, args.limit)
        print(json.dumps(rows, indent=2) if args.json else format_ls(rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from durable_harness.runtime.views import format_show, show_data

    with open_configured(_settings(args)) as world:
        data = show_data(world, args.turn)
        print(json.dumps(data, indent=2) if args.json else format_show(data))
    return 0


def cmd_signal(args: argparse.Namespace) -> int:
    from durable_harness.runtime.signals import parse_payload

    payload = parse_payload(args.data)
    with open_configured(_settings(args)) as world:
        fresh = world.send_signal(args.turn, args.name, payload)
        status = world.get_turn(args.turn).status.value
    if fresh:
        print(f"signal {args.name!r} delivered to turn {args.turn} ({status})")
    else:
        print(
            f"signal {args.name!r} was already delivered to turn {args.turn}; the first one stands"
        )
    return 0


def cmd_signal_server(args: argparse.Namespace) -> int:
    from durable_harness.runtime.signals import serve

    with open_configured(_settings(args)) as world:
        serve(world, args.host, args.port)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    settings = _settings(args)
    print(f"World: {settings.world}")
    with open_configured(settings) as world:
        checks = world.doctor()
    for check in checks:
        print(f"  [{'ok' if check.ok else 'FAIL'}] {check.name}: {check.detail}")
    from durable_harness.sandbox.docker_image import sandbox_checks

    # Informational: only --workspace docker and the claude-code/codex agents need Docker.
    print("Docker sandbox (--workspace docker, claude-code, codex):")
    for check in sandbox_checks():
        print(f"  [{'ok' if check.ok else '--'}] {check.name}: {check.detail}")
    return 0 if all(c.ok for c in checks) else 1


def cmd_sandbox(args: argparse.Namespace) -> int:
    from pathlib import Path

    from durable_harness.sandbox import docker_image

    if args.sandbox_command == "build":
        result = docker_image.build_image(
            tag=args.tag,
            base=args.base,
            offline=args.offline,
            network=args.network,
            cache_dir=Path(args.cache_dir) if args.cache_dir else None,
            force=args.force,
            say=lambda line: print(line, file=sys.stderr, flush=True),
        )
        done = "up to date" if result.cached else f"built in {result.seconds:.0f}s"
        print(f"{result.image}: {done}, {result.size / 1e6:.0f} MB")
    elif args.sandbox_command == "ls":
        for row in docker_image.list_sandboxes():
            print(f"{row['session']:<28}  {row['status']:<8}  {row['created']}  {row['container']}")
    else:
        for session in args.sessions:
            n = docker_image.remove_sandbox(session)
            print(f"{session}: {'removed' if n else 'no sandbox'}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from durable_harness.testing.demo.run import run_demo

    return run_demo(args.data_dir, args.crash_at)


def cmd_crash_matrix(args: argparse.Namespace) -> int:
    from pathlib import Path

    from durable_harness.core.errors import ConfigError
    from durable_harness.testing.fake_model import load_script
    from durable_harness.testing.matrix import run_matrix

    points = tuple(p.strip() for p in args.points.split(",") if p.strip())
    unknown = [p for p in points if p not in CRASH_POINTS]
    if unknown or not points:
        raise ConfigError(f"--points: unknown {unknown}; choose from {', '.join(CRASH_POINTS)}")
    load_script(Path(args.script))  # a bad script fails here, once, not in every cell
    results = run_matrix(
        Path(args.script),
        args.tools,
        args.prompt,
        points=points,
        say=lambda line: print(line, flush=True),
    )
    survived = sum(r.ok for r in results)
    print(f"{survived}/{len(results)} crash points survived")
    return 0 if survived == len(results) else 1


def cmd_fake_model(args: argparse.Namespace) -> int:
    from durable_harness.testing.fake_model import run_fake_model

    run_fake_model(args.script, args.port, args.log, args.host)
    return 0


def _report(turn: Any) -> int:
    from durable_harness.core.types import TurnStatus

    if turn.status is TurnStatus.DONE:
        print(turn.result)
        return 0
    if turn.status is TurnStatus.WAITING:
        print(
            f"durable-harness: turn {turn.turn_id} is parked, waiting for {turn.waiting_for}; "
            "a `durable-harness worker` resumes it when it wakes",
            file=sys.stderr,
        )
        return 0
    if turn.status is TurnStatus.FAILED:
        print(f"durable-harness: turn {turn.turn_id} failed: {turn.error}", file=sys.stderr)
        return 1
    print(
        f"durable-harness: turn {turn.turn_id} is {turn.status.value}"
        + (f" (last error: {turn.error})" if turn.error else "")
        + f"; `durable-harness resume {turn.turn_id}` or a worker will finish it",
        file=sys.stderr,
    )
    return 1


COMMANDS = {
    "run": cmd_run,
    "worker": cmd_worker,
    "resume": cmd_resume,
    "replay": cmd_replay,
    "ls": cmd_ls,
    "show": cmd_show,
    "signal": cmd_signal,
    "signal-server": cmd_signal_server,
    "doctor": cmd_doctor,
    "sandbox": cmd_sandbox,
    "demo": cmd_demo,
    "crash-matrix": cmd_crash_matrix,
    "fake-model": cmd_fake_model,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except DurableHarnessError as exc:
        print(f"durable-harness: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "durable-harness: interrupted; the turn stays journaled and resumable", file=sys.stderr
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
