"""A spend limit kept by the journaling proxy for the real Claude Code CLI (the pinned
version from scripts/setup, on a host folder) against the scripted fake model, whose
every reply reports 1100 tokens (``tests/fixtures/budget_claude.toml``: a loop that never
ends by itself). Every worker dies (``os._exit``) right after the next call it makes
returns, before its outcome is recorded: the budget, counting those lost calls, is what
ends the turn, within one model call."""

from __future__ import annotations

from pathlib import Path

from support import FIXTURES, ids_of, make_harness

from durable_harness.adapters.cli.host import UNSAFE_HOST_ENV
from durable_harness.harness.crash import CRASH_EXIT_CODE
from durable_harness.worlds import open_world

CALL = 1100
LIMIT = 6000


def test_claude_code_crashed_at_every_model_step_stops_within_one_call(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for h in make_harness(tmp_path, FIXTURES / "budget_claude.toml"):
        h.env[UNSAFE_HOST_ENV] = "1"
        h.env["DURABLE_HARNESS_MAX_TOKENS"] = "1000"  # a lost call: 1000 (+ the one before)
        h.env["DURABLE_HARNESS_MAX_ATTEMPTS"] = "30"  # the budget ends it, not the queue
        args = ["--agent", "claude-code", "--workspace", str(ws)]
        queued = h.cli("run", "--detach", *args, "--budget-turn-tokens", str(LIMIT), "Loop.")
        assert queued.returncode == 0, queued.stderr
        turn = ids_of(queued)["turn"]
        crashes = 0
        for _ in range(15):
            world = open_world("local", data_dir=h.env["DURABLE_HARNESS_DATA_DIR"])
            try:  # read here, not by a `show` process per crash
                top = max((s.seq for s in world.load_steps(turn)), default=-1)
            finally:
                world.close()
            # After the return of every step this worker begins (a tool's too): the new
            # model call it makes is lost, whichever seq it gets.
            plan = ",".join(f"{seq}:after_run" for seq in range(top + 1, top + 40))
            ran = h.cli("worker", "--until-idle", timeout=300, DURABLE_HARNESS_CRASH_AT=plan)
            if ran.returncode != CRASH_EXIT_CODE:
                assert ran.returncode == 0, ran.stderr
                break
            crashes += 1
        data = h.show(turn)
        assert data["turn"]["status"] == "failed", data["turn"]
        exceeded = data["turn"]["budget_exceeded"]
        assert exceeded is not None, data["turn"]["error"]
        assert (exceeded["scope"], exceeded["unit"], exceeded["limit"]) == ("turn", "tokens", LIMIT)
        assert exceeded["spent"] >= LIMIT
        assert crashes >= 2
        models = [s for s in data["steps"] if s["kind"] == "model"]
        lost = sum(s["attempts"] - (s["status"] == "done") for s in models)
        # A crash after a model call's return loses that call (one after a tool's: none).
        assert lost >= 2
        # Within one model call: a lost call counts at least what it was billed (1000 or
        # 2100 against 1100), so every call was begun under the limit and what the fake
        # model billed is below the limit plus one call.
        billed = h.server.request_count * CALL
        assert billed < LIMIT + CALL, (h.server.request_count, exceeded)
        assert "budget exceeded" in (data["turn"]["error"] or "")
