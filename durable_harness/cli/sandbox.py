"""``durable-harness sandbox``: the Docker agent image and the session containers; and
``durable-harness setup-agents``: the pinned agent CLIs for the host."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from durable_harness.cli.common import Commands

if TYPE_CHECKING:
    from durable_harness.cli.common import Subparsers


def register(sub: Subparsers) -> Commands:
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
    build.add_argument(
        "--image",
        metavar="IMAGE",
        help="build the session image of `run --image IMAGE` ahead (IMAGE with node, the "
        "agent CLIs and user 1000 added; otherwise built on first use)",
    )
    box_sub.add_parser("ls", help="list the sandbox containers on this Docker host")
    rm = box_sub.add_parser("rm", help="remove sessions' containers and volumes")
    rm.add_argument("sessions", nargs="+", metavar="SESSION")
    agents = sub.add_parser(
        "setup-agents",
        help="install the pinned agent CLIs for the host (npm, into your user cache)",
        description=(
            "Installs the agent CLIs (Claude Code, Codex, OpenCode, Pi) at the exact versions "
            "of the lock this package ships, with npm, into "
            "$XDG_CACHE_HOME/durable-harness/npm/<digest of the lock> (default ~/.cache/...), "
            "and prints each one's package, version and binary. The adapters find them there "
            "(after $DURABLE_HARNESS_*_BIN and a checkout's .tools/npm, before PATH) and "
            "refuse any other version. Idempotent: a second run installs nothing. Needs node "
            "(20+) and npm. The Docker sandbox does not need them (its image has its own: "
            "`durable-harness sandbox build`); host folders (--workspace DIR) do."
        ),
    )
    agents.add_argument("--force", action="store_true", help="install again even if installed")
    return {"sandbox": cmd_sandbox, "setup-agents": cmd_setup_agents}


def cmd_setup_agents(args: argparse.Namespace) -> int:
    from durable_harness.adapters.cli.installed import install, user_prefix

    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    already = (user_prefix() / ".durable-harness-installed").is_file() and not args.force
    prefix, installed = install(say, force=args.force)
    print(f"agent CLIs {'already installed' if already else 'installed'} in {prefix}:")
    width = max(len(row.package) for row in installed)
    for row in installed:
        print(f"  {row.package:<{width}}  {row.version:<10}  {row.binary}")
    return 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    from pathlib import Path

    from durable_harness.sandbox import docker_admin, docker_image

    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.sandbox_command == "build" and args.image:
        from durable_harness.sandbox.session_image import build_session_image

        result = build_session_image(
            args.image,
            cache_dir=Path(args.cache_dir) if args.cache_dir else None,
            force=args.force,
            say=say,
        )
        done = "up to date" if result.cached else f"built in {result.seconds:.0f}s"
        print(f"{result.image} (from {args.image}): {done}, {result.size / 1e6:.0f} MB")
    elif args.sandbox_command == "build":
        result = docker_image.build_image(
            tag=args.tag,
            base=args.base,
            offline=args.offline,
            network=args.network,
            cache_dir=Path(args.cache_dir) if args.cache_dir else None,
            force=args.force,
            say=say,
        )
        done = "up to date" if result.cached else f"built in {result.seconds:.0f}s"
        print(f"{result.image}: {done}, {result.size / 1e6:.0f} MB")
    elif args.sandbox_command == "ls":
        for row in docker_admin.list_sandboxes():
            print(f"{row['session']:<28}  {row['status']:<8}  {row['created']}  {row['container']}")
    else:
        for session in args.sessions:
            n = docker_admin.remove_sandbox(session)
            print(f"{session}: {'removed' if n else 'no sandbox'}")
    return 0
