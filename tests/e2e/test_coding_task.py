"""A real coding task, end to end (issue 14): the user's repository goes in, a pushed
branch comes out, CI is looped until green.

A small real Python project with two bugs (fixtures/buggy_project.py), a bare repository
on the host as the remote, whose ``post-receive`` hook is the CI (fixtures/git_ci.py:
a clone of the pushed commit, the real pytest, a signed GitHub ``workflow_run`` webhook
to a real signal-server). ``durable-harness run`` in the project's folder, the built-in
agent in Docker on a toolchain image with Python and pytest (fixtures/coding_task.toml).
The first CI result arrives before the agent waits (the hook runs inside the push). The
worker dies once right after the first push ran (before it was recorded), once at the
first wait, and is SIGKILLed while the turn is parked on the second wait; the session's
container is removed then, so the last delivery restores the workspace from the World.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from coding_task_support import BRANCH, TOKEN, coding_task_harness, host_git, stop, wait_until
from support import FIXTURES, Harness, ids_of

from durable_harness.core.types import StepStatus
from durable_harness.harness.crash import CRASH_EXIT_CODE
from durable_harness.harness.journal import decode_output
from durable_harness.sandbox.docker import DockerSandbox
from durable_harness.worlds import open_world

#: Steps: model 0, bash 1 (tests), model 2, edit 3, model 4, bash 5 (commit), model 6,
#: git_push 7 (dies after it ran), model 8, git_push 9 (already pushed), model 10, wait 11.
PUSH_SEQ, FIRST_WAIT_SEQ = 7, 11


@pytest.fixture
def task(docker_host: str, python_image: str, tmp_path: Path) -> Iterator[Harness]:
    yield from coding_task_harness(tmp_path, FIXTURES / "coding_task.toml", python_image)


def _text(output: object) -> str:
    """A tool step's recorded result as text (the built-in tools record {"content": …})."""
    return str(output["content"]) if isinstance(output, dict) else str(output)


