"""What the harness adds to a CLI agent's own time: a scripted turn of N shell calls run
bare and through ``durable-harness run``, side by side in one run against one fake model.

Claude Code on a host folder (the developer opt-in: the worker's agent user runs it, as
the harness does), the bundled fake model answering at once (``--first-token-ms 0``) or
like a real one (``--first-token-ms 1000``, then ``--chunk-ms`` between events). The turn,
for N in ``--calls`` (e.g. ``2,20``): the model asks for ``printf 'S%03d' k`` for k = 1..N,
one call per answer, then replies. Markers are made by the shell, so a rule matches only
the tool result it waits for. Two ways, interleaved run by run so drift hits both alike:

* **bare**: ``claude -p PROMPT --dangerously-skip-permissions`` against the fake model;
* **harness**: ``durable-harness run --agent claude-code --workspace DIR PROMPT`` with a
  local World: the proxy, the hooks, transcript saves and workspace snapshots.

Per N: the median wall time of ``--repeat`` runs each way and their ratio; from two N the
harness's added time per tool call (the slope of the difference) and per turn (its
intercept). ``--profile`` runs one more harness turn of the largest N under
``cProfile`` of the worker and prints where its own time went (the CLI's time is in
other processes). Run as root after ``scripts/setup``:
``python bench/cli_overhead.py [--calls 2,20] [--repeat 3]``; the last line is one JSON
object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from durable_harness.adapters.claude_code.spec import find_claude
from durable_harness.sandbox.agent_user import AgentUser, agent_user, as_agent
from durable_harness.testing.fake_model import FakeModelServer

PROMPT = "run the numbered steps"
FINAL = "All steps ran."
ROOT = Path(__file__).resolve().parent.parent


def script(calls: int, first_token_ms: int, chunk_ms: int) -> str:
    """Rule k answers the tool result ``S<k-1>`` with the call for ``S<k>``."""
    timing = f"reply.delay_ms = {first_token_ms}\nreply.chunk_delay_ms = {chunk_ms}\n"
    rules = [
        f'[[rule]]\nname = "final"\nwhen.last_tool_result = "S{calls:03d}"\n'
        f'reply.text = "{FINAL}"\n{timing}'
    ]
    for k in range(calls, 0, -1):
        when = (
            f'when.last_tool_result = "S{k - 1:03d}"'
            if k > 1
            else f'when.last_user_text = "{PROMPT}"'
        )
        command = f"printf 'S%03d' {k}"
        rules.append(
            f'[[rule]]\nname = "call-{k}"\n{when}\n'
            f'reply.tool_use = [ {{ name = "Bash", input = {{ command = "{command}", '
            f'description = "step {k}" }} }} ]\n{timing}'
        )
    # Claude Code's side requests (a title, a topic): a short answer, not a step.
    rules.append('[[rule]]\nname = "other"\nreply.text = "ok"\n')
    return "\n".join(rules)


def _folder(parent: Path, name: str) -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    os.chmod(folder, 0o777)  # the agent user writes here (a bench folder, thrown away)
    return folder


def bare(claude: str, base_url: str, work: Path, user: AgentUser | None) -> float:
    home, workspace = _folder(work, "home"), _folder(work, "ws")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "bench-key",
        "IS_SANDBOX": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    argv = [claude, "-p", PROMPT, "--output-format", "json", "--dangerously-skip-permissions"]
    argv = as_agent(user, argv)  # the account (and limits) the harness runs it with
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=workspace, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or FINAL.encode() not in done.stdout:
        raise SystemExit(f"bare claude failed ({done.returncode}): {done.stdout[-800:]!r}")
    return elapsed


def harness(base_url: str, work: Path, profile: Path | None = None) -> float:
    workspace = _folder(work, "ws")
    env = {
        **os.environ,
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "bench-key",
        "DURABLE_HARNESS_WORLD": "local",
        "DURABLE_HARNESS_DATA_DIR": str(work / "world"),
        "DURABLE_HARNESS_UNSAFE_HOST_AGENT": "1",
    }
    head = (
        [sys.executable, "-m"]
        if profile is None
        else [sys.executable, "-m", "cProfile", "-o", str(profile), "-m"]
    )
    argv = [
        *head,
        "durable_harness.cli",
        "run",
        "--agent",
        "claude-code",
        "--workspace",
        str(workspace),
        PROMPT,
    ]
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or FINAL.encode() not in done.stdout:
        raise SystemExit(
            f"harness run failed ({done.returncode}): {done.stdout[-400:]!r} {done.stderr[-800:]!r}"
        )
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", default="2,20", help="tool calls per turn, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--first-token-ms", type=int, default=0)
    parser.add_argument("--chunk-ms", type=int, default=0)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    sizes = sorted({int(n) for n in args.calls.split(",")})
    claude = find_claude()
    user = agent_user()
    figures: dict[str, Any] = {"cli": "claude-code", "where": "host", "runs": {}}
    with tempfile.TemporaryDirectory(prefix="dh-bench-cli-") as tmp:
        os.chmod(tmp, 0o755)
        for n in sizes:
            path = Path(tmp) / f"script-{n}.toml"
            path.write_text(script(n, args.first_token_ms, args.chunk_ms))
            with FakeModelServer(path) as server:
                server.start()
                times: dict[str, list[float]] = {"bare": [], "harness": []}
                for r in range(args.repeat):
                    run = Path(tmp) / f"{n}-{r}"
                    times["bare"].append(bare(claude, server.url, run / "bare", user))
                    times["harness"].append(harness(server.url, run / "harness"))
                    shutil.rmtree(run, ignore_errors=True)
                medians = {k: statistics.median(v) for k, v in times.items()}
                figures["runs"][n] = {**medians, "ratio": medians["harness"] / medians["bare"]}
                print(
                    f"{n:>4} calls: bare {medians['bare']:.2f} s, harness "
                    f"{medians['harness']:.2f} s, ratio {figures['runs'][n]['ratio']:.2f}x"
                )
                if args.profile and n == sizes[-1]:
                    prof = Path(tmp) / "worker.prof"
                    harness(server.url, Path(tmp) / "profiled", prof)
                    import pstats

                    pstats.Stats(str(prof)).sort_stats("cumulative").print_stats(25)
    if len(sizes) >= 2:
        lo, hi = figures["runs"][sizes[0]], figures["runs"][sizes[-1]]
        added = [(run["harness"] - run["bare"]) for run in (lo, hi)]
        per_call = (added[1] - added[0]) / (sizes[-1] - sizes[0])
        per_turn = added[0] - per_call * sizes[0]
        figures |= {"added_ms_per_tool_call": per_call * 1000, "added_s_per_turn": per_turn}
        print(f"added per tool call {per_call * 1000:.0f} ms, per turn {per_turn:.2f} s")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
