"""The ``durable-harness`` command: parses arguments and calls the layers below (the
runtime; testing/ for ``demo``, ``fake-model`` and ``crash-matrix``). Nothing else.

One module per group of commands, each adding its parsers and handlers in ``register``
(a new command is a function there, or a new module and one line in :data:`_GROUPS`):
:mod:`.turns` (run, worker, resume, replay), :mod:`.world` (ls, show, signal, cancel,
approve, watch, signal-server, doctor), :mod:`.serve` (serve, token), :mod:`.changes` (diff, apply,
export), :mod:`.sandbox`, :mod:`.demos` (demo, crash-matrix, fake-model); :mod:`.common`
holds the flags they share.

Exit codes: 0 success, 1 the turn failed, 2 bad input (one line on stderr saying what to
do), 86 a crash injected with DURABLE_HARNESS_CRASH_AT.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from durable_harness.cli import changes, demos, sandbox, serve, turns, world
from durable_harness.cli.common import TRAILING, Commands
from durable_harness.core.errors import DurableHarnessError
from durable_harness.core.version import __version__

__all__ = ["build_parser", "main"]

EPILOG = """\
Every model and tool call of a turn is journaled in a World (intent before, outcome
after). If the process dies, `durable-harness worker` (or `resume TURN`) finishes the turn:
finished calls are read back, never re-run; an interrupted tool follows its replay label.

Environment: DURABLE_HARNESS_WORLD (local), DURABLE_HARNESS_DATA_DIR (the local World's
folder), DURABLE_HARNESS_LEASE_SECONDS, DURABLE_HARNESS_MODEL, ANTHROPIC_BASE_URL,
ANTHROPIC_API_KEY (never stored; OPENAI_BASE_URL and OPENAI_API_KEY for --agent codex),
DURABLE_HARNESS_CRASH_AT=<seq>:<point> (crash injection).
Start with `durable-harness demo`; from an installed package: `durable-harness setup-agents`,
`durable-harness sandbox build`, `durable-harness doctor`.
"""

#: The command groups, in the order ``--help`` lists their commands.
_GROUPS = (turns, world, serve, changes, sandbox, demos)


def build_parser() -> tuple[argparse.ArgumentParser, Commands]:
    """The parser of every command, and each command's handler."""
    parser = argparse.ArgumentParser(
        prog="durable-harness",
        description="Crash-safe AI coding agents: journal every call, finish dead turns.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"durable-harness {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands: Commands = {}
    for group in _GROUPS:
        commands.update(group.register(sub))
    return parser, commands


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args, extra = parser.parse_known_args(argv)
    trailing = getattr(args, TRAILING, None)
    if (
        trailing is not None
        and len(extra) == 1
        and not getattr(args, trailing)
        and (not extra[0].startswith("-") or extra[0] == "-")
    ):
        setattr(args, trailing, extra[0])
        extra = []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = build_parser()
    args = parse(parser, argv)
    try:
        return commands[args.command](args)
    except DurableHarnessError as exc:
        print(f"durable-harness: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "durable-harness: interrupted; the turn stays journaled and resumable", file=sys.stderr
        )
        return 130
