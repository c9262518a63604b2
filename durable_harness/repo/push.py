"""Pushing a sandbox's commits from the host: the git half of the ``git_push`` tool.

The sandbox has no network and no credentials, so its commits leave it as a git bundle
(untrusted bytes made by the agent) and are pushed by the worker:

1. a bare repository the harness makes in a temporary folder fetches the bundle
   (``user_config=False``, objects checked with ``transfer.fsckObjects``); the commit
   pushed is the one the bundle's ref names, checked to be a commit: the sandbox's own
   claims are never used;
2. ``git ls-remote REMOTE refs/heads/BRANCH``: when the branch is already at that commit
   nothing is pushed and the result says so (a push that possibly ran is safe to check);
3. else ``git push REMOTE SHA:refs/heads/BRANCH``, never forced, with the worker's own
   git config (``user_config=True``: its credential helpers and ``insteadOf`` rules,
   where the operator keeps the credentials). A rejection is :class:`RepositoryError`
   with git's reason, which the tool hands to the model.

A push remote is stored with the turn, so it must hold no secret: :func:`check_remote`
refuses a URL with credentials in it, and :func:`reachable_remote` checks at ``run`` that
the remote answers. No git runs in the workspace's own ``.git`` on the host.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from durable_harness.core.errors import ConfigError, RepositoryError
from durable_harness.repo.git import redact_url, run_git

__all__ = [
    "BUNDLE_REF",
    "PushResult",
    "check_branch",
    "check_remote",
    "push_bundle",
    "reachable_remote",
]

#: The refs a sandbox's bundle carries its commit under (made and deleted by the tool).
BUNDLE_REF = "refs/dh-push/"
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_URL_SECRET = re.compile(r"(?<=://)[^/@\s']+@")
#: The bundle is a file the harness wrote, and a local-path remote is the operator's: git
#: refuses the file transport to calls that did not come from a user unless allowed.
_FILE_OK = {"protocol.file.allow": "always"}
#: Advice off: its hints would push the reason out of the last lines of stderr.
_QUIET_PUSH = {
    **_FILE_OK,
    "advice.pushUpdateRejected": "false",
    "advice.pushNonFFCurrent": "false",
    "advice.pushNonFFMatching": "false",
    "advice.pushFetchFirst": "false",
}
_FSCK = {**_FILE_OK, "transfer.fsckObjects": "true"}


def _config_env(values: dict[str, str]) -> dict[str, str]:
    """``values`` as git's GIT_CONFIG_* variables (so a failure names the subcommand)."""
    env = {"GIT_CONFIG_COUNT": str(len(values))}
    for n, (key, value) in enumerate(values.items()):
        env[f"GIT_CONFIG_KEY_{n}"] = key
        env[f"GIT_CONFIG_VALUE_{n}"] = value
    return env


@dataclass(frozen=True)
class PushResult:
    sha: str
    branch: str
    already: bool  # the branch was at ``sha`` already: nothing was pushed

    def message(self) -> str:
        if self.already:
            return f"already pushed {self.sha} to {self.branch} (nothing to do)"
        return f"pushed {self.sha} to {self.branch}"


def check_remote(url: str) -> str:
    """``url`` if it can be stored with a turn: not empty, no credentials in it, not an
    option, not git's ``ext::`` transport. A local path is made absolute (a worker in
    another folder reads the same turn). ConfigError otherwise."""
    url = url.strip()
    if not url or url.startswith("-"):
        raise ConfigError(f"push remote {url!r} is not a git URL or path")
    if url.startswith("ext::"):
        raise ConfigError("push remote: the ext:: transport runs a command; give a URL or path")
    if redact_url(url) != url:
        raise ConfigError(
            f"push remote {redact_url(url)!r} carries credentials in its URL, which would be "
            "stored with the turn: give the URL without them and let the worker's git find "
            "them (a credential helper, `git config url.<authenticated URL>.insteadOf "
            "<URL>`, or GIT_ASKPASS / SSH_AUTH_SOCK in the worker's environment)"
        )
    if "://" not in url and not re.match(r"^[\w.-]+@?[\w.-]*:", url) and Path(url).exists():
        return str(Path(url).resolve())
    return url


def reachable_remote(url: str, timeout: float = 60.0) -> str:
    """:func:`check_remote`, then ``git ls-remote`` with the worker's credentials:
    RepositoryError (one line) when the remote does not exist or refuses us."""
    url = check_remote(url)
    try:
        run_git(
            ["ls-remote", "--heads", "--", url],
            user_config=True,
            timeout=timeout,
            env=_config_env(_FILE_OK),
            error_lines=8,
        )
    except RepositoryError as exc:
        lines = str(exc).removeprefix("git ls-remote: ").splitlines()
        why = next((ln for ln in lines if ln.startswith("fatal:")), lines[0])
        raise RepositoryError(
            f"push remote {url!r} cannot be read ({_URL_SECRET.sub('', why)}): check the "
            "URL and the worker's credentials for it"
        ) from None
    return url


