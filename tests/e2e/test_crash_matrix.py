"""The crash matrix: a real worker process is killed (os._exit) at every point of every
step of a turn, then a fresh worker process finishes it. For each crash we count what the
journal exists to prevent: model calls paid twice, side effects done twice, a different
final reply.

The turn (the demo's): check_refund (safe) -> refund (never, appends to a ledger outside
the workspace) -> write refunds.md -> bash cat -> reply. Steps 0-8 on a clean run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import DEMO, DEMO_PROMPT, DEMO_REPLY, DEMO_TOOLS, Harness, ids_of

from durable_harness.harness.crash import CRASH_EXIT_CODE, CRASH_POINTS
from durable_harness.testing.matrix import run_cells

CLEAN_STEPS = [
    ("model", None),
    ("tool", "check_refund"),
    ("model", None),
    ("tool", "refund"),
    ("model", None),
    ("tool", "write"),
    ("model", None),
    ("tool", "bash"),
    ("model", None),
]
REFUND_SEQ = 3


def test_clean_run(demo_harness: Harness) -> None:
    out = demo_harness.cli("run", "--tools", DEMO_TOOLS, DEMO_PROMPT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == DEMO_REPLY
    data = demo_harness.show(ids_of(out)["turn"])
    assert [
        (s["kind"], s["name"] if s["kind"] == "tool" else None) for s in data["steps"]
    ] == CLEAN_STEPS
    assert all(s["status"] == "done" and s["how"] == "live" for s in data["steps"])
    assert len(demo_harness.ledger_lines()) == 1
    assert demo_harness.server.request_count == 5
    assert demo_harness.repeated_requests() == {}


def crash_and_resume(h: Harness, crash_at: str, tools: str = DEMO_TOOLS) -> tuple[str, Any]:
    crashed = h.cli("run", "--tools", tools, DEMO_PROMPT, DURABLE_HARNESS_CRASH_AT=crash_at)
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    turn_id = ids_of(crashed)["turn"]
    before = {s["seq"]: s for s in h.show(turn_id)["steps"]}
    resumed = h.cli("resume", turn_id)  # takes the dead worker's turn over at once
    assert resumed.returncode == 0, resumed.stderr
    return resumed.stdout.strip(), (turn_id, before, h.show(turn_id))


@pytest.mark.parametrize("point", CRASH_POINTS)
@pytest.mark.parametrize("seq", range(len(CLEAN_STEPS)))
def test_crash_matrix(demo_harness: Harness, seq: int, point: str) -> None:
    h = demo_harness
    reply, (turn_id, before, after) = crash_and_resume(h, f"{seq}:{point}")
    kind = CLEAN_STEPS[seq][0]

    # The final reply equals a clean run's.
    assert reply == DEMO_REPLY
    assert after["turn"]["status"] == "done" and after["turn"]["deliveries"] == 2

    # The never tool's side effect happened exactly once.
    assert len(h.ledger_lines()) == 1, h.ledger_lines()

    # 0 upstream calls for model steps whose outcome was recorded before the crash: each
    # such step is read back, and no request reached the model twice, except the one
    # call that had returned but was not recorded (after_run on a model step).
    recorded_models = [s for s in before.values() if s["kind"] == "model" and s["status"] == "done"]
    for s in recorded_models:
        assert after["steps"][s["seq"]]["how"] == "replayed"
    repeated = h.repeated_requests()
    if kind == "model" and point == "after_run":
        assert list(repeated.values()) == [2]
    else:
        assert repeated == {}
    model_steps = [s for s in after["steps"] if s["kind"] == "model"]
    extra = 1 if (kind == "model" and point == "after_run") else 0
    assert h.server.request_count == len(model_steps) + extra

    # Where the refund's intent had no outcome, the model got the possibly-ran result and
    # checked before acting again.
    interrupted_refund = seq == REFUND_SEQ and point in ("after_intent", "after_run")
    refund_step = after["steps"][REFUND_SEQ]
    assert refund_step["status"] == ("possibly_ran" if interrupted_refund else "done")
    if interrupted_refund:
        assert after["steps"][REFUND_SEQ + 1]["kind"] == "model"
        assert after["steps"][REFUND_SEQ + 2]["name"] == "check_refund"

    # Replaying the finished turn with the model switched off: same reply, 0 calls.
    h.server.stop()
    calls = h.server.request_count
    replay = h.cli("replay", turn_id, ANTHROPIC_BASE_URL="http://127.0.0.1:9")
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == DEMO_REPLY
    assert h.server.request_count == calls


def test_never_label_matters(demo_harness: Harness) -> None:
    """The same refund labelled safe, crashed after it ran: it runs twice. This is the
    failure the `never` label exists to stop."""
    tools = DEMO_TOOLS.replace(":TOOLS", ":TOOLS_REFUND_MARKED_SAFE")
    reply, (_, _, after) = crash_and_resume(demo_harness, f"{REFUND_SEQ}:after_run", tools)
    assert reply == DEMO_REPLY
    assert after["steps"][REFUND_SEQ]["status"] == "done"
    assert after["steps"][REFUND_SEQ]["attempts"] == 2
    assert len(demo_harness.ledger_lines()) == 2  # refunded twice


@pytest.mark.parametrize(
    ("tools", "point", "settled"),
    [
        ("TOOLS_CHECKED", "before_intent", None),
        ("TOOLS_CHECKED", "after_intent", "absent"),  # the ledger does not honour the key
        ("TOOLS_CHECKED", "after_run", "done"),
        ("TOOLS_CHECKED", "after_outcome", None),
        ("TOOLS_CHECKED_IDEMPOTENT", "after_intent", "ran again"),
        ("TOOLS_CHECKED_IDEMPOTENT", "after_run", "done"),
        ("TOOLS_CHECK_UNKNOWN", "after_run", "unknown"),
    ],
)
def test_a_checked_refund_is_settled_before_the_model_hears_possibly_ran(
    demo_harness: Harness, tools: str, point: str, settled: str | None
) -> None:
    """The refund with a check, crashed at each point: the refund lands exactly once, and
    where the check settles it (found done, or absent and run again under the same key)
    the model gets the refund's real result: the turn's model requests are the clean
    run's, none repeated, no possibly-ran result among them."""
    h = demo_harness
    spec = DEMO_TOOLS.replace(":TOOLS", f":{tools}")
    reply, (_, _, after) = crash_and_resume(h, f"{REFUND_SEQ}:{point}", spec)
    assert reply == DEMO_REPLY
    assert len(h.ledger_lines()) == 1, h.ledger_lines()
    refund = after["steps"][REFUND_SEQ]
    assert refund["settled"] == settled, refund
    if settled in ("done", "ran again"):
        assert refund["status"] == "done"
        assert refund["how"] == ("settled by its check" if settled == "done" else "live")
        assert refund["attempts"] == (2 if settled == "ran again" else 1)
        assert [
            (s["kind"], s["name"] if s["kind"] == "tool" else None) for s in after["steps"]
        ] == (CLEAN_STEPS)
        assert h.server.request_count == 5 and h.repeated_requests() == {}
    elif settled is not None:  # absent without the key honoured, or unknown: possibly ran
        assert refund["status"] == "possibly_ran" and refund["attempts"] == 1
        assert after["steps"][REFUND_SEQ + 2]["name"] == "check_refund"  # the model checked


