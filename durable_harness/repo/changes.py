"""The agent's work as git sees it: a commit over the seed, built from snapshots alone.

A workspace snapshot's ``.git`` was written by the agent, so host git never runs in it
(its config could name an fsmonitor or hooks, its ``objects/info/alternates`` a host
folder). Instead :func:`build_work` makes a bare repository of the harness's own in a
temporary folder and takes from the snapshots only what is data:

* loose objects, each checked against its name (the SHA-1 or SHA-256 of its inflated
  bytes, hashed as they stream so a zlib bomb costs no memory): a forged object, say one
  posing as the seed commit, is left out;
* packs, given to ``git index-pack`` (which computes every object id itself, as a fetch
  from an untrusted remote does); the snapshot's ``.idx`` files are not used;
* ``HEAD`` and the ref it names, read as text and accepted only as hex object ids;
* the seed snapshot's ``shallow`` (a shallow clone's cut), as object ids.

Objects come from the seed's snapshot (made by the harness from the user's clone) and
then the newest one, so the seed commit is there even if the agent removed it. The final
working tree (every file but any ``.git``, with its mode: 100644, 100755, or 120000 for a
link) is written by ``git fast-import`` as a commit whose parent is the agent's ``HEAD``
when that descends from the seed along a line of ordinary commits none of which writes
into a ``.git``, else the seed; when its tree equals ``HEAD``'s the agent's own commit is
the final one. Git keeps no empty folders, so those are only in ``export``.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from durable_harness.core.errors import RepositoryError
from durable_harness.core.sandbox import SandboxState
from durable_harness.repo.git import run_git

__all__ = ["Work", "apply_work", "build_work", "work_files"]

#: The identity of the commit made for uncommitted work (the agent's commits keep theirs).
_IDENTITY = "durable-harness <durable-harness@localhost>"
_LOOSE = re.compile(r"\.git/objects/([0-9a-f]{2})/([0-9a-f]{38}|[0-9a-f]{62})")
_PACK = re.compile(r"\.git/objects/pack/pack-[0-9a-f]+\.pack")
_CHUNK = 1 << 16


@dataclass(frozen=True)
class Work:
    """The agent's work in the harness's own repository ``git_dir``."""

    git_dir: Path
    seed: str
    #: The commit holding the final tree: the agent's ``HEAD``, or one made over it (or
    #: over the seed) for the uncommitted changes.
    final: str
    #: Whether ``final`` was made by the harness for uncommitted changes.
    synthesized: bool

    def git(self, *args: str, stdin: bytes | None = None) -> bytes:
        return run_git(args, cwd=self.git_dir, stdin=stdin, env={"GIT_DIR": str(self.git_dir)})

    def diff(self) -> bytes:
        """A unified diff (binary hunks included, so ``git apply`` takes it) from the seed
        commit to the final tree: committed and uncommitted work alike."""
        return self.git("diff", "--binary", "--no-color", "--no-ext-diff", self.seed, self.final)

    def patch(self) -> bytes:
        """The commits from the seed to ``final`` as ``git format-patch --stdout`` (an
        mbox for ``git am``)."""
        return self.git(
            "format-patch", "--stdout", "--binary", "--no-color", f"{self.seed}..{self.final}"
        )


def work_files(state: SandboxState) -> SandboxState:
    """``state`` without any ``.git`` (at the top or below it, in any case): what the agent
    wrote as its work, never a repository's config or hooks."""

    return SandboxState(
        files={p: d for p, d in state.files.items() if _kept(p)},
        cwd="",
        executable=frozenset(p for p in state.executable if _kept(p)),
        links={p: t for p, t in state.links.items() if _kept(p)},
        dirs=frozenset(p for p in state.dirs if _kept(p)),
    )


def _kept(path: str) -> bool:
    return ".git" not in path.strip().lower().split("/")


