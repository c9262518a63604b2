"""The commands that read and poke a World: ``ls``, ``show``, ``signal``, ``cancel``,
``approve``, ``watch``, ``signal-server``, ``doctor``, ``gc``."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from durable_harness.cli.common import Commands, settings_of, world_flags
from durable_harness.worlds import open_configured

if TYPE_CHECKING:
    from durable_harness.cli.common import Subparsers


def register(sub: Subparsers) -> Commands:
    ls = sub.add_parser("ls", help="list turns and sessions, newest first")
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--limit", type=int, default=50)
    world_flags(ls)

    show = sub.add_parser("show", help="one line per step of a turn")
    show.add_argument("turn", metavar="TURN")
    show.add_argument("--json", action="store_true")
    world_flags(show)

    sig = sub.add_parser("signal", help="send a signal to a turn (wakes it if it waits)")
    sig.add_argument("turn", metavar="TURN")
    sig.add_argument("name", metavar="NAME")
    sig.add_argument("--data", help="JSON payload the waiting agent receives")
    sig.add_argument(
        "--id",
        dest="delivery_id",
        help="delivery id: a second signal with the same id is ignored (default: the payload)",
    )
    world_flags(sig)

    cancel = sub.add_parser(
        "cancel",
        help="cancel a turn: its worker stops the agent and ends it `cancelled`",
        description=(
            "Record a cancel request for TURN in the World and return. A queued or waiting "
            "turn ends `cancelled` when a worker next claims it, before anything of it runs; "
            "a running turn's worker notices within DURABLE_HARNESS_CANCEL_POLL_SECONDS (1 s), "
            "starts no new step, kills the agent's CLI and ends the turn `cancelled`. What "
            "finished stays in the journal, and the session's next turn continues from it."
        ),
    )
    cancel.add_argument("turn", metavar="TURN")
    cancel.add_argument("--reason", default=None, help="why (kept as the turn's error)")
    world_flags(cancel)

    approve = sub.add_parser(
        "approve",
        help="approve (or --reject) a tool call that waits for a human's decision",
        description=(
            "Record the decision on approval step SEQ of TURN (a parked turn's `waiting_for` "
            "and `show` name it) and return; the turn wakes and a worker goes on: an "
            "approved call runs, a rejected one does not and the model reads the rejection "
            "and its reason. The first decision on a step is the one that stands."
        ),
    )
    approve.add_argument("turn", metavar="TURN")
    approve.add_argument("seq", metavar="SEQ", type=int, help="the approval step's seq")
    approve.add_argument("--reject", action="store_true", help="reject the call: it never runs")
    approve.add_argument("--reason", default="", help="why (the model reads it)")
    approve.add_argument(
        "--by", default=None, help="who decides (recorded; default operator:<login name>)"
    )
    world_flags(approve)

    watch = sub.add_parser(
        "watch",
        help="route CI webhooks (signal-server /v1/webhooks/...) for a repository to a turn",
    )
    watch.add_argument("turn", metavar="TURN")
    watch.add_argument("repo", metavar="REPO", help="github:OWNER/NAME or gitlab:GROUP/PROJECT")
    ref = watch.add_mutually_exclusive_group(required=True)
    ref.add_argument("--sha", help="the pushed commit whose CI result the turn waits for")
    ref.add_argument("--branch", help="the branch whose CI results the turn waits for")
    watch.add_argument("--name", default="ci", help="the signal the results arrive as")
    world_flags(watch)

    sigsrv = sub.add_parser(
        "signal-server",
        help="HTTP endpoint for webhooks: POST /v1/turns/TURN/signals/NAME (bearer secret)",
    )
    sigsrv.add_argument("--host", default="127.0.0.1")
    sigsrv.add_argument("--port", type=int, default=8787)
    world_flags(sigsrv)

    doctor = sub.add_parser(
        "doctor",
        help="check the World, the Docker sandbox and each agent's readiness",
        description=(
            "Checks the World (exit code 1 when a check fails), then says whether Docker "
            "answers and the agent image is built, and prints one line per agent: ready or "
            "what to run, the host binary's version and where it was found, the pinned "
            "version, the agent image (informational: they do not change the exit code)."
        ),
    )
    world_flags(doctor)

    gc = sub.add_parser(
        "gc",
        help="remove what finished sessions older than AGE no longer need (operator only)",
        description=(
            "Removes every session whose turns all ended and which saw no activity for AGE: "
            "its turns, journals, events, signals and records, then every blob that nothing "
            "kept names (a live turn's and a newer session's blobs stay, and so does any "
            "blob touched within DURABLE_HARNESS_GC_GRACE_SECONDS, 6 h by default). Prints "
            "what it removed (counts, bytes); a progress line every 5 s on stderr on a long "
            "run. Workers run it themselves with DURABLE_HARNESS_GC_OLDER_THAN set. Docker "
            "sandboxes of ended sessions: `durable-harness sandbox prune`."
        ),
    )
    gc.add_argument(
        "--older-than", required=True, metavar="AGE", help="e.g. 30d, 12h, 90m, or seconds"
    )
    gc.add_argument("--dry-run", action="store_true", help="count what would go; remove nothing")
    gc.add_argument("--json", action="store_true", help="print the report as one JSON object")
    world_flags(gc)
    return {
        "ls": cmd_ls,
        "show": cmd_show,
        "signal": cmd_signal,
        "cancel": cmd_cancel,
        "approve": cmd_approve,
        "signal-server": cmd_signal_server,
        "watch": cmd_watch,
        "doctor": cmd_doctor,
        "gc": cmd_gc,
    }


def cmd_ls(args: argparse.Namespace) -> int:
    from durable_harness.runtime.views import format_ls, ls_data

    settings = settings_of(args)
    with open_configured(settings) as world:
        rows = ls_data(world, args.limit, settings.price_table())
        print(json.dumps(rows, indent=2) if args.json else format_ls(rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from durable_harness.runtime.views import format_show, show_data

    settings = settings_of(args)
    with open_configured(settings) as world:
        data = show_data(world, args.turn, settings.price_table())
        print(json.dumps(data, indent=2) if args.json else format_show(data))
    return 0


def cmd_signal(args: argparse.Namespace) -> int:
    from durable_harness.harness.events import signal_received
    from durable_harness.runtime.cancel import refuse_reserved_signal
    from durable_harness.runtime.signals import parse_payload

    refuse_reserved_signal(args.name)
    payload = parse_payload(args.data)
    with open_configured(settings_of(args)) as world:
        fresh = world.send_signal(args.turn, args.name, payload, args.delivery_id)
        signal_received(world, args.turn, args.name, payload, args.delivery_id)
        status = world.get_turn(args.turn).status.value
    if fresh:
        print(f"signal {args.name!r} delivered to turn {args.turn} ({status})")
    else:
        print(f"signal {args.name!r} was already delivered to turn {args.turn}; ignored")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from durable_harness.runtime.cancel import DEFAULT_REASON, request_cancel

    with open_configured(settings_of(args)) as world:
        requested = request_cancel(world, args.turn, args.reason or DEFAULT_REASON)
        turn = world.get_turn(args.turn)
    if requested:
        print(
            f"cancel requested for turn {args.turn} ({turn.status.value}): its worker ends it "
            "`cancelled` (see `durable-harness show`)"
        )
    else:
        print(f"turn {args.turn} had already finished ({turn.status.value}); nothing to cancel")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    from durable_harness.runtime.approvals import operator_name, record_decision

    by = args.by or operator_name()
    with open_configured(settings_of(args)) as world:
        done = record_decision(world, args.turn, args.seq, not args.reject, by, args.reason)
    verdict = "approved" if done.decision.approved else "rejected"
    if done.new:
        print(f"step {args.seq} of turn {args.turn} {verdict} by {by}: a worker goes on")
    else:
        print(
            f"step {args.seq} of turn {args.turn} was decided already ({verdict} by "
            f"{done.decision.by}); this decision is ignored"
        )
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    from durable_harness.harness.ci_watch import watch_ref

    with open_configured(settings_of(args)) as world:
        scope, ref = watch_ref(world, args.turn, args.repo, args.sha, args.branch, args.name)
    print(f"turn {args.turn} gets CI results for {scope} {ref} as signal {args.name!r}")
    return 0


def cmd_signal_server(args: argparse.Namespace) -> int:
    from durable_harness.runtime.signals import serve

    with open_configured(settings_of(args)) as world:
        serve(world, args.host, args.port)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    print(f"World: {settings.world}")
    with open_configured(settings) as world:
        checks = world.doctor()
    for check in checks:
        print(f"  [{'ok' if check.ok else 'FAIL'}] {check.name}: {check.detail}")
    from durable_harness.sandbox.docker_admin import sandbox_checks

    # Informational: only --workspace docker and the claude-code/codex agents need Docker.
    print("Docker sandbox (--workspace docker, claude-code, codex):")
    for check in sandbox_checks():
        print(f"  [{'ok' if check.ok else '--'}] {check.name}: {check.detail}")
    from durable_harness.runtime.readiness import agent_readiness, format_readiness

    # Informational too: each agent needs only what its workspace uses.
    print("Agents (binary: where the host one is found; image: the Docker sandbox's):")
    print(format_readiness(agent_readiness()))
    return 0 if all(c.ok for c in checks) else 1


def cmd_gc(args: argparse.Namespace) -> int:
    import dataclasses
    import sys

    from durable_harness.runtime.gc import collect, parse_age

    older_than = parse_age(args.older_than)
    settings = settings_of(args)
    with open_configured(settings) as world:
        report = collect(
            world,
            older_than,
            dry_run=args.dry_run,
            grace=settings.gc_grace_seconds,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    print(json.dumps(dataclasses.asdict(report)) if args.json else report.line())
    return 0
