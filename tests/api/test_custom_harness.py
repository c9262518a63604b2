"""The two custom-harness examples through the crash matrix.

``examples/custom_anthropic.py`` (its own loop on the ``anthropic`` SDK, Messages) and
``examples/custom_openai.py`` (on the ``openai`` SDK, Chat Completions) run as real
processes against the scripted fake model (``tests/fixtures/notes.toml``), each in a fresh
local World. The turn: model -> append_note (``never``: appends a line to a notes file
outside the World) -> model -> read_notes (``safe``) -> model replies; steps 0-4.

The matrix is the project's own (``harness/matrix.py: run_cells``): a clean run gives the
steps and the reply, then every step x crash point is killed with
``DURABLE_HARNESS_CRASH_AT`` (``os._exit``) and the same command is run again, which
waits for the dead run's 1 s lease and finishes the turn. Each cell is scored as the CLI's
matrix scores its cells (no model request answered twice except the one whose reply was
lost, ``after_run`` on a model step; no ``never`` step started twice; the reply is the
clean run's), and asserted as ``tests/e2e/test_crash_matrix.py`` asserts the demo's: the
note was written exactly once, model steps recorded before the crash were read back, an
interrupted note came back *possibly ran* and the model read the notes before writing
again, and a third run (a replay of the finished turn) made 0 model calls.

Both examples run every crash point (issue 12's acceptance: every step x 4 points each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import FIXTURES, ROOT

from durable_harness import open_world
from durable_harness.harness.crash import CRASH_EXIT_CODE, CRASH_POINTS
from durable_harness.runtime.views import show_data
from durable_harness.testing.fake_model import FakeModelServer
from durable_harness.testing.matrix import CellResult, run_cells

EXAMPLES = {
    "anthropic": ROOT / "examples" / "custom_anthropic.py",
    "openai": ROOT / "examples" / "custom_openai.py",
}
SCRIPT = FIXTURES / "notes.toml"
PROMPT = "Write the note 'hello from my own loop' once."
REPLY = "The note 'hello from my own loop' is written, once."
TURN = "turn_notes_1"
CLEAN_STEPS = [
    ("model", None),
    ("tool", "append_note"),
    ("model", None),
    ("tool", "read_notes"),
    ("model", None),
]
NEVER_SEQ = 1


@dataclass
class Cell:
    """What one cell left behind, for the assertions the matrix's score does not make."""

    before: dict[int, dict[str, Any]]  # the journal as the crash left it
    after: dict[str, Any]  # the turn as `show --json` prints it, once resumed
    log: list[dict[str, Any]]  # the fake model's log: one line per answered request
    notes: list[str]  # the never tool's side effect, after the replay run too
    replay_calls: int  # model requests the third run (the replay) made
    replay_reply: str


@dataclass
class ProgramRuns:
    """``harness.matrix.TurnRunner`` for an example program: crash it, run it again."""

    example: Path
    root: Path
    cells: dict[str, Cell] = field(default_factory=dict)

    def __call__(self, name: str, crash_at: str | None) -> tuple[dict[str, Any], list[str], str]:
        folder = self.root / name
        folder.mkdir()
        url = f"local://{folder / 'world'}"
        notes = folder / "notes.txt"
        log = folder / "model.jsonl"
        with FakeModelServer(SCRIPT, log_path=log) as server:
            env = {
                **os.environ,
                "ANTHROPIC_BASE_URL": server.url,
                "ANTHROPIC_API_KEY": "test-key-for-the-fake-model",
                "OPENAI_BASE_URL": f"{server.url}/v1",
                "OPENAI_API_KEY": "test-key-for-the-fake-model",
                "NOTES_FILE": str(notes),
                "DURABLE_HARNESS_LEASE_SECONDS": "1",
                "DURABLE_HARNESS_POLL_SECONDS": "0.1",
            }
            env.pop("DURABLE_HARNESS_CRASH_AT", None)
            before: dict[int, dict[str, Any]] = {}
            if crash_at is not None:
                self._run(url, folder, {**env, "DURABLE_HARNESS_CRASH_AT": crash_at}, crashes=True)
                before = {s["seq"]: s for s in self._show(url)["steps"]}
            reply = self._run(url, folder, env)
            after = self._show(url)
            calls = server.request_count
            replay_reply = self._run(url, folder, env)
            replay_calls = server.request_count - calls
        entries = [json.loads(line) for line in log.read_text().splitlines() if line]
        lines = notes.read_text().splitlines() if notes.exists() else []
        self.cells[name] = Cell(before, after, entries, lines, replay_calls, replay_reply)
        return after, [e["request_hash"] for e in entries], reply

    def _run(self, url: str, cwd: Path, env: dict[str, str], *, crashes: bool = False) -> str:
        argv = [sys.executable, str(self.example), "--world", url, "--turn", TURN, PROMPT]
        out = subprocess.run(
            argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
        )
        expected = CRASH_EXIT_CODE if crashes else 0
        if out.returncode != expected:
            raise RuntimeError(
                f"{self.example.name} exited {out.returncode}, expected {expected}: "
                f"{out.stderr.strip()[-2000:]}"
            )
        return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""

    @staticmethod
    def _show(url: str) -> dict[str, Any]:
        with open_world(url) as world:
            return show_data(world, TURN)


