"""``durable-harness gc`` on the real servers, one suite for every World that keeps
:class:`~durable_harness.core.world.Retention` (runtime/gc.py).

Ages are real: a session made before a one-second pause is "old" for a gc run with
``older_than`` and ``grace`` of half a second; what comes after the pause is new. The
race with a turn reusing a deduplicated blob is made exact by gc's ``after_mark`` hook,
which runs between the mark and the sweep.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BACKENDS, WorldSpec

from durable_harness.core.errors import NotFound
from durable_harness.core.types import Step, StepStatus, TurnStatus
from durable_harness.core.world import World
from durable_harness.runtime.gc import collect

AGE = 0.5  # older_than and grace of every run here; the pause below makes data older


@pytest.fixture(params=["local", "postgres"])
def gc_world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    with BACKENDS[request.param](tmp_path) as options:
        world = WorldSpec(request.param, options).open()
        try:
            yield world
        finally:
            world.close()


def turn_with_data(world: World, session_id: str, blobs: list[bytes], finish: bool) -> str:
    """A turn in a new session whose step names ``blobs[0]`` as its output blob and whose
    transcript record is a JSON blob naming the rest (a nested reference, as a manifest
    names its folders). Ends ``done`` if ``finish``; else stays running."""
    turn_id = f"{session_id}-t"
    world.create_session(session_id)
    world.create_turn(session_id, turn_id, "prompt", {})
    lease = world.claim_turn(turn_id, "w1", 30.0)
    assert lease is not None
    digests = [world.put_blob(data) for data in blobs]
    step = Step(turn_id, 0, "k0", "tool", "bash", "h0", epoch=lease.epoch)
    world.insert_intent(step)
    world.finish_step(turn_id, 0, lease.epoch, StepStatus.DONE, None, digests[0], {})
    node = world.put_blob(json.dumps({"prev": None, "chunks": digests[1:]}).encode())
    world.put_session_record(session_id, "transcript", node)
    world.append_event(turn_id, "e1", "note", {"n": 1}, epoch=lease.epoch)
    if finish:
        world.complete_turn(lease, "done")
    return turn_id


def readable(world: World, data: bytes) -> bool:
    import hashlib

    try:
        return world.get_blob(hashlib.sha256(data).hexdigest()) == data
    except NotFound:
        return False


def test_gc_removes_an_old_finished_session_and_keeps_kept_and_live_ones(
    gc_world: World,
) -> None:
    world = gc_world
    old = turn_with_data(world, "old", [b"old-out", b"old-chunk", b"shared"], finish=True)
    live = turn_with_data(world, "live", [b"live-out", b"live-chunk"], finish=False)
    time.sleep(2 * AGE)
    kept = turn_with_data(world, "kept", [b"kept-out", b"shared"], finish=True)

    dry = collect(world, AGE, grace=AGE, dry_run=True)
    # old's turn, step, event, record; its out, chunk and transcript node (not "shared").
    counts = (dry.sessions, dry.turns, dry.steps, dry.events, dry.records, dry.blobs)
    assert counts == (1, 1, 1, 1, 1, 3)
    assert dry.blob_bytes > 0
    assert world.get_turn(old).status == TurnStatus.DONE  # a dry run removes nothing
    assert readable(world, b"old-out") and readable(world, b"old-chunk")

    report = collect(world, AGE, grace=AGE)
    assert (report.sessions, report.turns, report.steps, report.blobs) == (1, 1, 1, 3)
    assert report.blob_bytes == dry.blob_bytes
    for gone in (lambda: world.get_turn(old), lambda: world.get_session("old")):
        with pytest.raises(NotFound):
            gone()
    assert world.read_events(old) == []
    assert not readable(world, b"old-out") and not readable(world, b"old-chunk")
    # The kept (new) session, the live (old but running) turn, and what they name stay.
    for data in (b"shared", b"kept-out", b"live-out", b"live-chunk"):
        assert readable(world, data), data
    assert world.get_turn(live).status == TurnStatus.RUNNING
    assert len(world.load_steps(live)) == 1 and len(world.load_steps(kept)) == 1
    assert world.get_session_record("kept", "transcript") is not None
    again = collect(world, AGE, grace=AGE)
    assert (again.sessions, again.blobs) == (0, 0)


def test_gc_racing_turns_that_reuse_its_blobs_and_sessions_loses_nothing(
    gc_world: World,
) -> None:
    world = gc_world
    turn_with_data(world, "old", [b"old-out", b"reused", b"also-old"], finish=True)
    turn_with_data(world, "revived", [b"revived-out", b"revived-chunk"], finish=True)
    time.sleep(2 * AGE)
    reused: list[str] = []

    def reuse_between_mark_and_sweep() -> None:
        # A new turn dedups onto a blob only the old session named: the mark did not see
        # it; the sweep must.
        turn_id = turn_with_data(world, "new", [b"new-out"], finish=False)
        digest = world.put_blob(b"reused")
        lease = world.claim_turn(turn_id, "w1", 30.0, force=True)
        assert lease is not None
        world.insert_intent(Step(turn_id, 1, "k1", "tool", "bash", "h1", epoch=lease.epoch))
        world.finish_step(turn_id, 1, lease.epoch, StepStatus.DONE, None, digest, {})
        reused.append(digest)

    # A turn created on an expired session between the listing and its removal keeps it.
    before = world.now() - AGE
    assert "revived" in world.expired_sessions(before)
    world.create_turn("revived", "revived-t2", "again", {})
    assert world.drop_session("revived", before, dry_run=False) is None

    report = collect(world, AGE, grace=AGE, after_mark=reuse_between_mark_and_sweep)
    assert reused and world.get_blob(reused[0]) == b"reused"
    assert not readable(world, b"old-out") and not readable(world, b"also-old")
    assert report.sessions == 1 and report.blobs == 3  # old-out, also-old, the record node
    assert readable(world, b"revived-out") and readable(world, b"revived-chunk")
    assert world.get_turn("revived-t2").status == TurnStatus.QUEUED
    # A reuse that lands after the delete writes the blob again.
    assert world.put_blob(b"old-out") and readable(world, b"old-out")


def test_gc_command_dry_run_then_removal(tmp_path: Path) -> None:
    from durable_harness.worlds.local import LocalWorld

    data_dir = tmp_path / "world"
    with contextlib.closing(LocalWorld(data_dir)) as world:
        turn_with_data(world, "old", [b"a", b"b"], finish=True)
    time.sleep(2 * AGE)
    env = os.environ | {
        "DURABLE_HARNESS_DATA_DIR": str(data_dir),
        "DURABLE_HARNESS_GC_GRACE_SECONDS": str(AGE),
    }

    def gc(*flags: str) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "durable_harness.cli", "gc", "--older-than", f"{AGE}s"]
        out = subprocess.run([*cmd, "--json", *flags], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        report: dict[str, Any] = json.loads(out.stdout)
        return report

    dry = gc("--dry-run")
    assert (dry["dry_run"], dry["sessions"], dry["blobs"]) == (True, 1, 3)
    done = gc()
    assert (done["dry_run"], done["sessions"], done["blobs"]) == (False, 1, 3)
    assert done["blob_bytes"] == dry["blob_bytes"]
