"""The built-in host tool ``git_push``: the sandbox's commits, pushed from the host.

Offered to every agent when the turn has a ``push_remote`` (``run --push-remote``); its
label is ``never`` (a push is a side effect), so one interrupted is reported to the model
as possibly ran, and calling it again is how the model checks: the same commit on the
same branch is answered "already pushed".

The sandbox side runs as the agent, through the sandbox's own ``bash`` (so on Docker, a
host folder or any backend with git): in a subshell (the agent's cwd and variables stay
as they are), in the repository of the agent's current folder, it points a scratch ref at
the commit, writes ``git bundle create`` of it to a temporary file, drops the ref, and the
file is read back in base64 chunks under every backend's output cap, up to
``DURABLE_HARNESS_PUSH_MAX_BYTES``. The bundle is untrusted data: ``repo/push.py`` checks
and pushes it with no git run in the workspace's ``.git``. The virtual workspace has no
git: the tool's result says so.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import secrets
import shlex
from collections.abc import Callable
from contextlib import AbstractContextManager

from pydantic import BaseModel, Field

from durable_harness.core.errors import RepositoryError
from durable_harness.core.sandbox import Sandbox
from durable_harness.core.turn_config import TurnConfig
from durable_harness.core.world import Queue
from durable_harness.harness.ci_watch import watch_ref
from durable_harness.harness.tools import Tool, ToolContext
from durable_harness.repo.push import BUNDLE_REF, push_bundle

__all__ = ["GIT_PUSH", "GitPushArgs", "git_push_tool", "push_tools"]

GIT_PUSH = "git_push"
#: The signal a pushed commit's CI result comes as (``wait_for_signal("ci")``).
CI_SIGNAL = "ci"
#: Raw bytes per read: their base64 stays under the Docker sandbox's 1 MiB output cap.
CHUNK = 512 * 1024
_DESCRIPTION = (
    "Push a commit of the workspace's git repository (the one your shell's current folder "
    "is in) to a branch of the configured remote; the harness pushes it from outside the "
    "sandbox with its own credentials. Never forced: a non-fast-forward or protected branch "
    "is an error. Pushing the same commit to the same branch again is reported as already "
    "pushed, so after an interrupted push, call it again to check. Returns the SHA and branch."
)

_BUNDLE = """(
command -v git >/dev/null || {{ echo "git is not installed in this sandbox" >&2; exit 3; }}
top=$(git rev-parse --show-toplevel) || exit 3
sha=$(git -C "$top" rev-parse --verify --quiet --end-of-options "$1^{{commit}}") || {{
  echo "no commit $1 in the repository at $top" >&2; exit 4; }}
f=$(mktemp "${{TMPDIR:-/tmp}}/dh-push.XXXXXXXX") || exit 5
git -C "$top" update-ref {ref} "$sha" || exit 5
git -C "$top" bundle create --quiet "$f" {ref}; rc=$?
git -C "$top" update-ref -d {ref}
[ "$rc" = 0 ] || {{ rm -f "$f"; exit 5; }}
printf '%s %s %s\\n' "$sha" "$(stat -c %s "$f")" "$f"
)"""


class GitPushArgs(BaseModel):
    branch: str = Field(description="the remote branch to push to, e.g. 'fix/ci'")
    commit: str = Field(default="HEAD", description="the commit to push (default HEAD)")


#: Gives the turn's sandbox for one push (a sandbox opened for it is closed after).
SandboxOpener = Callable[[], AbstractContextManager[Sandbox]]


def push_tools(
    turn: TurnConfig,
    sandbox: SandboxOpener,
    max_bytes: int,
    world: Queue,
    branches: tuple[str, ...] = ("*",),
) -> list[Tool]:
    """``[git_push]`` when the turn has a push remote, else nothing. ``sandbox`` gives the
    turn's sandbox when the tool runs (so a turn that never pushes opens nothing); with a
    ``ci_repo``, each pushed commit is watched in ``world`` (see :func:`git_push_tool`);
    ``branches`` are the operator's patterns (``DURABLE_HARNESS_PUSH_BRANCHES``)."""
    if not turn.push_remote:
        return []
    return [git_push_tool(turn.push_remote, sandbox, max_bytes, world, turn.ci_repo, branches)]