def check_cell(cell: Cell, seq: int, point: str) -> None:
    """tests/e2e/test_crash_matrix.py's assertions, for a program's own loop."""
    kind = CLEAN_STEPS[seq][0]
    after = cell.after
    steps = after["steps"]
    assert after["turn"]["status"] == "done" and after["turn"]["deliveries"] == 2

    # The never tool's side effect happened exactly once (the model checks before writing
    # again), and the replay run did not repeat it.
    assert len(cell.notes) == 1, cell.notes

    # 0 model calls for model steps recorded before the crash: each was read back, and no
    # request reached the model twice except the one whose reply was not recorded.
    for s in cell.before.values():
        if s["kind"] == "model" and s["status"] == "done":
            assert steps[s["seq"]]["how"] == "replayed", (s, steps)
    repeated = {h: n for h, n in Counter(e["request_hash"] for e in cell.log).items() if n > 1}
    lost_reply = kind == "model" and point == "after_run"
    assert list(repeated.values()) == ([2] if lost_reply else []), repeated
    model_steps = [s for s in steps if s["kind"] == "model"]
    assert len(cell.log) == len(model_steps) + (1 if lost_reply else 0)

    # Where the note's intent had no outcome, the model got the possibly-ran result and
    # read the notes before writing again; otherwise the step finished normally.
    interrupted = seq == NEVER_SEQ and point in ("after_intent", "after_run")
    assert steps[NEVER_SEQ]["status"] == ("possibly_ran" if interrupted else "done")
    if interrupted:
        assert steps[NEVER_SEQ + 1]["kind"] == "model"
        assert steps[NEVER_SEQ + 2]["name"] == "read_notes"

    # A third run of the program, on the finished turn: same reply, 0 model calls.
    assert cell.replay_reply == REPLY
    assert cell.replay_calls == 0


CELLS = [(sdk, point) for sdk in EXAMPLES for point in CRASH_POINTS]


@pytest.mark.parametrize(("sdk", "point"), CELLS)
def test_crash_matrix(sdk: str, point: str, tmp_path: Path) -> None:
    runs = ProgramRuns(EXAMPLES[sdk], tmp_path)
    lines: list[str] = []
    started = time.monotonic()
    results: list[CellResult] = run_cells(runs, {"append_note"}, points=(point,), say=lines.append)
    report = "\n".join(lines)
    print(f"MATRIX {sdk} {point}: {len(results)} cells in {time.monotonic() - started:.1f}s")
    print(report)

    clean = runs.cells["clean"]
    assert [
        (s["kind"], s["name"] if s["kind"] == "tool" else None) for s in clean.after["steps"]
    ] == CLEAN_STEPS, report
    assert all(s["how"] == "live" for s in clean.after["steps"])
    assert len(clean.log) == 3 and len(clean.notes) == 1
    assert clean.replay_reply == REPLY and clean.replay_calls == 0

    assert [r.seq for r in results] == list(range(len(CLEAN_STEPS))), report
    assert all(r.ok for r in results), report
    for r in results:
        check_cell(runs.cells[f"{r.seq}-{point}"], r.seq, point)
