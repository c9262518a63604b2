"""The user's repository cloned on the host, checked out, and cleaned for the sandbox.

:func:`clone_checkout` makes the checkout a session's workspace is seeded from. The clone
is the harness's own repository (``--template=`` empty: no hooks), so every command in it
runs with no config at all; only the clone itself and reading the user's folder
(:func:`find_repository`, :func:`uncommitted_paths`) reach the user's repository, with the
worker's git config (that is where the operator's credentials are).

The checkout's ``.git/config`` is then written afresh: clone never copies the source's
config (its ``http.extraheader``, credential helpers, ``url.*.insteadOf``), but it stores
the URL it cloned from, which may carry a token. The fresh config keeps the origin URL
with its credentials taken out (:func:`~.git.redact_url`) and nothing else of the worker.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from durable_harness.core.errors import RepositoryError
from durable_harness.repo.git import redact_url, run_git

__all__ = [
    "Checkout",
    "carry_over",
    "clone_checkout",
    "find_repository",
    "is_url",
    "uncommitted_paths",
]

#: ``user@host:path``: git's scp-like syntax for an SSH remote.
_SCP_LIKE = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:")


@dataclass(frozen=True)
class Checkout:
    """A clone made by :func:`clone_checkout`: ``commit`` the full id checked out,
    ``branch`` the local branch it is on (None: detached at a tag or a commit id)."""

    path: Path
    commit: str
    branch: str | None


def is_url(source: str) -> bool:
    """Whether ``source`` names a remote (a URL or ``user@host:path``), not a folder."""
    return "://" in source or bool(_SCP_LIKE.match(source))


def find_repository(folder: str | os.PathLike[str]) -> Path | None:
    """The top of the git work tree holding ``folder`` (itself or an ancestor with a
    ``.git``), or None. Found by looking, not by asking git: git would read the found
    repository's config before we know it is one."""
    here = Path(folder).resolve()
    for candidate in (here, *here.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def clone_checkout(source: str, dest: Path, ref: str | None) -> Checkout:
    """Clone ``source`` (a folder or URL) into the empty folder ``dest`` and check out
    ``ref`` (a branch, tag or commit id; None: the folder's current commit, or the
    remote's default branch). RepositoryError for a source that is not a repository and
    for an unknown ref; git's messages never show a credential (the URL is redacted)."""
    local = not is_url(source)
    shown = source if local else redact_url(source)
    branch: str | None = None
    if local:
        top = find_repository(source)
        if top is None:
            raise RepositoryError(f"{source} is not a git repository: give --repo PATH|URL")
        if ref is None:
            # The user's current commit and branch, not the remote HEAD clone would pick.
            head = "HEAD^{commit}"
            ref = _read(top, "rev-parse", "--verify", "--quiet", head, check=False, user=True)
            branch = (
                _read(top, "symbolic-ref", "--quiet", "--short", "HEAD", check=False, user=True)
                or None
            )
            if not ref:
                raise RepositoryError(f"{source} has no commit yet: commit first, then run")
        source = str(top)
    try:
        # A folder (or file:// URL) is cloned over git's "file" transport, which git
        # allows only when the user typed it (run_git says no one did, for the URLs a
        # repository names): this one the user typed, as --repo. No submodule is cloned.
        allow = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "protocol.file.allow"}
        run_git(
            ["clone", "--template=", "--no-checkout", "--quiet", "--", source, str(dest)],
            user_config=True,
            timeout=900,
            env={**allow, "GIT_CONFIG_VALUE_0": "always"},
        )
    except RepositoryError as exc:
        message = str(exc).replace(source, shown)
        raise RepositoryError(f"cannot clone {shown}: {message}") from None
    if ref is None:  # a URL: its default branch, which clone made the local one
        commit = _read(dest, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False)
        if not commit:
            raise RepositoryError(f"{shown} has no commit yet: push one, then run")
        branch = _read(dest, "symbolic-ref", "--quiet", "--short", "HEAD", check=False) or None
    else:
        commit, found_branch = _resolve(dest, ref)
        branch = branch or found_branch
    if branch is not None:
        _git(dest, "checkout", "--quiet", "-B", branch, commit)
    else:
        _git(dest, "checkout", "--quiet", "--detach", commit)
    _fresh_config(dest, shown, branch)
    return Checkout(dest, commit, branch)