def check_branch(branch: str) -> str:
    """``branch`` if git accepts it as a branch name (``git check-ref-format --branch``);
    RepositoryError saying so otherwise."""
    if not branch or branch.startswith("-") or branch.startswith("refs/"):
        raise RepositoryError(f"{branch!r} is not a branch name: give one like 'fix/ci'")
    try:
        run_git(["check-ref-format", "--branch", branch], timeout=30)
    except RepositoryError:
        raise RepositoryError(
            f"{branch!r} is not a valid branch name (git check-ref-format --branch): "
            "give one like 'fix/ci'"
        ) from None
    return branch


def remote_sha(remote: str, branch: str, timeout: float) -> str | None:
    """Where ``branch`` is on ``remote`` now (None: no such branch)."""
    out = run_git(
        ["ls-remote", "--", remote, f"refs/heads/{branch}"],
        user_config=True,
        timeout=timeout,
        env=_config_env(_FILE_OK),
    )
    for line in out.decode("utf-8", "replace").splitlines():
        sha, _, ref = line.partition("\t")
        if ref == f"refs/heads/{branch}":
            return sha
    return None


def push_bundle(
    bundle: bytes,
    ref: str,
    remote: str,
    branch: str,
    timeout: float = 300.0,
    before_push: Callable[[str], None] | None = None,
) -> PushResult:
    """Push the commit that ``bundle``'s ``ref`` (under :data:`BUNDLE_REF`) names to
    ``refs/heads/BRANCH``
    of ``remote`` (see the module docstring). RepositoryError for a bad bundle, a remote
    that cannot be reached, or a rejected push (its reason from git, credentials
    redacted). ``before_push(sha)`` is called once the commit is known and before the
    remote is asked or changed (also when it turns out to be pushed already)."""
    check_branch(branch)
    remote = check_remote(remote)
    if not ref.startswith(BUNDLE_REF) or not ref[len(BUNDLE_REF) :].isalnum():
        raise RepositoryError(f"bundle ref {ref!r} is not one git_push makes")
    with tempfile.TemporaryDirectory(prefix="dh-push-") as tmp:
        repo = Path(tmp) / "push.git"
        run_git(["init", "--bare", "--quiet", str(repo)], timeout=timeout)
        if not bundle.startswith((b"# v2 git bundle\n", b"# v3 git bundle\n")):
            # Else git takes the file for a repository (a "gitdir:" line in it would
            # make the host fetch from any repository on it).
            raise RepositoryError("the sandbox's bundle is not a git bundle")
        path = Path(tmp) / "commits.bundle"
        path.write_bytes(bundle)
        try:
            run_git(
                ["fetch", "--no-tags", "--quiet", "--", str(path), f"{ref}:refs/heads/push"],
                cwd=repo,
                timeout=timeout,
                env=_config_env(_FSCK),
            )
            sha = run_git(["rev-parse", "--verify", "refs/heads/push^{commit}"], cwd=repo)
            # A fetch from a bundle skips transfer.fsckObjects: check what came in, so a
            # tree git refuses (a .git/config in it, a bad .gitmodules) is never pushed.
            run_git(
                ["fsck", "--strict", "--no-dangling", "--no-progress"],
                cwd=repo,
                timeout=timeout,
                error_lines=4,
            )
        except RepositoryError as exc:
            raise RepositoryError(f"the sandbox's bundle could not be read: {exc}") from None
        sha_text = sha.decode().strip()
        if not _SHA.fullmatch(sha_text):
            raise RepositoryError(f"the sandbox's bundle names no commit ({sha_text[:80]!r})")
        if before_push is not None:
            before_push(sha_text)
        if remote_sha(remote, branch, timeout) == sha_text:
            return PushResult(sha_text, branch, already=True)
        try:
            run_git(
                ["push", "--quiet", "--", remote, f"{sha_text}:refs/heads/{branch}"],
                cwd=repo,
                user_config=True,
                timeout=timeout,
                error_lines=12,
                env=_config_env(_QUIET_PUSH),
            )
        except RepositoryError as exc:
            raise RepositoryError(
                f"the push of {sha_text} to {branch} was rejected: {_reason(str(exc))} "
                "(pushes are never forced: build on the remote branch, or push to another)"
            ) from None
        return PushResult(sha_text, branch, already=False)


def _reason(message: str) -> str:
    """What git said about a failed push: the remote's own lines and the rejected ref,
    any credentials in a URL taken out."""
    lines = [ln for ln in message.removeprefix("git push: ").splitlines() if ln.strip()]
    useful = [ln for ln in lines if ln.startswith("remote:") or "rejected" in ln]
    return _URL_SECRET.sub("", "; ".join(useful or lines[-1:]))