def build_work(folder: Path, seed_commit: str, seed: SandboxState, final: SandboxState) -> Work:
    """The work of ``final`` over ``seed_commit`` in a new bare repository under
    ``folder`` (see the module docstring). :class:`RepositoryError` if the snapshots do
    not hold the seed commit."""
    if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", seed_commit):
        raise RepositoryError(f"the seed commit {seed_commit!r} is not an object id")
    git_dir = folder / "work.git"
    object_format = "sha1" if len(seed_commit) == 40 else "sha256"
    run_git(
        ["init", "--quiet", "--bare", f"--object-format={object_format}", str(git_dir)], cwd=folder
    )
    work = Work(git_dir, seed_commit, seed_commit, False)
    for state in (seed, final):
        _copy_objects(work, state, object_format)
    # A shallow seed clone's cut: without it git would look for the seed's parents and
    # fail. Taken from the seed's snapshot (the harness's clone), as plain object ids.
    cut = seed.files.get(".git/shallow", b"").decode("ascii", "replace").split()
    if cut:
        oid = re.compile(f"[0-9a-f]{{{len(seed_commit)}}}")
        (git_dir / "shallow").write_text("".join(f"{c}\n" for c in cut if oid.fullmatch(c)))
    if not _is_commit(work, seed_commit):
        raise RepositoryError(
            f"the session's snapshots hold no commit {seed_commit[:12]} (the seed): its "
            "workspace's .git is damaged; `durable-harness export` still writes the files"
        )
    head = _head(final, len(seed_commit))
    parent = head if head is not None and _descends_linearly(work, seed_commit, head) else None
    base = parent or seed_commit
    commit = _commit_tree(work, work_files(final), base)
    if _tree(work, commit) == _tree(work, base):
        # Nothing uncommitted: the final commit is the agent's own (or the seed itself).
        work.git("update-ref", "refs/heads/final", base)
        return Work(git_dir, seed_commit, base, False)
    return Work(git_dir, seed_commit, commit, True)


def apply_work(work: Work, repo: Path, branch: str, reason: str) -> None:
    """Create ``branch`` at ``work.final`` in the user's repository ``repo``, without a
    checkout: its current branch, index and working tree are not touched. Refuses a
    repository without the seed commit and a branch that exists."""

    def user_git(*args: str) -> bytes:
        return run_git(list(args), cwd=repo)

    try:
        user_git("rev-parse", "--verify", "--quiet", f"{work.seed}^{{commit}}")
    except RepositoryError:
        raise RepositoryError(
            f"{repo} is not the seed's repository: it has no commit {work.seed[:12]}; give "
            "--repo PATH of a clone of the repository the session started from"
        ) from None
    ref = f"refs/heads/{branch}"
    try:
        user_git("check-ref-format", ref)
    except RepositoryError:
        raise RepositoryError(
            f"{branch!r} is not a valid branch name; pick another with --branch NAME"
        ) from None
    if _resolves(user_git, ref):
        raise RepositoryError(
            f"branch {branch} already exists in {repo}; pick another with --branch NAME "
            f"(or delete it first: git branch -D {branch})"
        )
    # The fetch adds objects only (no ref, no FETCH_HEAD), from the harness's repository
    # by path: GIT_PROTOCOL_FROM_USER=0 refuses the file transport, which this allows and
    # nothing else. update-ref then creates the branch with the all-zero old value, so it
    # fails rather than move a branch made meanwhile.
    # fsckObjects: the objects are the agent's, checked as those of an untrusted remote.
    fsck = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "fetch.fsckObjects"}
    run_git(
        [
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
            str(work.git_dir),
            "refs/heads/final",
        ],
        cwd=repo,
        env={"GIT_ALLOW_PROTOCOL": "file", **fsck, "GIT_CONFIG_VALUE_0": "true"},
    )
    user_git("update-ref", "-m", reason, ref, work.final, "0" * len(work.final))


def _resolves(git: Callable[..., bytes], name: str) -> bool:
    try:
        git("rev-parse", "--verify", "--quiet", name)
    except RepositoryError:
        return False
    return True


def _is_commit(work: Work, oid: str) -> bool:
    return _resolves(work.git, f"{oid}^{{commit}}")


def _tree(work: Work, commit: str) -> str:
    return work.git("rev-parse", f"{commit}^{{tree}}").decode().strip()


