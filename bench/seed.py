"""Seeding a workspace from a repository, and restoring it elsewhere (issue 14's benchmark).

One run, on this machine, against a local World in a temp folder:

* **repository**: ``--files`` files of random bytes (``--mb`` in all) in nested folders,
  committed once (so ``.git`` holds about as much again, compressed: random bytes do not
  shrink);
* **seed**: what ``run --repo`` does before the turn is queued: ``prepare_seed`` (host
  clone, fresh ``.git/config``, the checkout read as a state) and ``record_seed`` (the
  snapshot's blobs and manifest, the seed record) into the World;
* **restore on another worker after a SIGKILL**: a child process is started to restore
  the seed and SIGKILLed once it has begun writing (the worker died); a new process
  (another worker, which has only the World) loads the snapshot from the World and
  writes it into an empty folder (``core/tree.py write_tree``: what a host folder gets);
* **beside it**: a plain ``git clone`` of the same repository plus ``cp -a`` of the
  checkout into an empty folder (the host-folder equivalent of ``git clone`` + ``docker
  cp``);
* **the same into Docker** (with ``--docker``, ``DOCKER_HOST`` pointing at a daemon that
  has the agent image): a child restoring the seed into the session's container is
  SIGKILLed mid-way, the container and its volumes are removed (the worker's machine is
  gone), and a new process restores it into a new container
  (``DockerSandbox.import_state``, container creation included); beside it, ``git
  clone`` plus ``docker cp`` of the checkout into a new container of the same image;
* **World bytes per turn**: ``--steps`` tool steps that each change one small file and
  snapshot the workspace, as a turn's steps do: the bytes the World grew by per step.

Run: ``python bench/seed.py [--files 5000] [--mb 100] [--steps 50] [--docker]``. The last
line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from durable_harness.core.sandbox import SandboxState
from durable_harness.core.seed import load_seed
from durable_harness.core.settings import Settings
from durable_harness.harness.workspace import SnapshotStore
from durable_harness.runtime.seed import prepare_seed, record_seed
from durable_harness.runtime.turns import turn_config
from durable_harness.worlds.local import LocalWorld

GIT = [
    "git",
    "-c",
    "user.name=bench",
    "-c",
    "user.email=bench@invalid",
    "-c",
    "core.hooksPath=/dev/null",
]


def make_repository(root: Path, files: int, total_bytes: int) -> None:
    root.mkdir(parents=True)
    subprocess.run([*GIT, "init", "-q", "-b", "main", str(root)], check=True)
    size = max(total_bytes // files, 1)
    for n in range(files):
        path = root / f"pkg{n % 50:02d}" / f"mod{n % 7}" / f"file{n:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-qm", "bench"], cwd=root, check=True)


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def restore_child(world_dir: Path, session: str, dest: Path, *, kill: bool = False) -> float:
    """Restore the session's seed into ``dest`` in a new process (a worker that has only
    the World); with ``kill``, SIGKILL it as soon as it has begun writing files."""
    code = (
        "import sys, time\n"
        "from durable_harness.core.seed import load_seed\n"
        "from durable_harness.core.tree import write_tree\n"
        "from durable_harness.harness.workspace import SnapshotStore\n"
        "from durable_harness.worlds.local import LocalWorld\n"
        "w = LocalWorld(sys.argv[1])\n"
        "t = time.perf_counter()\n"
        "seed = load_seed(w, w, sys.argv[2])\n"
        "write_tree(sys.argv[3], SnapshotStore(w).load(seed.snapshot))\n"
        "print(time.perf_counter() - t)\n"
    )
    args = [sys.executable, "-c", code, str(world_dir), session, str(dest)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    if kill:
        while proc.poll() is None and not (dest.exists() and any(dest.iterdir())):
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return float("nan")
    out, _ = proc.communicate(timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"restore failed ({proc.returncode})")
    return float(out.strip())


def docker_restore_child(world_dir: Path, session: str, *, kill: bool = False) -> float:
    """Restore the session's seed into its Docker container in a new process; with
    ``kill``, SIGKILL it once the container exists and the restore has begun."""
    code = (
        "import sys, time\n"
        "from durable_harness.core.seed import load_seed\n"
        "from durable_harness.harness.workspace import SnapshotStore\n"
        "from durable_harness.sandbox.docker import DockerSandbox\n"
        "from durable_harness.worlds.local import LocalWorld\n"
        "w = LocalWorld(sys.argv[1])\n"
        "t = time.perf_counter()\n"
        "seed = load_seed(w, w, sys.argv[2])\n"
        "box = DockerSandbox(sys.argv[2])\n"
        "box.container_id()\n"
        "print('started', flush=True)\n"
        "box.import_state(SnapshotStore(w).load(seed.snapshot))\n"
        "print(time.perf_counter() - t, flush=True)\n"
    )
    args = [sys.executable, "-c", code, str(world_dir), session]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if kill:
        proc.stdout.readline()  # the container is there; the restore is under way
        time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return float("nan")
    out, _ = proc.communicate(timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"docker restore failed ({proc.returncode})")
    return float(out.split()[-1])


def docker_figures(tmp: Path, repo: Path, session: str, figures: dict[str, float | int]) -> None:
    from durable_harness.sandbox.docker import DockerSandbox

    docker_restore_child(tmp / "world", session, kill=True)
    DockerSandbox(session).remove()  # the dead worker's machine, and its volume, are gone
    start = time.perf_counter()
    inner = docker_restore_child(tmp / "world", session)
    figures["docker_restore_after_sigkill_s"] = round(time.perf_counter() - start, 3)
    figures["docker_restore_inner_s"] = round(inner, 3)
    box = DockerSandbox(session)
    image = box.image
    box.remove()
    box.close()
    name = f"dh-bench-plain-{os.getpid()}"
    start = time.perf_counter()
    subprocess.run([*GIT, "clone", "-q", str(repo), str(tmp / "plain-docker")], check=True)
    subprocess.run(["docker", "create", "-q", "--name", name, "-v", f"{name}:/workspace",
                    image, "sleep", "infinity"], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    subprocess.run(["docker", "cp", "-q", f"{tmp / 'plain-docker'}/.", f"{name}:/workspace"],
                   check=True)  # fmt: skip
    figures["git_clone_plus_docker_cp_s"] = round(time.perf_counter() - start, 3)
    subprocess.run(["docker", "rm", "-f", "-v", name], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["docker", "volume", "rm", name], check=False, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--dir", help="where the temp folders go (default: the system's)")
    parser.add_argument(
        "--docker", action="store_true", help="also into a Docker container (DOCKER_HOST)"
    )
    args = parser.parse_args()
    figures: dict[str, float | int] = {"files": args.files, "mb": args.mb, "steps": args.steps}
    with tempfile.TemporaryDirectory(prefix="dh-bench-seed-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        repo = tmp / "repo"
        make_repository(repo, args.files, int(args.mb * 1024 * 1024))
        figures["repo_bytes_with_git"] = folder_bytes(repo)

        settings = Settings(max_files=10**7, max_bytes=10**12)
        config = turn_config(
            agent="builtin",
            workspace="docker",
            tools=[],
            model=None,
            base_url=None,
            settings=settings,
        )
        world = LocalWorld(str(tmp / "world"))
        session = "ses_bench"
        world.create_session(session, {"agent": "builtin"})
        start = time.perf_counter()
        prepared = prepare_seed(str(repo), config)
        figures["seed_prepare_s"] = round(time.perf_counter() - start, 3)
        record_seed(world, session, prepared)
        figures["seed_total_s"] = round(time.perf_counter() - start, 3)
        figures["world_bytes_after_seed"] = folder_bytes(tmp / "world")

        restore_child(tmp / "world", session, tmp / "killed", kill=True)
        shutil.rmtree(tmp / "killed", ignore_errors=True)
        start = time.perf_counter()
        inner = restore_child(tmp / "world", session, tmp / "restored")
        figures["restore_after_sigkill_s"] = round(time.perf_counter() - start, 3)
        figures["restore_inner_s"] = round(inner, 3)

        start = time.perf_counter()
        subprocess.run(
            [*GIT, "clone", "-q", "--no-hardlinks", str(repo), str(tmp / "plain")], check=True
        )
        subprocess.run(["cp", "-a", str(tmp / "plain"), str(tmp / "copied")], check=True)
        figures["git_clone_plus_cp_s"] = round(time.perf_counter() - start, 3)
        if args.docker:
            docker_figures(tmp, repo, session, figures)

        # A turn's steps: each changes one small file and snapshots the workspace.
        seed = load_seed(world, world, session)
        assert seed is not None
        store = SnapshotStore(world)
        state = store.load(seed.snapshot)
        before = folder_bytes(tmp / "world")
        for step in range(args.steps):
            files = {**state.files, "notes.md": f"step {step}\n".encode()}
            state = SandboxState(
                files=files,
                cwd=state.cwd,
                executable=state.executable,
                links=state.links,
                dirs=state.dirs,
            )
            store.save(state)
        grown = folder_bytes(tmp / "world") - before
        figures["world_bytes_per_step"] = grown // max(args.steps, 1)
        figures["world_bytes_per_turn"] = grown
        world.close()
    for name, value in figures.items():
        print(f"{name:>28}  {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
