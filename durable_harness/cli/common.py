"""What every command shares: the World and policy flags, the settings they make, and how
a turn's end is reported (and exits)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durable_harness.core.settings import Settings

if TYPE_CHECKING:
    from typing import TypeAlias

    #: What ``add_subparsers`` returns: each command module adds its parsers to it.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["Command", "Commands", "policy_flags", "report", "settings_of", "world_flags"]

#: A command's handler: its parsed arguments to the exit code.
Command = Callable[[argparse.Namespace], int]
#: Each subcommand's name to its handler, as a module's ``register`` adds them.
Commands = dict[str, Command]


#: The attribute naming a command's optional positional that may follow its options
#: (``fork TURN --at SEQ PROMPT``): argparse before Python 3.12 gives an optional
#: positional its empty default at the first positional and leaves a later one over.
TRAILING = "trailing_positional"


def world_flags(p: argparse.ArgumentParser) -> None:
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


def policy_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "policy over stored turns (docs/cli.md): a turn may choose among these, never widen them"
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
    g.add_argument(
        "--allowed-image",
        action="append",
        dest="allowed_images",
        metavar="IMAGE",
        help="a toolchain image turns may name with --image (repeatable, exact name); "
        "env DURABLE_HARNESS_ALLOWED_IMAGES",
    )
    g.add_argument(
        "--allowed-push-remote",
        action="append",
        dest="allowed_push_remotes",
        metavar="URL",
        help="a git remote the git_push tool may push to with this worker's credentials "
        "(repeatable); env DURABLE_HARNESS_ALLOWED_PUSH_REMOTES",
    )
    g.add_argument(
        "--allowed-setup-command",
        action="append",
        dest="allowed_setup_commands",
        metavar="CMD",
        help="a setup command turns may carry (run --setup; exact text, '*' for any; "
        "repeatable): it reaches DURABLE_HARNESS_SETUP_REGISTRIES; "
        "env DURABLE_HARNESS_ALLOWED_SETUP_COMMANDS",
    )


def settings_of(args: argparse.Namespace, **extra: Any) -> Settings:
    """The settings of a command: its World and policy flags over the environment."""
    return Settings.load(
        world=getattr(args, "world", None),
        data_dir=getattr(args, "data_dir", None),
        lease_seconds=getattr(args, "lease_seconds", None),
        tool_sets=getattr(args, "tool_sets", None),
        allowed_base_urls=getattr(args, "allowed_base_urls", None),
        workspace_roots=getattr(args, "workspace_roots", None),
        allowed_images=getattr(args, "allowed_images", None),
        allowed_push_remotes=getattr(args, "allowed_push_remotes", None),
        allowed_setup_commands=getattr(args, "allowed_setup_commands", None),
        **extra,
    )


def report(turn: Any) -> int:
    """Print how a driven turn stands (its reply on stdout when done); the exit code."""
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
    if turn.status is TurnStatus.CANCELLED:
        print(f"durable-harness: turn {turn.turn_id} was cancelled: {turn.error}", file=sys.stderr)
        return 1
    print(
        f"durable-harness: turn {turn.turn_id} is {turn.status.value}"
        + (f" (last error: {turn.error})" if turn.error else "")
        + f"; `durable-harness resume {turn.turn_id}` or a worker will finish it",
        file=sys.stderr,
    )
    return 1