def _copy_objects(work: Work, state: SandboxState, object_format: str) -> None:
    """Take the loose objects (checked) and packs (indexed by git) of ``state``'s ``.git``."""
    objects = work.git_dir / "objects"
    for path, data in sorted(state.files.items()):
        loose = _LOOSE.fullmatch(path)
        if loose is not None:
            oid = loose[1] + loose[2]
            target = objects / loose[1] / loose[2]
            fits = len(oid) == (40 if object_format == "sha1" else 64)
            if fits and not target.exists() and _loose_object_id(data, object_format) == oid:
                target.parent.mkdir(exist_ok=True)
                target.write_bytes(data)
        elif _PACK.fullmatch(path):
            # A damaged pack is left out: a commit it should have held is reported missing.
            with contextlib.suppress(RepositoryError):
                work.git("index-pack", "--stdin", stdin=data)


def _loose_object_id(data: bytes, object_format: str) -> str | None:
    """The id of a loose object's inflated bytes, or None if they do not inflate."""
    digest = hashlib.new(object_format)
    inflater = zlib.decompressobj()
    try:
        chunk = inflater.decompress(data, _CHUNK)
        while chunk:
            digest.update(chunk)
            chunk = inflater.decompress(inflater.unconsumed_tail, _CHUNK)
    except zlib.error:
        return None
    return digest.hexdigest() if inflater.eof else None


def _head(state: SandboxState, length: int) -> str | None:
    """The commit the snapshot's ``HEAD`` names (through at most a few symbolic refs, from
    loose ref files or ``packed-refs``), or None when it names nothing readable."""
    oid = re.compile(f"[0-9a-f]{{{length}}}")
    packed: dict[str, str] = {}
    for line in state.files.get(".git/packed-refs", b"").decode("utf-8", "replace").splitlines():
        value, _, name = line.partition(" ")
        if oid.fullmatch(value):
            packed[name.strip()] = value
    name = "HEAD"
    for _ in range(5):
        text = state.files.get(f".git/{name}", b"").decode("utf-8", "replace").strip()
        if not text and name in packed:
            return packed[name]
        if oid.fullmatch(text):
            return text
        if not text.startswith("ref: refs/"):
            return None
        name = text[len("ref: ") :].strip()
        if ".." in name.split("/") or "//" in name:
            return None
    return None


def _descends_linearly(work: Work, seed: str, head: str) -> bool:
    """Whether ``head`` is a commit over ``seed`` with no merge between: then its commits
    are the patch series (format-patch leaves merges out, so a merge is not)."""
    if not _is_commit(work, head):
        return False
    try:
        base = work.git("merge-base", seed, head).decode().strip()
        merges = work.git("rev-list", "--merges", f"{seed}..{head}").strip()
        touched = work.git("log", "--format=", "--name-only", "-z", f"{seed}..{head}")
    except RepositoryError:
        return False
    # A commit that writes into a .git (git's own checks refuse one, `patch` would not)
    # is not handed on: the work is then one commit of the tree built without it.
    return (
        base == seed
        and not merges
        and not any(
            not _kept(path) for path in touched.decode("utf-8", "surrogateescape").split("\0")
        )
    )


def _commit_tree(work: Work, state: SandboxState, parent: str) -> str:
    """A commit over ``parent`` whose tree is exactly ``state`` (written by fast-import,
    which takes every path and mode from its input); also ``refs/heads/final``."""
    when = work.git("show", "-s", "--format=%ct", parent).decode().strip()
    message = b"Uncommitted changes of the agent's workspace\n"
    parts = [
        b"commit refs/heads/final\n",
        f"committer {_IDENTITY} {when} +0000\n".encode(),
        b"data %d\n" % len(message),
        message,
        f"from {parent}\n".encode(),
        b"deleteall\n",
    ]
    entries: list[tuple[str, str, bytes]] = [
        (p, "100755" if p in state.executable else "100644", d) for p, d in state.files.items()
    ]
    entries += [(p, "120000", t.encode("utf-8", "surrogateescape")) for p, t in state.links.items()]
    for path, mode, data in sorted(entries):
        parts += [
            f"M {mode} inline {_quoted(path)}\n".encode("utf-8", "surrogateescape"),
            b"data %d\n" % len(data),
            data,
            b"\n",
        ]
    parts.append(b"done\n")
    work.git("fast-import", "--quiet", "--done", stdin=b"".join(parts))
    return work.git("rev-parse", "refs/heads/final").decode().strip()


def _quoted(path: str) -> str:
    """``path`` C-quoted, as fast-import reads a path that may hold any character."""
    out = []
    for char in path:
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\{ord(char):03o}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
