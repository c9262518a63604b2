"""``durable-harness crash-matrix``: the project's crash matrix, run on the user's tools.

A clean run of the prompt gives the reference: its steps, its reply. Then, for every step
``seq`` of it and every crash point, a fresh World runs the same turn in a subprocess that
exits at that point (``DURABLE_HARNESS_CRASH_AT``), a second subprocess resumes it, and
the journal and the fake model's request log are counted:

* **model calls repeated**: requests the model answered twice. Only one is allowed: the
  call that returned but whose outcome was not recorded (``after_run`` on a model step);
* **never tools re-run**: a ``never`` step started more than once (must be 0);
* **reply**: equal to the clean run's or not;
* **settled**: interrupted ``never`` calls that their tool's check settled without the
  model (found done, or absent and run again under the same key): the model heard no
  *possibly ran* for them.

Each run works in its own fresh folder (its working directory), so tools that keep their
side effects relative to the working directory start clean every time. Side effects
elsewhere (an API) are the user's to check; the ``never`` counts say whether the harness
ever ran such a tool twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_harness.harness.crash import CRASH_EXIT_CODE, CRASH_POINTS
from durable_harness.harness.journal import SETTLED, SETTLED_DONE, SETTLED_RAN_AGAIN
from durable_harness.harness.tools import load_tools
from durable_harness.runtime.turns import absolute_tools_spec
from durable_harness.testing.fake_model import FakeModelServer


@dataclass(frozen=True)
class CellResult:
    seq: int
    kind: str
    name: str
    point: str
    repeated_model_calls: int
    never_reruns: int
    reply_ok: bool
    error: str = ""
    settled: int = 0

    @property
    def ok(self) -> bool:
        allowed = 1 if (self.kind == "model" and self.point == "after_run") else 0
        return (
            not self.error
            and self.reply_ok
            and self.never_reruns == 0
            and self.repeated_model_calls <= allowed
        )


@dataclass
class FreshRuns:
    """Runs of one prompt, each in a fresh local World and working directory below
    ``root`` (see :meth:`turn`): the crash matrix's cells, the evals' runs."""

    root: Path
    script: Path | None  # None: the model the settings name, not the fake one
    tools: list[str]
    prompt: str
    extra_env: dict[str, str]
    #: ``run``'s agent flags (``--agent claude-code --workspace docker``); none: builtin.
    agent_args: tuple[str, ...] = ()

    def cli(
        self, args: list[str], env: dict[str, str], cwd: Path
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "durable_harness.cli", *args],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    def turn(self, name: str, crash_at: str | None) -> tuple[dict[str, Any], list[str], str]:
        """Run the turn in a fresh World (crashing, then resuming, if ``crash_at``)."""
        folder = self.root / name
        folder.mkdir(parents=True)
        log = folder / "model.jsonl"
        server = None if self.script is None else FakeModelServer(self.script, log_path=log)
        with server if server is not None else contextlib.nullcontext():
            model = {}
            if server is not None:
                server.start()
                model = {"ANTHROPIC_BASE_URL": server.url}
            env = {
                **os.environ,
                **self.extra_env,
                **model,
                "DURABLE_HARNESS_WORLD": "local",
                "DURABLE_HARNESS_DATA_DIR": str(folder / "world"),
                "DURABLE_HARNESS_LEASE_SECONDS": "1",
                "DURABLE_HARNESS_POLL_SECONDS": "0.1",
                # The resuming process runs the turn's tools files only if its operator
                # registered them (runtime/admission.py): the ones given to the matrix.
                "DURABLE_HARNESS_TOOL_SETS": json.dumps(self.tools),
            }
            env.pop("DURABLE_HARNESS_CRASH_AT", None)
            tool_args = [a for spec in self.tools for a in ("--tools", spec)]
            first_env = {**env, "DURABLE_HARNESS_CRASH_AT": crash_at} if crash_at else env
            args = ["run", "-q", *self.agent_args, *tool_args, self.prompt]
            first = self.cli(args, first_env, folder)
            ids = dict(line.split(" ", 1) for line in first.stdout.splitlines()[:2] if " " in line)
            if "turn" not in ids:
                raise RuntimeError(f"the turn did not start: {first.stderr.strip()}")
            try:
                data = self._finish(ids, crash_at, first, env, folder)
            finally:
                if "docker" in self.agent_args:  # the run's own container goes with it
                    self.cli(["sandbox", "rm", ids["session"]], env, folder)
        lines = log.read_text().splitlines() if log.exists() else []
        hashes = [json.loads(line)["request_hash"] for line in lines]
        return data, hashes, str(data["turn"]["result"])

    def _finish(
        self,
        ids: dict[str, str],
        crash_at: str | None,
        first: subprocess.CompletedProcess[str],
        env: dict[str, str],
        folder: Path,
    ) -> dict[str, Any]:
        """After the first ``run``: resume the crashed turn; the turn as ``show`` prints it."""
        expected = CRASH_EXIT_CODE if crash_at else 0
        if first.returncode == 0 and crash_at:
            raise RuntimeError("the turn never reached this point (it took another path)")
        if first.returncode != expected:
            raise RuntimeError(
                f"run exited {first.returncode}, expected {expected}: {first.stderr.strip()}"
            )
        if crash_at:
            resumed = self.cli(["resume", "-q", ids["turn"]], env, folder)
            if resumed.returncode != 0:
                raise RuntimeError(f"resume failed: {resumed.stderr.strip()}")
        shown = self.cli(["show", "--json", ids["turn"]], env, folder)
        data: dict[str, Any] = json.loads(shown.stdout)
        return data


#: Runs the turn once in a fresh World, named for the cell: crashing at ``crash_at`` (a
#: ``DURABLE_HARNESS_CRASH_AT`` value) and then resuming, or cleanly when it is None.
#: Returns the turn as ``show --json`` prints it, the request hashes of the fake model's
#: log (one per answered request) and the final reply.
TurnRunner = Callable[[str, str | None], tuple[dict[str, Any], list[str], str]]


def run_matrix(
    script: Path,
    tools: list[str],
    prompt: str,
    *,
    points: tuple[str, ...] = CRASH_POINTS,
    say: Callable[[str], None] = print,
) -> list[CellResult]:
    never = {t.name for spec in tools for t in load_tools(spec) if t.replay == "never"}
    with tempfile.TemporaryDirectory(prefix="durable-harness-matrix-") as tmp:
        specs = [absolute_tools_spec(s) for s in tools]
        run = FreshRuns(Path(tmp), script.resolve(), specs, prompt, {})
        return run_cells(run.turn, never, points=points, say=say)


def run_cells(
    turn: TurnRunner,
    never: set[str],
    *,
    points: tuple[str, ...] = CRASH_POINTS,
    say: Callable[[str], None] = print,
) -> list[CellResult]:
    """The matrix over any way of running a turn (the CLI's ``run``/``resume``, or a
    program of the user's own on the Python API): a clean run gives the steps and the
    reply, then every step x point is crashed, resumed and scored. ``never`` names the
    steps whose re-runs count."""
    clean, _, reply = turn("clean", None)
    steps = clean["steps"]
    say(f"clean run: {len(steps)} steps, reply: {reply!r}")
    say(f"crashing at {len(steps)} steps x {len(points)} points = {len(steps) * len(points)}")
    results: list[CellResult] = []
    for step in steps:
        for point in points:
            cell = f"{step['seq']}:{point}"
            try:
                data, hashes, got = turn(cell.replace(":", "-"), cell)
                repeated = sum(n - 1 for n in Counter(hashes).values() if n > 1)
                # A call its check found absent and ran again under its key is no re-run.
                reruns = sum(
                    s["attempts"] - 1 - (s.get(SETTLED) == SETTLED_RAN_AGAIN)
                    for s in data["steps"]
                    if s["name"] in never
                )
                result = CellResult(
                    step["seq"],
                    step["kind"],
                    step["name"],
                    point,
                    repeated,
                    reruns,
                    got == reply,
                    settled=sum(
                        s.get(SETTLED) in (SETTLED_DONE, SETTLED_RAN_AGAIN) for s in data["steps"]
                    ),
                )
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                result = CellResult(
                    step["seq"], step["kind"], step["name"], point, 0, 0, False, str(exc)
                )
            results.append(result)
            say(format_cell(result))
    return results


def format_cell(r: CellResult) -> str:
    verdict = "ok  " if r.ok else "FAIL"
    line = (
        f"{verdict} step {r.seq:>3} {r.kind:<5} {r.name[:20]:<20} {r.point:<13} "
        f"model calls repeated {r.repeated_model_calls}  never re-runs {r.never_reruns}  "
        f"reply {'same' if r.reply_ok else 'DIFFERENT'}"
        + (f"  settled by its check {r.settled}" if r.settled else "")
    )
    return line + (f"  error: {r.error}" if r.error else "")
