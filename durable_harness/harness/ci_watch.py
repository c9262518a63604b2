"""Routing a repository's CI results to the turns that wait for them: the watches.

A CI system knows a repository and a commit, not a turn. A turn (or ``git_push``, which
pushes for it) registers what it waits for with :func:`watch_ref`: repository
``github:OWNER/NAME`` or ``gitlab:GROUP/PROJECT``, and ``sha:<commit>`` or
``branch:<name>``. A new watch of the same turn, repository and signal name replaces the
last one, so a late result for an earlier push reaches no wait; and a commit watch
supersedes the turn's results of that name for other commits that no wait took yet (a
second report of the earlier push, a re-run), so the next wait gets a result for the
commit it waits on or nothing. The webhooks that deliver the results:
``runtime/webhooks.py``.
"""

from __future__ import annotations

import re

from durable_harness.core.canonical import parse_json
from durable_harness.core.errors import ConfigError
from durable_harness.core.world import SUPERSEDED, Queue

__all__ = ["check_repo", "scope_of", "watch_ref"]

_REPO = re.compile(r"^(?P<provider>github|gitlab):(?P<path>[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+)$")
#: A full commit id (SHA-1 or SHA-256): a result names the full one, a short one matches none.
_SHA = re.compile(r"^(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})$")


def check_repo(repo: str) -> re.Match[str]:
    """The parts of ``repo``, ``github:OWNER/NAME`` or ``gitlab:GROUP/PROJECT``; ConfigError
    for anything else."""
    found = _REPO.match(repo)
    if found is None:
        raise ConfigError(f"repository {repo!r} is not github:OWNER/NAME or gitlab:GROUP/PROJECT")
    return found


def scope_of(provider: str, repo: str) -> str:
    # Repository names are case-insensitive on both providers.
    return f"{provider}:{repo.lower()}"


def watch_ref(
    world: Queue,
    turn_id: str,
    repo: str,
    sha: str | None,
    branch: str | None,
    name: str = "ci",
) -> tuple[str, str]:
    """Register (see the module docstring) and return ``(scope, ref)``. ConfigError for a
    malformed repository or commit."""
    found = check_repo(repo)
    if sha is not None and not _SHA.match(sha):
        raise ConfigError(
            f"--sha {sha!r} is not a full commit id (40 or 64 hex digits: `git rev-parse`)"
        )
    if (sha is None) == (branch is None):
        raise ConfigError("give exactly one of --sha and --branch")
    ref = f"sha:{sha.lower()}" if sha is not None else f"branch:{branch}"
    scope = scope_of(found["provider"], found["path"])
    world.watch(scope, ref, turn_id, name)
    if sha is not None:
        _supersede(world, turn_id, name, sha.lower())
    return scope, ref


def _supersede(world: Queue, turn_id: str, name: str, sha: str) -> None:
    """Mark the turn's untaken CI results of ``name`` for another commit as superseded.
    Signals that are not CI results (the generic endpoint's) are left as they are."""
    for signal in world.list_signals(turn_id, name):
        if signal.claimed_by is not None:
            continue
        try:
            data = parse_json(signal.payload)
            other = "provider" in data and str(data["sha"]).lower() != sha
        except (ValueError, KeyError, TypeError):
            continue
        if other:
            # Losing this race to a wait that took it first is fine: it was untaken when
            # that wait began, as if the watch had come a moment later.
            world.claim_signal(turn_id, name, signal.index, SUPERSEDED)
