"""``diff`` / ``apply`` / ``export`` (issue 14, item 3) through the real CLI, from the World
alone: a real repository and its clone (the seed), the agent's work (a commit, then
uncommitted edits, a new executable, a changed link, an empty folder) saved as workspace
snapshots in DONE steps, a malicious ``.git`` in the agent's snapshot, and the user's
repository with work of its own in progress that ``apply`` must not touch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import services_s3

from durable_harness.core.sandbox import SandboxState
from durable_harness.core.seed import Seed, load_seed, save_seed
from durable_harness.core.tree import read_tree
from durable_harness.core.types import Step, StepStatus
from durable_harness.core.world import World
from durable_harness.harness.workspace import SnapshotStore
from durable_harness.repo.changes import build_work
from durable_harness.runtime.changes import newest_snapshot
from durable_harness.worlds import open_world

if TYPE_CHECKING:
    from postgres_server import PostgresServer

CLI = str(Path(sys.executable).with_name("durable-harness"))
SESSION = "sess1"


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> str:
    home = cwd.parent / "git-home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "user",
        "GIT_AUTHOR_EMAIL": "user@example.invalid",
        "GIT_COMMITTER_NAME": "user",
        "GIT_COMMITTER_EMAIL": "user@example.invalid",
    }
    done = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        check=True,
    )
    return done.stdout.decode()


def work_tree(folder: Path) -> SandboxState:
    return read_tree(folder, skip=(".git",))


def same_files(a: SandboxState, b: SandboxState) -> None:
    """Equal as git keeps them: contents, executable bits, links (no empty folders)."""
    assert a.files == b.files
    assert a.executable == b.executable
    assert a.links == b.links


@dataclass
class Scene:
    tmp: Path
    world: World
    world_args: list[str]
    origin: Path  # the user's repository
    seed: str
    expected: SandboxState  # the agent's final work tree
    marker: Path

    def cli(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [CLI, *args, *self.world_args],
            cwd=cwd or self.tmp,
            capture_output=True,
            timeout=120,
            check=False,
        )


def record_snapshot(world: World, session: str, turn: str, digest: str | None) -> None:
    """One DONE turn of ``session`` whose DONE tool step saved workspace ``digest``."""
    world.create_session(session)
    world.create_turn(session, turn, "fix the bug", {})
    lease = world.claim("w1", 30)
    assert lease is not None and lease.turn_id == turn
    world.insert_intent(
        Step(
            turn_id=turn,
            seq=1,
            key="tool:1:a",
            kind="tool",
            name="bash",
            input_hash="h",
            epoch=lease.epoch,
        )
    )
    meta = {} if digest is None else {"workspace": digest}
    world.finish_step(turn, 1, lease.epoch, StepStatus.DONE, '"ok"', None, meta)
    world.complete_turn(lease, "done")


def build_scene(tmp: Path, world: World, world_args: list[str]) -> Scene:
    marker = tmp / "HOOK-RAN"
    origin = tmp / "origin"
    origin.mkdir()
    (origin / "app.py").write_text("def price():\n    return 40\n")
    git(origin, "init", "-q")
    git(origin, "add", "-A")
    git(origin, "commit", "-qm", "before the seed")
    (origin / "app.py").write_text("def price():\n    return 41\n")
    (origin / "run.sh").write_text("#!/bin/sh\necho run\n")
    (origin / "run.sh").chmod(0o755)
    (origin / "README.md").write_text("# demo\n")
    (origin / "logo.bin").write_bytes(bytes(range(256)))
    os.symlink("app.py", origin / "current")
    git(origin, "add", "-A")
    git(origin, "commit", "-qm", "start")
    seed = git(origin, "rev-parse", "HEAD").strip()

    # The seed: a clone as run --repo makes it, here shallow (objects in a pack, the
    # commit before the seed missing).
    clone = tmp / "clone"
    git(tmp, "clone", "-q", "--depth=1", f"file://{origin}", str(clone))
    assert (clone / ".git" / "shallow").exists()
    store = SnapshotStore(world)
    world.create_session(SESSION)
    save_seed(
        world,
        world,
        SESSION,
        Seed(repo=str(origin), commit=seed, snapshot=store.save(read_tree(clone))),
    )

    # The agent's work: a commit (a loose object), snapshotted in turn 1 ...
    work = tmp / "work"
    shutil.copytree(clone, work, symlinks=True)
    (work / "app.py").write_text("def price():\n    return 42\n")
    git(work, "commit", "-qam", "fix the price")
    record_snapshot(world, SESSION, "t1", store.save(read_tree(work)))
    # ... then uncommitted work, snapshotted in turn 2 (the newest).
    (work / "README.md").write_text("# demo\n\nPrices are right now.\n")
    (work / "tools").mkdir()
    (work / "tools" / "check.sh").write_text("#!/bin/sh\nexit 0\n")
    (work / "tools" / "check.sh").chmod(0o755)
    (work / "current").unlink()
    os.symlink("README.md", work / "current")
    (work / "logo.bin").write_bytes(bytes(range(255, -1, -1)))
    (work / "logs").mkdir()
    (work / "docs").mkdir()
    (work / "docs" / 'price "list" \\ 2.txt').write_text("a name to quote\n")
    # A .git written to run things on whoever uses it: an fsmonitor, a hooks folder,
    # hooks of its own, an alternates file pointing at the user's repository.
    evil = tmp / "evil.sh"
    evil.write_text(f"#!/bin/sh\necho ran >> {marker}\n")
    evil.chmod(0o755)
    hooks = tmp / "evil-hooks"
    hooks.mkdir()
    with (work / ".git" / "config").open("a") as config:
        config.write(f"[core]\n\tfsmonitor = {evil}\n\thooksPath = {hooks}\n")
    for hook in ("post-checkout", "reference-transaction", "pre-commit", "post-merge"):
        for folder in (hooks, work / ".git" / "hooks"):
            shutil.copy(evil, folder / hook)
    (work / ".git" / "objects" / "info" / "alternates").write_text(f"{origin}/.git/objects\n")
    expected = work_tree(work)
    record_snapshot(world, SESSION, "t2", store.save(read_tree(work)))
    return Scene(tmp, world, world_args, origin, seed, expected, marker)


@pytest.fixture
def local_scene(tmp_path: Path) -> Iterator[Scene]:
    data_dir = tmp_path / "world"
    with open_world("local", data_dir=str(data_dir)) as world:
        yield build_scene(tmp_path, world, ["--world", "local", "--data-dir", str(data_dir)])


@pytest.fixture(params=["local", "postgres", "s3sqs"])
def scene(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Scene]:
    if request.param == "local":
        yield request.getfixturevalue("local_scene")
        return
    if request.param == "s3sqs":  # a real S3 server (conditional writes) and SQS
        with services_s3.s3sqs_env(services_s3.seaweedfs().url, services_s3.moto().url) as opts:
            monkeypatch.setenv("DURABLE_HARNESS_S3_BUCKET", opts["bucket"])
            monkeypatch.setenv("DURABLE_HARNESS_SQS_QUEUE_URL", opts["queue_url"])
            with open_world("s3sqs", **opts) as world:
                yield build_scene(tmp_path, world, ["--world", "s3sqs"])
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    with server.database() as url, open_world("postgres", url=url) as world:
        yield build_scene(tmp_path, world, ["--world", url])


def fresh_clone(scene: Scene, name: str) -> Path:
    folder = scene.tmp / name
    git(scene.tmp, "clone", "-q", str(scene.origin), str(folder))
    return folder


def test_diff_patch_apply_export_take_the_work_out(scene: Scene) -> None:
    # diff: exactly the changed paths, and `git apply` of it gives the agent's tree.
    diff = scene.cli("diff", SESSION)
    assert diff.returncode == 0, diff.stderr
    numstat = git(scene.tmp, "apply", "--numstat", "-z", "-", stdin=diff.stdout)
    changed = {entry.split("\t")[-1] for entry in numstat.split("\0") if entry}
    assert changed == {
        "app.py",
        "README.md",
        "tools/check.sh",
        "current",
        "logo.bin",
        'docs/price "list" \\ 2.txt',
    }
    applied = fresh_clone(scene, "by-diff")
    git(applied, "apply", "--binary", "-", stdin=diff.stdout)
    same_files(work_tree(applied), scene.expected)

    # patch: `git am` gives the agent's commit and one for the uncommitted changes.
    patch = scene.cli("diff", SESSION, "--format", "patch")
    assert patch.returncode == 0, patch.stderr
    am = fresh_clone(scene, "by-am")
    git(am, "am", "-q", stdin=patch.stdout)
    subjects = git(am, "log", "--format=%s", f"{scene.seed}..HEAD").splitlines()
    assert subjects == ["Uncommitted changes of the agent's workspace", "fix the price"]
    same_files(work_tree(am), scene.expected)

    # apply: a new branch with the work; the user's branch, index and tree as they were.
    origin = scene.origin
    (origin / "app.py").write_text("def price():\n    return 40  # the user's own edit\n")
    (origin / "notes.txt").write_text("staged by the user\n")
    git(origin, "add", "notes.txt")
    before = (
        git(origin, "status", "--porcelain=v1", "-uall"),
        git(origin, "symbolic-ref", "HEAD"),
        git(origin, "rev-parse", "HEAD"),
        hashlib.sha256((origin / ".git" / "index").read_bytes()).hexdigest(),
        work_tree(origin),
    )
    done = scene.cli("apply", SESSION, "--repo", str(origin))
    assert done.returncode == 0, done.stderr
    assert f"created branch dh/{SESSION}" in done.stdout.decode()
    after = (
        git(origin, "status", "--porcelain=v1", "-uall"),
        git(origin, "symbolic-ref", "HEAD"),
        git(origin, "rev-parse", "HEAD"),
        hashlib.sha256((origin / ".git" / "index").read_bytes()).hexdigest(),
        work_tree(origin),
    )
    assert after == before
    assert git(origin, "rev-list", "--count", f"{scene.seed}..dh/{SESSION}").strip() == "2"
    on_branch = fresh_clone(scene, "by-apply")
    git(on_branch, "checkout", "-q", f"origin/dh/{SESSION}")
    same_files(work_tree(on_branch), scene.expected)
    # The branch exists now: refused, saying how to pick another; from a subfolder of the
    # repository (the default --repo) with another name, it works.
    again = scene.cli("apply", SESSION, "--repo", str(origin))
    assert again.returncode == 2
    assert again.stderr.decode().count("\n") == 1
    assert b"already exists" in again.stderr and b"--branch" in again.stderr
    (origin / "sub").mkdir()
    other = scene.cli("apply", "t2", "--branch", "review/fix", cwd=origin / "sub")
    assert other.returncode == 0, other.stderr
    assert git(origin, "rev-parse", "review/fix") == git(origin, "rev-parse", f"dh/{SESSION}")

    # export: the files with their modes, links and empty folders; no .git.
    out = scene.tmp / "exported"
    export = scene.cli("export", SESSION, str(out))
    assert export.returncode == 0, export.stderr
    exported = read_tree(out)
    same_files(exported, scene.expected)
    assert exported.dirs == scene.expected.dirs == {"logs"}
    assert not (out / ".git").exists()
    assert scene.cli("export", SESSION, str(out)).returncode == 2  # not empty now

    # Nothing of the agent's .git ran on the host, though it was armed: git run in the
    # agent's folder runs its fsmonitor.
    assert not scene.marker.exists()
    git(scene.tmp / "work", "status")
    assert scene.marker.exists()


def test_bad_input_is_one_line(local_scene: Scene) -> None:
    scene = local_scene
    (scene.tmp / "tools").mkdir()
    unrelated = scene.tmp / "unrelated"
    unrelated.mkdir()
    (unrelated / "x").write_text("x\n")
    git(unrelated, "init", "-q")
    git(unrelated, "add", "x")
    git(unrelated, "commit", "-qm", "other")
    world = scene.world
    record_snapshot(world, "plain", "p1", None)  # no seed: not started with --repo
    world.create_session("broken")
    save_seed(world, world, "broken", Seed(repo="r", commit=scene.seed, snapshot="0" * 64))
    cases = {
        ("apply", SESSION, "--repo", str(unrelated)): "is not the seed's repository",
        ("apply", SESSION, "--repo", str(scene.tmp / "tools")): "is not inside a git repository",
        ("apply", SESSION, "--repo", str(scene.origin), "--branch", "a..b"): "not a valid branch",
        ("diff", "nosuch"): "no session 'nosuch'",
        ("diff", "plain"): "was not started with --repo",
        ("apply", "plain", "--repo", str(scene.origin)): "was not started with --repo",
        ("export", "plain", str(scene.tmp / "e1")): "has no workspace snapshot",
        ("diff", "broken"): "is missing or damaged",
        ("export", "broken", str(scene.tmp / "e2")): "is missing or damaged",
    }
    for args, message in cases.items():
        done = scene.cli(*args)
        err = done.stderr.decode()
        assert done.returncode == 2 and err.count("\n") == 1 and message in err, (args, err)
    assert git(unrelated, "branch", "--list") == "* main\n"


def test_the_agents_git_cannot_mislead(tmp_path: Path) -> None:
    """A loose object whose bytes are not what its name says is never copied. Here the
    agent's snapshot holds, under the id of its fixed ``app.py``, other bytes: taken, they
    would be what the diff and the branch show (git does not check a blob it reads, and
    the tree would name that id), while the workspace and ``export`` hold the real file.
    And a HEAD off the seed's line is no patch series: one commit of the whole change."""
    with open_world("local", data_dir=str(tmp_path / "world")) as world:
        scene = build_scene(tmp_path, world, [])
        store = SnapshotStore(world)
        seed_record = load_seed(world, world, SESSION)
        assert seed_record is not None
        seed = store.load(seed_record.snapshot)
        final = store.load(newest_snapshot(world, SESSION) or "")
    blob = git(tmp_path / "work", "rev-parse", "HEAD:app.py").strip()
    lie = b"def price():\n    return 666\n"
    forged = dict(final.files)
    forged[f".git/objects/{blob[:2]}/{blob[2:]}"] = zlib.compress(b"blob %d\0" % len(lie) + lie)
    work = build_work(tmp_path, scene.seed, seed, dataclasses.replace(final, files=forged))
    diff = work.diff()
    assert b"+    return 42" in diff and b"666" not in diff
    checkout = fresh_clone(scene, "forged")
    git(checkout, "am", "-q", stdin=work.patch())
    same_files(work_tree(checkout), scene.expected)

    # A commit that writes into a .git (made with plumbing: git refuses such a path) is
    # not handed on: the work is one commit, over the seed, of the tree without it.
    agent = tmp_path / "work"
    unarmed = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
    blob = git(agent, "hash-object", "-w", "--stdin", stdin=b"[core]\n\tfsmonitor = x\n")
    inner = git(agent, "mktree", stdin=f"100644 blob {blob.strip()}\tconfig\n".encode())
    entries = git(agent, "ls-tree", "HEAD") + f"040000 tree {inner.strip()}\t.GIT\n"
    tree = git(agent, "mktree", stdin=entries.encode()).strip()
    dotgit = git(agent, "commit-tree", tree, "-p", "HEAD", "-m", "into .git").strip()
    git(agent, "update-ref", "HEAD", dotgit)
    (tmp_path / "dotgit").mkdir()
    refused = build_work(tmp_path / "dotgit", scene.seed, seed, read_tree(agent))
    assert refused.git("rev-parse", f"{refused.final}^").decode().strip() == scene.seed
    assert b".GIT" not in refused.patch() and b".GIT" not in refused.diff()

    # A HEAD that does not descend from the seed (history rewritten, here an orphan
    # commit): the patch is one commit of the whole change over the seed.
    git(agent, *unarmed, "checkout", "-q", "--orphan", "rewritten")
    git(agent, *unarmed, "commit", "-qm", "orphan")
    (tmp_path / "rewritten").mkdir()
    rewritten = build_work(tmp_path / "rewritten", scene.seed, seed, read_tree(agent))
    assert rewritten.synthesized
    assert rewritten.git("rev-parse", f"{rewritten.final}^").decode().strip() == scene.seed
    checkout = fresh_clone(scene, "rewritten-am")
    git(checkout, "am", "-q", stdin=rewritten.patch())
    assert git(checkout, "rev-list", "--count", f"{scene.seed}..HEAD").strip() == "1"
    same_files(work_tree(checkout), scene.expected)
