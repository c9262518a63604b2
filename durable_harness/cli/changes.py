"""Taking a session's work out: ``diff``, ``apply``, ``export`` (docs/coding-task.md).

Each reads only the World (the session's seed record and its newest workspace snapshot),
so it works on any machine, after the session's container is gone."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from durable_harness.cli.common import Commands, settings_of, world_flags
from durable_harness.worlds import open_configured

if TYPE_CHECKING:
    from durable_harness.cli.common import Subparsers

_SESSION_HELP = "the session (or one of its turns), as `durable-harness ls` shows it"
_FROM_WORLD = (
    "Read from the World alone: the seed commit the session was started from (run --repo) "
    "and the newest workspace snapshot. Git never runs in the workspace's own .git (it "
    "was written by the agent): its objects are checked and copied into a repository of "
    "the harness's own."
)


def register(sub: Subparsers) -> Commands:
    diff = sub.add_parser(
        "diff",
        help="the agent's work against the seed commit, as a diff or a patch series",
        description="Print the session's work (committed and uncommitted) against the "
        "commit it was seeded from. " + _FROM_WORLD,
    )
    diff.add_argument("session", metavar="SESSION", help=_SESSION_HELP)
    diff.add_argument(
        "--format",
        choices=("diff", "patch"),
        default="diff",
        help="diff: one unified diff (git apply takes it); patch: the agent's commits as "
        "`git format-patch --stdout`, plus one commit for uncommitted changes (git am "
        "takes it)",
    )
    world_flags(diff)

    apply = sub.add_parser(
        "apply",
        help="put the agent's work on a new branch of your repository (no checkout)",
        description="Create a branch (dh/SESSION by default) of your repository at the "
        "session's final work; your current branch, index and working tree are not "
        "touched, and no hook runs. The repository must hold the seed commit. " + _FROM_WORLD,
    )
    apply.add_argument("session", metavar="SESSION", help=_SESSION_HELP)
    apply.add_argument(
        "--repo", type=Path, help="your repository (default: the one of the current folder)"
    )
    apply.add_argument("--branch", help="the branch to create (default dh/SESSION); never reused")
    world_flags(apply)

    export = sub.add_parser(
        "export",
        help="write the session's newest workspace files into a folder",
        description="Write the files of the session's newest workspace snapshot (links, "
        "executable bits and empty folders kept; the workspace's .git left out, as it is "
        "the agent's) into DIR, which must be new or empty. Works for any session with a "
        "snapshot, seeded or not.",
    )
    export.add_argument("session", metavar="SESSION", help=_SESSION_HELP)
    export.add_argument("folder", metavar="DIR", type=Path, help="a new or empty folder")
    world_flags(export)
    return {"diff": cmd_diff, "apply": cmd_apply, "export": cmd_export}


def cmd_diff(args: argparse.Namespace) -> int:
    from durable_harness.runtime.changes import diff_session

    with open_configured(settings_of(args)) as world:
        out = diff_session(world, args.session, patch=args.format == "patch")
    sys.stdout.buffer.write(out)
    sys.stdout.buffer.flush()
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    from durable_harness.runtime.changes import apply_session

    with open_configured(settings_of(args)) as world:
        done = apply_session(world, args.session, repo=args.repo, branch=args.branch)
    print(
        f"created branch {done.branch} at {done.commit[:12]} in {done.repo} "
        f"(nothing checked out; see it with: git log {done.branch})"
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from durable_harness.runtime.changes import export_session

    with open_configured(settings_of(args)) as world:
        state = export_session(world, args.session, args.folder)
    print(f"wrote {len(state.files)} files and {len(state.links)} links into {args.folder}")
    return 0
