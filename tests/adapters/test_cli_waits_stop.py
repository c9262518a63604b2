"""The wait gate's stop mode (cli_waits), for CLIs without a ``defer`` hook decision, on a
real local World: a pending wait stops the CLI (``stop``) and leaves its intent open;
``settle`` then records the outcome once the signal came or the deadline passed, and parks
again (raises) while still pending. The real-CLI scenarios are in test_stop_mode_waits.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_harness.adapters.cli.waits import WaitGate
from durable_harness.core.errors import TurnSuspended
from durable_harness.core.types import StepStatus
from durable_harness.harness.journal import Journal, decode_output
from durable_harness.worlds.local import LocalWorld


@pytest.fixture
def world(tmp_path: Path) -> Iterator[LocalWorld]:
    with LocalWorld(tmp_path) as w:
        w.create_session("s")
        w.create_turn("s", "t", "prompt", {"agent": "codex"})
        yield w


def _gate(world: LocalWorld) -> WaitGate:
    lease = world.claim_turn("t", "w", 30, force=True)
    assert lease is not None
    return WaitGate(world, Journal(world, lease), "s")


def test_a_pending_wait_stops_the_cli_and_settles_when_its_signal_comes(
    world: LocalWorld,
) -> None:
    gate = _gate(world)
    stopped: list[TurnSuspended] = []

    def stop(exc: TurnSuspended) -> None:
        stopped.append(exc)
        threading.Timer(0.1, gate.stopped.set).start()  # the adapter kills the CLI

    gate.stop = stop
    reply = gate.pre_tool_use("wait_for_signal", {"name": "ci", "timeout_seconds": 60}, "c1")
    # Never `defer` (a CLI without it would run the tool): deny, once the CLI is stopped.
    assert reply["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert gate.stopped.is_set() and len(stopped) == 1 and stopped[0].signal == "ci"
    assert world.load_steps("t")[0].status is StepStatus.INTENT

    # The next delivery: still pending -> parks again, nothing recorded.
    gate = _gate(world)
    with pytest.raises(TurnSuspended):
        gate.settle()
    assert world.load_steps("t")[0].status is StepStatus.INTENT

    world.send_signal("t", "ci", '{"status": "failed"}')
    gate = _gate(world)
    gate.settle()
    (step,) = world.load_steps("t")
    assert step.status is StepStatus.DONE
    assert "failed" in decode_output(world, step)["content"]


def test_settle_records_a_timeout_from_the_intents_start(world: LocalWorld) -> None:
    gate = _gate(world)
    gate.stop = lambda exc: gate.stopped.set()
    gate.pre_tool_use("wait_for_signal", {"name": "ci", "timeout_seconds": 0.2}, "c1")
    gate = _gate(world)
    threading.Event().wait(0.3)  # the deadline counts from the intent, not from settle
    gate.settle()
    (step,) = world.load_steps("t")
    assert step.status is StepStatus.DONE
    assert decode_output(world, step)["content"].startswith("timed out")
