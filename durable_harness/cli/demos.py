"""The commands over the testing package: ``demo``, ``crash-matrix``, ``eval``,
``fake-model``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from durable_harness.cli.common import Commands
from durable_harness.harness.crash import CRASH_POINTS

if TYPE_CHECKING:
    from durable_harness.cli.common import Subparsers


def register(sub: Subparsers) -> Commands:
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

    evals = sub.add_parser(
        "eval",
        help="measure the model: does it check before retrying a possibly-ran call?",
        description="possibly-ran: runs PROMPT once cleanly to find its first never tool, "
        "then RUNS times, each in a fresh local World, crashes the worker right after that "
        "tool ran (its effect happened, its outcome is lost) and resumes the turn; the model "
        "is told the call possibly ran. A run passes when the model's next tool call is not "
        "that tool again (it checked first); it fails on a blind retry. Prints each run and "
        "the pass rate. The model is the scripted fake one with --script, else the one the "
        "settings name (ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY): a real model is paid for "
        "every run.",
    )
    evals.add_argument("which", choices=["possibly-ran"], help="the eval to run")
    evals.add_argument(
        "prompt",
        metavar="PROMPT",
        nargs="?",
        default=None,
        help="default: the demo's refund prompt (with the demo's tools)",
    )
    evals.add_argument(
        "--agent",
        default="builtin",
        help="builtin (default), or a CLI agent (claude-code, codex, opencode, pi), run in a "
        "Docker container of each run's own; the never tools are the host tools",
    )
    evals.add_argument("--runs", type=int, default=20, help="how many crashed runs (default 20)")
    evals.add_argument("--script", help="the fake model's TOML script (default: a real model)")
    evals.add_argument(
        "--tools",
        action="append",
        default=[],
        metavar="FILE.py:NAME",
        help="the turn's tools (default: the demo's refund and check_refund)",
    )
    evals.add_argument(
        "--fail-under",
        type=float,
        default=None,
        metavar="PERCENT",
        help="exit 1 when the pass rate is below this (default: always exit 0)",
    )

    fake = sub.add_parser("fake-model", help="scripted fake model (Anthropic, OpenAI Responses)")
    fake.add_argument("--script", required=True, help="TOML script of rules")
    fake.add_argument("--port", type=int, default=0)
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument("--log", help="append one JSON line per answered request")
    return {
        "demo": cmd_demo,
        "crash-matrix": cmd_crash_matrix,
        "eval": cmd_eval,
        "fake-model": cmd_fake_model,
    }


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
    settled = sum(r.settled for r in results)
    if settled:
        print(f"{settled} interrupted call(s) settled by their tool's check, without the model")
    print(f"{survived}/{len(results)} crash points survived")
    return 0 if survived == len(results) else 1


#: The agents ``eval possibly-ran`` drives (ACP agents: not yet).
EVAL_AGENTS = ("builtin", "claude-code", "codex", "opencode", "pi")


def cmd_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from durable_harness.core.errors import ConfigError
    from durable_harness.testing.demo.run import PROMPT, demo_files
    from durable_harness.testing.evals import possibly_ran_eval
    from durable_harness.testing.fake_model import load_script

    if args.agent not in EVAL_AGENTS:
        raise ConfigError(
            f"eval possibly-ran: --agent {args.agent!r} is not one it drives: "
            f"{', '.join(EVAL_AGENTS)}"
        )
    if args.runs < 1:
        raise ConfigError(f"--runs {args.runs}: give at least 1")
    script = Path(args.script) if args.script else None
    if script is not None:
        load_script(script)  # a bad script fails here, once
    if args.tools and args.prompt is None:
        raise ConfigError("eval possibly-ran: with --tools, give the PROMPT that uses them")
    tools = args.tools or [f"{demo_files()[1]}:TOOLS"]
    try:
        report = possibly_ran_eval(
            script,
            tools,
            args.prompt or PROMPT,
            args.runs,
            say=lambda line: print(line, flush=True),
            agent=args.agent,
        )
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"eval possibly-ran: {exc}") from None
    print(report.summary())
    rate = report.pass_rate
    if args.fail_under is not None and (rate is None or rate * 100 < args.fail_under):
        return 1
    return 0


def cmd_fake_model(args: argparse.Namespace) -> int:
    from durable_harness.testing.fake_model import run_fake_model

    run_fake_model(args.script, args.port, args.log, args.host)
    return 0
