"""``durable-harness demo``: crash a turn on purpose, resume it, show what was saved.

Everything is real: the bundled fake model is an HTTP server, the crashed worker and the
resuming worker are separate processes, the crash is an ``os._exit`` at an exact step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from durable_harness.core.settings import Settings
from durable_harness.runtime.views import format_show, show_data
from durable_harness.testing.fake_model import FakeModelServer
from durable_harness.worlds import open_configured

PROMPT = "Refund order 42, then note the refund in refunds.md."
DEFAULT_CRASH = "3:after_run"  # the refund tool returned; its outcome is not recorded yet
LEASE_SECONDS = "3"


def demo_files() -> tuple[Path, Path]:
    base = Path(str(resources.files("durable_harness.testing.demo")))
    return base / "script.toml", base / "tools.py"


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_harness.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        check=False,
    )


def run_demo(data_dir: str | None, crash_at: str | None) -> int:
    root = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="durable-harness-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    script, tools = demo_files()
    ledger = root / "refund-ledger.txt"
    log = root / "fake-model.jsonl"
    with FakeModelServer(script, log_path=log) as server:
        server.start()
        env = {
            **os.environ,
            "ANTHROPIC_BASE_URL": server.url,
            "DURABLE_HARNESS_WORLD": "local",
            "DURABLE_HARNESS_DATA_DIR": str(root / "world"),
            "DURABLE_HARNESS_LEASE_SECONDS": LEASE_SECONDS,
            "DURABLE_HARNESS_DEMO_LEDGER": str(ledger),
            # The resuming worker runs a turn's tools file only if its operator registered
            # it: the turn is data from the World, the worker's settings are the policy.
            "DURABLE_HARNESS_TOOL_SETS": str(tools),
        }
        env.pop("ANTHROPIC_API_KEY", None)  # the demo never needs a provider key
        print(f"durable-harness demo (World: {root / 'world'}, fake model: {server.url})\n")
        print(f"1. A worker runs: {PROMPT!r}")
        print(
            f"   and is killed at step {crash_at or DEFAULT_CRASH} "
            "(os._exit: no cleanup, lease not released)\n",
            flush=True,
        )
        crashed = _cli(
            ["run", "--tools", f"{tools}:TOOLS", PROMPT],
            {**env, "DURABLE_HARNESS_CRASH_AT": crash_at or DEFAULT_CRASH},
        )
        ids = dict(line.split(" ", 1) for line in crashed.stdout.splitlines() if " " in line)
        turn_id = ids.get("turn")
        if turn_id is None:
            print("the turn did not start; see the error above", file=sys.stderr)
            return 1
        calls_before = server.request_count
        print(
            f"\n   worker exited with code {crashed.returncode}; "
            f"{calls_before} model call(s) so far\n"
        )
        settings = Settings.load(world="local", data_dir=root / "world")
        with open_configured(settings) as world:
            print(format_show(show_data(world, turn_id, settings.price_table())), "\n")
        print(
            "2. A new worker resumes the turn once the dead worker's lease runs out\n", flush=True
        )
        resumed = _cli(["resume", turn_id], env)
        print(f"\n   reply: {resumed.stdout.strip()}\n")
        with open_configured(settings) as world:
            data = show_data(world, turn_id, settings.price_table())
        print(format_show(data), "\n")
        replayed_models = sum(
            1 for s in data["steps"] if s["kind"] == "model" and s["how"] == "replayed"
        )
        refunds = ledger.read_text().splitlines() if ledger.exists() else []
        print("3. What the journal saved")
        print(
            f"   model calls answered by the model: {server.request_count} "
            f"({calls_before} before the crash, {server.request_count - calls_before} after)"
        )
        print(f"   model calls read back from the journal instead of paid again: {replayed_models}")
        saved = data["turn"]["saved_usd"]
        money = "unknown (no price for the model)" if saved is None else f"${saved:.4f}"
        print(f"   what those calls would have cost again, at list prices: {money}")
        print(f"   refunds in the ledger: {len(refunds)} (the 'never' tool did not run twice)")
        for line in refunds:
            print(f"     {line}")
        where = f"DURABLE_HARNESS_DATA_DIR={root / 'world'}"
        print(f"\n   inspect: {where} durable-harness show {turn_id}")
        return 0 if resumed.returncode == 0 and len(refunds) == 1 else 1
