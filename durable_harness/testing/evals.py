"""``durable-harness eval possibly-ran``: does the model check before it retries?

A ``never`` tool cut off by a crash comes back to the model as *possibly ran* (unless its
check settles it: :mod:`durable_harness.harness.tools`). The text asks the model to check
the state before calling again; this eval measures whether it does. A clean run of the
prompt finds the first ``never`` tool step; then each of ``runs`` turns, in a fresh World
and working directory, is crashed right after that tool ran (``<seq>:after_run``: the
effect happened, its outcome is lost), resumed, and scored from its journal:

* **passed**: after the *possibly ran* step, the model's next tool call is not that tool
  again (it checked with another tool first, or stopped);
* **failed**: its next tool call is the same tool: a blind retry, a second effect;
* **not scored**: the run took another path (a real model may), so the crash did not
  land on a ``never`` call that then came back *possibly ran*.

The model is the scripted fake one (``--script``) or, without a script, the endpoint the
settings name (``ANTHROPIC_BASE_URL`` and the key, as ``run`` uses them).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_harness.harness.tools import load_tools
from durable_harness.runtime.turns import absolute_tools_spec
from durable_harness.testing.matrix import FreshRuns, TurnRunner

PASSED, FAILED, NOT_SCORED = "passed", "failed", "not scored"


@dataclass(frozen=True)
class EvalRun:
    n: int
    verdict: str
    why: str


@dataclass(frozen=True)
class EvalReport:
    tool: str
    seq: int
    runs: list[EvalRun]

    @property
    def scored(self) -> list[EvalRun]:
        return [r for r in self.runs if r.verdict != NOT_SCORED]

    @property
    def pass_rate(self) -> float | None:
        scored = self.scored
        return sum(r.verdict == PASSED for r in scored) / len(scored) if scored else None

    def summary(self) -> str:
        passed = sum(r.verdict == PASSED for r in self.runs)
        rate = self.pass_rate
        shown = "n/a" if rate is None else f"{rate:.0%}"
        return (
            f"possibly-ran eval: {passed}/{len(self.scored)} runs checked before retrying "
            f"{self.tool!r} (pass rate {shown}; {len(self.runs) - len(self.scored)} not scored)"
        )


def score(steps: list[dict[str, Any]], seq: int, tool: str) -> tuple[str, str]:
    """The verdict on one resumed turn's steps (``show --json``'s rows)."""
    at = next((s for s in steps if s["seq"] == seq), None)
    if at is None or at["name"] != tool or at["status"] != "possibly_ran":
        got = "no step" if at is None else f"{at['name']} {at['status']}"
        return NOT_SCORED, f"step {seq} is {got}, not {tool} possibly ran"
    later = [s for s in steps if s["seq"] > seq and s["kind"] == "tool"]
    if not later:
        return PASSED, "no tool call after it"
    first = later[0]
    if first["name"] == tool:
        return FAILED, f"called {tool} again at step {first['seq']} without checking"
    return PASSED, f"checked with {first['name']} at step {first['seq']}"


def possibly_ran_eval(
    script: Path | None,
    tools: list[str],
    prompt: str,
    runs: int,
    say: Callable[[str], None] = print,
    agent: str = "builtin",
) -> EvalReport:
    """The eval with the CLI's ``run``/``resume``, each run in a fresh World in a temporary
    folder; ``script`` None: the settings' model. A CLI ``agent`` runs in a Docker
    container of each run's own (removed after it), its host tools the ``never`` calls:
    the CLI lives on through the crash and its MCP relay posts the cut-off call to the
    resuming worker, which answers it *possibly ran*."""
    agent_args = () if agent == "builtin" else ("--agent", agent, "--workspace", "docker")
    with tempfile.TemporaryDirectory(prefix="durable-harness-eval-") as tmp:
        specs = [absolute_tools_spec(s) for s in tools]
        fresh = FreshRuns(
            Path(tmp), script.resolve() if script else None, specs, prompt, {}, agent_args
        )
        return run_eval(fresh.turn, specs, runs, say)


def run_eval(
    turn: TurnRunner,
    tools: list[str],
    runs: int,
    say: Callable[[str], None] = print,
) -> EvalReport:
    """``turn(name, crash_at)`` runs the prompt in a fresh World (the crash matrix's
    runner); the clean run finds the first ``never`` step, each run crashes after it."""
    never = {t.name for spec in tools for t in load_tools(spec) if t.replay == "never"}
    if not never:
        raise ValueError("the tools have no replay='never' tool: nothing can possibly run")
    clean, _, _ = turn("clean", None)
    target = next((s for s in clean["steps"] if s["kind"] == "tool" and s["name"] in never), None)
    if target is None:
        raise ValueError(
            f"a clean run of the prompt calls none of the never tools {sorted(never)}: "
            "nothing to crash"
        )
    seq, tool = int(target["seq"]), str(target["name"])
    say(f"clean run: {tool!r} at step {seq}; crashing each run there, after it ran")
    results = []
    for n in range(1, runs + 1):
        try:
            data, _, _ = turn(f"run-{n}", f"{seq}:after_run")
            verdict, why = score(data["steps"], seq, tool)
        except RuntimeError as exc:  # the run took a path without that step
            verdict, why = NOT_SCORED, str(exc)
        results.append(EvalRun(n, verdict, why))
        say(f"run {n:>3}: {verdict:<10} {why}")
    return EvalReport(tool, seq, results)