def git_push_tool(
    remote: str,
    sandbox: SandboxOpener,
    max_bytes: int,
    world: Queue | None = None,
    ci_repo: str | None = None,
    branches: tuple[str, ...] = ("*",),
) -> Tool:
    """The tool. With ``ci_repo``, the commit is watched (``harness/ci_watch.py``) for the
    turn's signal ``ci`` before it is pushed: a CI that reports before the push even
    returns still finds the turn, and a result for an earlier push no longer counts. A
    branch no pattern of ``branches`` matches is refused before the sandbox is touched."""

    def git_push(args: GitPushArgs, ctx: ToolContext) -> str:
        if not any(fnmatch.fnmatchcase(args.branch, pattern) for pattern in branches):
            allowed = ", ".join(branches) or "none"
            raise RepositoryError(
                f"git_push: branch {args.branch!r} is not one this worker pushes to "
                f"(allowed: {allowed}; the operator's DURABLE_HARNESS_PUSH_BRANCHES): "
                "push to a branch that matches"
            )
        with sandbox() as box:
            bundle, ref = take_bundle(box, args.commit, max_bytes)

        def watch(sha: str) -> None:
            if world is not None and ci_repo is not None:
                watch_ref(world, ctx.turn_id, ci_repo, sha, None, CI_SIGNAL)

        result = push_bundle(bundle, ref, remote, args.branch, before_push=watch)
        message = result.message()
        if ci_repo is not None:
            message += f"; its CI result ({ci_repo}) comes as signal {CI_SIGNAL!r}"
        return message

    return Tool(GIT_PUSH, _DESCRIPTION, GitPushArgs, "never", git_push)


def take_bundle(box: Sandbox, commit: str, max_bytes: int) -> tuple[bytes, str]:
    """The bundle of ``commit`` (and its history) made in ``box`` as the agent, and the ref
    it is under: see the module docstring. RepositoryError with what to do when it cannot
    be made."""
    if box.journaled:  # the in-memory workspace: no git binary, no .git to bundle
        raise RepositoryError(
            "git_push needs git in the workspace, and the virtual workspace has none: run "
            "the turn with --workspace docker (or a host folder)"
        )
    if not commit or commit.startswith("-"):
        raise RepositoryError(f"commit {commit!r} is not a revision: give a SHA, HEAD or a branch")
    ref = f"{BUNDLE_REF}{secrets.token_hex(6)}"
    script = _BUNDLE.format(ref=ref)
    # A large history takes a while to pack: more than a model's usual command timeout.
    made = box.bash(f"bash -c {shlex.quote(script)} dh {shlex.quote(commit)}", timeout=300)
    if made.exit_code != 0:
        # Some backends merge the streams: git's own "fatal:" line says most.
        said = [ln for ln in (made.stderr + "\n" + made.stdout).splitlines() if ln.strip()]
        fatal = [ln for ln in said if ln.startswith(("fatal:", "error:"))]
        reason = (fatal or said or [f"exit code {made.exit_code}"])[0]
        raise RepositoryError(f"git_push: could not bundle {commit!r}: {reason}")
    try:
        _sha, size_text, path = made.stdout.strip().splitlines()[-1].split(" ", 2)
        size = int(size_text)
    except ValueError:
        raise RepositoryError(
            f"git_push: bundling gave no result ({made.stdout[-200:]!r})"
        ) from None
    try:
        if size > max_bytes:
            raise RepositoryError(
                f"git_push: the bundle of {commit!r} is {size} bytes, over the limit of "
                f"{max_bytes} (DURABLE_HARNESS_PUSH_MAX_BYTES)"
            )
        return bytes(_read_chunks(box, path, size)), ref
    finally:
        box.bash(f"rm -f -- {shlex.quote(path)}")


def _read_chunks(box: Sandbox, path: str, size: int) -> bytearray:
    data = bytearray()
    for index in range((size + CHUNK - 1) // CHUNK):
        out = box.bash(
            f"dd if={shlex.quote(path)} bs={CHUNK} skip={index} count=1 2>/dev/null | base64 -w0"
        )
        try:
            data += base64.b64decode(out.stdout.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise RepositoryError("git_push: the bundle could not be read back") from None
    if len(data) != size:
        raise RepositoryError(f"git_push: read {len(data)} bytes of a {size}-byte bundle")
    return data