@pytest.mark.timeout(1200)
def test_repository_in_pushed_branch_out_ci_looped_until_green(
    task: Harness, python_image: str
) -> None:
    h, project, remote = task, task.tmp / "shop", task.tmp / "remote.git"
    runs = h.tmp / "ci-runs.txt"
    user_head = host_git("-C", str(project), "rev-parse", "HEAD")
    queued = h.cli(
        "run", "--detach", "--workspace", "docker", "--image", python_image,
        "--push-remote", str(remote), "--ci-repo", "github:acme/shop", "Fix the shop",
        cwd=project,
    )  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    assert "workspace seeded from" in queued.stderr, queued.stderr
    ids = ids_of(queued)
    turn_id, session = ids["turn"], ids["session"]

    # 1. The push ran; the worker dies before its outcome is recorded. The hook ran CI
    # inside the push: its (red) result is in the World before any wait began.
    first = h.cli(
        "worker", "--until-idle", timeout=600, DURABLE_HARNESS_CRASH_AT=f"{PUSH_SEQ}:after_run"
    )
    assert first.returncode == CRASH_EXIT_CODE, first.stderr
    (sha1,) = runs.read_text().split()
    with open_world("local", data_dir=h.tmp / "world") as world:
        (red,) = world.list_signals(turn_id, "ci")
        assert json.loads(red.payload)["sha"] == sha1 and red.claimed_by is None

    # 2. The next worker is told the push may have happened; the model pushes again, is
    # told it is already pushed, and waits: this worker dies as the wait begins.
    second = h.cli(
        "worker", "--until-idle", timeout=600,
        DURABLE_HARNESS_CRASH_AT=f"{FIRST_WAIT_SEQ}:after_intent",
    )  # fmt: skip
    assert second.returncode == CRASH_EXIT_CODE, second.stderr

    # 3. A long-lived worker: the red result, the second fix, the second push (its CI
    # job holds), the second wait parks the turn. It is SIGKILLed; the container goes.
    worker = h.popen("worker")
    try:
        with open_world("local", data_dir=h.tmp / "world") as world:

            def parked_on_second_wait() -> bool:
                waits = [s for s in world.load_steps(turn_id) if s.name == "wait_for_signal"]
                return world.get_turn(turn_id).status.value == "waiting" and len(waits) == 2

            wait_until(parked_on_second_wait)
    finally:
        stop(worker)
    with DockerSandbox(session) as box:
        box.remove()
    (h.tmp / "ci-hold").touch()  # CI reports the second push now, with no worker alive
    with open_world("local", data_dir=h.tmp / "world") as world:
        wait_until(lambda: len(world.list_signals(turn_id, "ci")) == 2)

    # 4. A new worker: a new container, the workspace restored from the World, green.
    last = h.cli("worker", "--until-idle", timeout=600)
    assert last.returncode == 0, last.stderr
    shown = h.show(turn_id)
    assert shown["turn"]["status"] == "done", shown["turn"]
    assert shown["turn"]["result"] == f"CI is green: both bugs are fixed on {BRANCH}."

    with open_world("local", data_dir=h.tmp / "world") as world:
        steps = world.load_steps(turn_id)
        tools = [s for s in steps if s.kind == "tool"]
        assert [s.name for s in tools] == [
            "bash", "edit", "bash", "git_push", "git_push", "wait_for_signal",
            "edit", "bash", "git_push", "wait_for_signal", "bash",
        ]  # fmt: skip
        assert tools[3].status is StepStatus.POSSIBLY_RAN
        assert all(s.status is StepStatus.DONE for s in tools if s is not tools[3])
        outputs = [_text(decode_output(world, s)) for s in tools]
        assert "2 failed" in outputs[0]
        assert f"already pushed {sha1} to {BRANCH}" in outputs[4]
        assert "failure" in outputs[5] and sha1 in outputs[5]
        # The restored workspace, in a new container: both commits, the mode and the link.
        assert "Fix pricing\nFix pricing\nshop: pricing\n" in outputs[10]
        assert "scripts/check.sh 755 regular file" in outputs[10]
        assert "check 777 symbolic link\nscripts/check.sh\n" in outputs[10]
        signals = world.list_signals(turn_id, "ci")
        waits = [s for s in tools if s.name == "wait_for_signal"]
        assert [s.claimed_by for s in signals] == [waits[0].seq, waits[1].seq]

    # Each commit was pushed once and CI ran once per push; the remote's branch holds
    # both fixes, the link and the executable bit.
    sha1_, sha2 = runs.read_text().split()
    assert sha1_ == sha1 and sha2 != sha1
    assert host_git("--git-dir", str(remote), "rev-parse", BRANCH).strip() == sha2
    pricing = host_git("--git-dir", str(remote), "show", f"{BRANCH}:shop/pricing.py")
    assert "sum(prices)" in pricing and "price - price * percent" in pricing
    tree = host_git("--git-dir", str(remote), "ls-tree", "-r", BRANCH)
    assert "120000 blob" in tree.split("\tcheck\n")[0].splitlines()[-1]
    assert "100755 blob" in tree.split("\tscripts/check.sh")[0].splitlines()[-1]
    assert h.repeated_requests() == {}

    # The work comes out from the World alone: diff, and a branch in the user's repository
    # that leaves their branch and working tree as they were.
    diff = h.cli("diff", session, cwd=project)
    assert diff.returncode == 0, diff.stderr
    assert "-    return sum(prices[:-1])\n+    return sum(prices)\n" in diff.stdout
    assert "-    return price + price * percent / 100\n" in diff.stdout
    applied = h.cli("apply", session, cwd=project)
    assert applied.returncode == 0, applied.stderr
    assert host_git("-C", str(project), "rev-parse", "HEAD") == user_head
    assert host_git("-C", str(project), "status", "--porcelain") == ""
    assert host_git("-C", str(project), "rev-parse", f"dh/{session}").strip() == sha2

    # The token in the user's remote URL never reached the sandbox or the World.
    with DockerSandbox(session) as box:
        try:
            found = box.bash(
                f"grep -rl -- {TOKEN[:12]}{TOKEN[12:]} /workspace /home /tmp 2>/dev/null; env"
            )
            assert TOKEN not in found.stdout, found.stdout
        finally:
            box.remove()
    for path in (h.tmp / "world").rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
