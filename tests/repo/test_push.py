"""repo/push.py on real git, no sandbox: what a hostile bundle or branch name gets.

The end-to-end pushes (Docker, the agents, crashes) are tests/runtime/test_git_push.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from durable_harness.core.errors import ConfigError, RepositoryError
from durable_harness.repo.push import BUNDLE_REF, check_remote, push_bundle, reachable_remote

REF = BUNDLE_REF + "abc123"


def _git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _bundle(tmp: Path, ref: str = REF) -> tuple[bytes, str]:
    work = tmp / "work"
    _git("init", "-q", str(work))
    _git("-c", "user.name=a", "-c", "user.email=a@a", "commit", "-q", "--allow-empty",
         "-m", "one", cwd=work)  # fmt: skip
    sha = _git("rev-parse", "HEAD", cwd=work)
    _git("update-ref", ref, sha, cwd=work)
    _git("bundle", "create", "-q", str(tmp / "b.bundle"), ref, cwd=work)
    return (tmp / "b.bundle").read_bytes(), sha


def test_untrusted_bundles_and_names_are_refused_before_any_push(tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    _git("init", "-q", "--bare", str(remote))
    bundle, sha = _bundle(tmp_path)
    for data, ref, says in [
        (b"# v2 git bundle\nnot a bundle", REF, "bundle could not be read"),
        (bundle[: len(bundle) // 2], REF, "bundle could not be read"),
        (bundle, BUNDLE_REF + "other", "bundle could not be read"),  # not the ref it holds
        (bundle, "refs/heads/main", "not one git_push makes"),
    ]:
        with pytest.raises(RepositoryError, match=says):
            push_bundle(data, ref, str(remote), "feature")
    for branch in ["-f", "a..b", "refs/heads/x", "has space", ""]:
        with pytest.raises(RepositoryError, match="branch name"):
            push_bundle(bundle, REF, str(remote), branch)
    # Not a bundle: a "gitdir:" file would make git fetch from another host repository.
    with pytest.raises(RepositoryError, match="is not a git bundle"):
        push_bundle(f"gitdir: {remote}\n".encode(), REF, str(remote), "feature")
    # A commit whose tree holds .git/config: fetched from a bundle, git checks nothing,
    # so the harness runs fsck itself and never pushes it.
    evil = tmp_path / "evil"
    _git("init", "-q", str(evil))
    blob = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"], cwd=evil, input="[core]\n", capture_output=True,
        text=True, check=True,
    ).stdout.strip()  # fmt: skip
    inner = subprocess.run(
        ["git", "mktree"], cwd=evil, input=f"100644 blob {blob}\tconfig\n",
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    top = subprocess.run(
        ["git", "mktree"], cwd=evil, input=f"040000 tree {inner}\t.git\n",
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    commit = _git("-c", "user.name=a", "-c", "user.email=a@a", "commit-tree", top, "-m", "x",
                  cwd=evil)  # fmt: skip
    _git("update-ref", REF, commit, cwd=evil)
    _git("bundle", "create", "-q", str(tmp_path / "evil.bundle"), REF, cwd=evil)
    with pytest.raises(RepositoryError, match="hasDotgit"):
        push_bundle((tmp_path / "evil.bundle").read_bytes(), REF, str(remote), "feature")
    assert _git("for-each-ref", cwd=remote) == ""  # nothing reached the remote
    assert push_bundle(bundle, REF, str(remote), "feature").message() == (
        f"pushed {sha} to feature"
    )
    assert push_bundle(bundle, REF, str(remote), "feature").already


def test_a_remote_holds_no_credentials_and_must_answer(tmp_path: Path) -> None:
    refused = [
        "https://tok@host.invalid/r.git",
        "https://u:p@host.invalid/r.git",
        "ssh://git:pw@host.invalid/r.git",
        "ext::sh -c touch% /tmp/x",
        "-uhack",
        "",
    ]
    for url in refused:
        with pytest.raises(ConfigError) as info:
            check_remote(url)
        assert "tok" not in str(info.value) and ":p@" not in str(info.value)
    assert check_remote("git@github.com:you/app.git") == "git@github.com:you/app.git"
    remote = tmp_path / "remote.git"
    _git("init", "-q", "--bare", str(remote))
    assert reachable_remote(f"{remote}/") == f"{remote}"  # a local path, made absolute
    with pytest.raises(RepositoryError, match="does not appear to be a git repository"):
        reachable_remote(str(tmp_path / "missing.git"))
