"""What the tests of Pi and OpenCode on another wire API share: an agent config choosing
the provider's API (``[provider] api``), and the run arguments that use it."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from claude_cases import (
    AGENT_CONFIG,
    PROMPT,
    alive,
    bash_runs,
    dump,
    model_keys,
    notify_runs,
    upstream_keys,
    wait_for,
)
from support import Harness

from durable_harness.harness.crash import CRASH_EXIT_CODE

__all__ = ["Cli", "Point", "agent_config", "kill_and_resume", "kill_points", "wire_run_args"]

HERE = Path(__file__).resolve().parent
TOOLS = f"{HERE.parent / 'fixtures' / 'claude_tools.py'}:TOOLS"


def agent_config(tmp: Path, api: str) -> Path:
    """The tests' agent config (cat and ls replay as safe) with ``[provider] api``."""
    path = tmp / f"agent-{api}.toml"
    path.write_text(AGENT_CONFIG.read_text() + f'\n[provider]\napi = "{api}"\n')
    return path


def wire_run_args(h: Harness, agent: str, api: str, *extra: str, prompt: str = PROMPT) -> list[str]:
    return [
        "run",
        "--agent",
        agent,
        "--workspace",
        str(h.tmp / "ws"),
        "--tools",
        TOOLS,
        "--agent-config",
        str(agent_config(h.tmp, api)),
        *extra,
        prompt,
    ]


@dataclass(frozen=True)
class Point:
    name: str
    sleep: float = 0  # seconds the bash command sleeps after its effect
    chunk_delay_ms: int = 0  # slows the first model response
    crash_at: str | None = None  # DURABLE_HARNESS_CRASH_AT
    bash_status: str = "done"  # the first bash step's status after the resume


def kill_points(bash_seq: int) -> list[Point]:
    """Three points of the kill matrix: while a response streams, while the tool runs,
    after the tool's outcome (before the next model call)."""
    return [
        Point("model streaming", chunk_delay_ms=250),
        Point("tool running", sleep=30, bash_status="possibly_ran"),
        Point("after tool", crash_at=f"{bash_seq}:after_outcome"),
    ]


@dataclass(frozen=True)
class Cli:
    """How to kill one CLI's launches and tell that none is left."""

    kill: Callable[[int], list[int]]  # worker pid -> pids that were below it
    launches: Callable[[], list[int]]  # processes of any launch still alive
    final: str
    timeout: float = 180


def kill_and_resume(h: Harness, args: list[str], point: Point, cli: Cli) -> dict[str, Any]:
    """Run ``args``, kill the worker (and the CLI's group) at ``point``, resume the turn
    with a new worker, replay it, and check what the kill matrix checks. Returns a row
    of the matrix (printed by the caller)."""
    env = {"DURABLE_HARNESS_CRASH_AT": point.crash_at} if point.crash_at else {}
    proc = h.popen(*args, **env)
    assert proc.stdout is not None
    turn_id = [proc.stdout.readline(), proc.stdout.readline()][1].split()[1]
    below = _kill_when(h, proc, point, cli)
    gone = lambda: not alive(below) and not cli.launches()  # noqa: E731
    wait_for(gone, 10, "the CLI to be gone")
    before = h.show(turn_id)
    done_before = set(model_keys(before, "done"))
    calls_before = len(h.requests())

    resumed = h.cli("resume", turn_id, timeout=cli.timeout)
    assert resumed.returncode == 0, resumed.stderr
    after = h.show(turn_id)
    assert resumed.stdout.strip().splitlines()[-1] == cli.final, dump(after)
    assert after["turn"]["status"] == "done" and after["turn"]["deliveries"] == 2

    # 0 upstream calls for a request recorded before the kill; every upstream call is one
    # attempt of one journal step.
    repeated = [k for k in upstream_keys(h, since=calls_before) if k in done_before]
    assert repeated == []
    attempts = {s["key"]: s["attempts"] for s in after["steps"] if s["kind"] == "model"}
    assert dict(Counter(upstream_keys(h))) == attempts, dump(after)
    # Never tools at most once.
    assert bash_runs(h) == 1 and notify_runs(h) == 1, dump(after)
    first_bash = next(s for s in after["steps"] if s["name"] == "bash")
    assert first_bash["status"] == point.bash_status, dump(after)

    # The finished turn replays with 0 upstream calls and no tool run.
    calls = len(h.requests())
    replay = h.cli("replay", turn_id, timeout=cli.timeout)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == cli.final and len(h.requests()) == calls
    assert bash_runs(h) == 1 and notify_runs(h) == 1
    steps = after["steps"]
    return {
        "point": point.name,
        "upstream calls repeated": len(repeated),
        "never-tool runs (bash, notify)": f"{bash_runs(h)}, {notify_runs(h)}",
        "steps": " ".join(f"{s['kind']}:{s['name']}:{s['status']}" for s in steps),
        "final reply": cli.final,
    }


def _kill_when(h: Harness, proc: subprocess.Popen[str], point: Point, cli: Cli) -> list[int]:
    if point.crash_at is not None:
        proc.wait(timeout=cli.timeout)
        assert proc.returncode == CRASH_EXIT_CODE, proc.stderr.read() if proc.stderr else ""
        return []
    ready: Callable[[], bool]
    if point.chunk_delay_ms:
        ready = lambda: any(r["rule"] == "bash" for r in h.requests())  # noqa: E731
    else:
        ready = lambda: bash_runs(h) == 1  # noqa: E731
    wait_for(ready, 120, what=f"{point.name} to begin")
    time.sleep(0.8)  # well inside the stream (~3 s) or the command's sleep (30 s)
    assert proc.poll() is None, "the worker finished before it could be killed"
    below = cli.kill(proc.pid)
    proc.wait(timeout=10)
    return below