def test_a_call_its_check_ran_again_is_no_never_rerun_in_the_matrix() -> None:
    """The matrix's score of a cell whose refund was found absent and run again under its
    key (attempts 2, settled "ran again"): settled, not a re-run; any other second attempt
    of a never step still is one."""
    rows = [{"seq": 3, "kind": "tool", "name": "refund", "attempts": 2, "settled": "ran again"}]

    def turn(name: str, crash_at: str | None) -> tuple[dict[str, Any], list[str], str]:
        return {"steps": rows}, [], "reply"

    (cell,) = run_cells(turn, {"refund"}, points=("after_intent",), say=lambda _: None)
    assert cell.ok and cell.never_reruns == 0 and cell.settled == 1
    rows[0] = {**rows[0], "settled": None}
    (cell,) = run_cells(turn, {"refund"}, points=("after_intent",), say=lambda _: None)
    assert not cell.ok and cell.never_reruns == 1


def test_crash_matrix_command(tmp_path: Path) -> None:
    """The same matrix as a command users run on their own tools and script (here the
    refund with a check: the matrix counts the interrupted call its check settled)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "durable_harness.cli",
            "crash-matrix",
            "--script",
            str(DEMO / "script.toml"),
            "--tools",
            DEMO_TOOLS.replace(":TOOLS", ":TOOLS_CHECKED"),
            "--points",
            "after_run",
            DEMO_PROMPT,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "9/9 crash points survived"
    assert lines[-2] == "1 interrupted call(s) settled by their tool's check, without the model"
    assert sum(line.startswith("ok ") for line in lines) == 9
    assert not (tmp_path / "refund-ledger.txt").exists()  # each cell had its own folder