def uncommitted_paths(top: Path) -> dict[str, bool]:
    """The user's uncommitted changes in the work tree ``top``: each path (relative,
    ``/``-separated) of a modified tracked file or an untracked, not ignored file, with
    False if it was deleted. Read without taking the index lock or writing anything."""
    out = run_git(
        ["status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames"],
        cwd=top,
        user_config=True,
        env={"GIT_OPTIONAL_LOCKS": "0"},
    ).decode("utf-8", "surrogateescape")
    changes: dict[str, bool] = {}
    for entry in out.split("\0"):
        if len(entry) < 4:
            continue
        status, path = entry[:2], entry[3:]
        changes[path.rstrip("/")] = "D" not in status
    return changes


def carry_over(top: Path, dest: Path, changes: dict[str, bool]) -> int:
    """Copy ``changes`` (see :func:`uncommitted_paths`) from the user's work tree ``top``
    over the checkout ``dest``: files with their executable bit, links as links (never
    followed). Returns how many paths were carried."""
    carried = 0
    for rel, present in sorted(changes.items()):
        source, target = top / rel, dest / rel
        if not _inside(top, source.parent) or not _inside(dest, target.parent):
            continue  # a path through a link: git never lists one, so skip it
        if target.is_symlink() or target.is_file():
            target.unlink()
        if present:
            try:
                info = source.lstat()
            except FileNotFoundError:
                continue  # gone since git status
            target.parent.mkdir(parents=True, exist_ok=True)
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(source), target)
            elif stat.S_ISREG(info.st_mode):
                fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as handle:
                    target.write_bytes(handle.read())
                target.chmod(0o755 if info.st_mode & stat.S_IXUSR else 0o644)
            else:
                continue
        carried += 1
    return carried


def _inside(root: Path, folder: Path) -> bool:
    return folder.resolve().is_relative_to(root.resolve())


def _resolve(dest: Path, ref: str) -> tuple[str, str | None]:
    """``ref``'s full commit id in the clone, and the branch name if ``ref`` is one."""
    if ref.startswith("-"):
        raise RepositoryError(f"unknown ref {ref!r}: give a branch, tag or commit id")
    for name, branch in ((f"refs/remotes/origin/{ref}", ref), (f"refs/tags/{ref}", None)):
        found = _read(dest, "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", check=False)
        if found:
            return found, branch
    found = _read(dest, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    if not found:
        raise RepositoryError(
            f"unknown ref {ref!r} in the repository: give one of its branches, tags or commits "
            "(`git branch -a`, `git tag`)"
        )
    return found, None


def _fresh_config(dest: Path, origin: str, branch: str | None) -> None:
    """Replace the clone's ``.git/config`` with one that holds nothing of the worker."""
    object_format = _read(dest, "rev-parse", "--show-object-format", check=False) or "sha1"
    lines = ["[core]", "\tbare = false", "\tfilemode = true", "\tlogallrefupdates = true"]
    if object_format == "sha1":
        lines.insert(1, "\trepositoryformatversion = 0")
    else:
        lines[1:1] = ["\trepositoryformatversion = 1"]
        lines += ["[extensions]", f"\tobjectformat = {object_format}"]
    quoted = origin.replace("\\", "\\\\").replace('"', '\\"')
    lines += [
        '[remote "origin"]',
        f'\turl = "{quoted}"',
        "\tfetch = +refs/heads/*:refs/remotes/origin/*",
    ]
    if branch is not None:
        lines += [f'[branch "{branch}"]', "\tremote = origin", f"\tmerge = refs/heads/{branch}"]
    (dest / ".git" / "config").write_text("\n".join(lines) + "\n")
    for leftover in ("FETCH_HEAD", "ORIG_HEAD"):
        (dest / ".git" / leftover).unlink(missing_ok=True)
    # The reflog's first line is "clone: from <URL>", the URL as given (token and all).
    shutil.rmtree(dest / ".git" / "logs", ignore_errors=True)


def _git(repo: Path, *args: str) -> bytes:
    return run_git(list(args), cwd=repo)


def _read(repo: Path, *args: str, check: bool = True, user: bool = False) -> str:
    """One line of git's output in ``repo`` (``user``: the user's, read with their
    config; else the harness's clone, with none); with ``check`` False an error is an
    empty answer."""
    try:
        return run_git(list(args), cwd=repo, user_config=user).decode().strip()
    except RepositoryError:
        if check:
            raise
        return ""
