"""Cancelling a turn of the built-in agent on the local World, in this process: while it
is queued, while it waits (a durable wait), and while it runs (a slow model reply); each
ends ``cancelled`` and no step begins after the cancel. The Claude Code turn in Docker
is tests/adapters/test_claude_cancel.py. The session's next turn continues from what the
cancelled one finished."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from durable_harness.cli import main
from durable_harness.core.errors import NotFound, TurnCancelled
from durable_harness.core.settings import Settings
from durable_harness.core.types import StepStatus, TurnStatus
from durable_harness.runtime.api import enqueue_turn, journaled_turn, run_turn, run_worker
from durable_harness.runtime.cancel import request_cancel
from durable_harness.runtime.worker import TurnOutcome, Worker
from durable_harness.testing.fake_model import FakeModelServer
from durable_harness.worlds.local import LocalWorld

#: The model's slow reply (seconds): the cancel comes while it is being written.
SLOW_S = 2.0

SCRIPT = f"""
[[rule]]
name = "read back"
when.last_tool_name = "read"
when.last_tool_result = "ALPHA-1"
reply.text = "a.txt still holds ALPHA-1"

[[rule]]
name = "continue"
when.last_user_text = "Continue"
when.conversation = "not run: the turn was cancelled (user pressed stop)"
reply.tool_use = [{{ name = "read", input = {{ path = "a.txt" }} }}]

[[rule]]
name = "wait"
when.last_user_text = "Wait for CI"
reply.tool_use = [{{ name = "wait_for_signal", input = {{ name = "ci", timeout_seconds = 3600 }} }}]

[[rule]]
name = "slow"
when.last_tool_name = "write"
reply.delay_ms = {int(SLOW_S * 1000)}
reply.tool_use = [{{ name = "write", input = {{ path = "b.txt", content = "too late" }} }}]

[[rule]]
name = "first write"
when.last_user_text = "Write two files"
reply.tool_use = [{{ name = "write", input = {{ path = "a.txt", content = "ALPHA-1" }} }}]

[[rule]]
name = "queued"
reply.text = "ran"
"""


def test_cancel_queued_waiting_and_running_turns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "script.toml"
    script.write_text(SCRIPT)
    log = tmp_path / "fake-model.jsonl"
    settings = Settings(lease_seconds=5, poll_seconds=0.05, cancel_poll_seconds=0.2)
    with (
        FakeModelServer(script, log_path=log) as server,
        LocalWorld(tmp_path / "world") as world,
    ):
        server.start()
        rules = lambda: log.read_text().splitlines() if log.exists() else []  # noqa: E731

        # Queued: no worker has seen it; the next one ends it before anything runs.
        queued = enqueue_turn(world, "Do it", base_url=server.url, settings=settings)
        assert request_cancel(world, queued.turn_id, "not needed any more")
        assert world.get_turn(queued.turn_id).status is TurnStatus.QUEUED  # durable, not yet
        assert run_worker(world, settings=settings) == 1
        ended = world.get_turn(queued.turn_id)
        assert (ended.status, ended.error) == (TurnStatus.CANCELLED, "not needed any more")
        assert world.load_steps(queued.turn_id) == [] and rules() == []
        assert not request_cancel(world, queued.turn_id)  # already finished: nothing recorded

        # Waiting: parked on a signal with no worker; the cancel wakes it and ends it.
        waiting = run_turn(world, "Wait for CI", base_url=server.url, settings=settings)
        assert waiting.status is TurnStatus.WAITING
        assert request_cancel(world, waiting.turn_id, "CI is not coming")
        lease = world.claim("worker", settings.lease_seconds)  # woken now, not in an hour
        assert lease is not None and lease.turn_id == waiting.turn_id
        assert Worker(world, settings).drive(lease) == TurnOutcome.CANCELLED
        ended = world.get_turn(waiting.turn_id)
        assert (ended.status, ended.error) == (TurnStatus.CANCELLED, "CI is not coming")
        steps = world.load_steps(waiting.turn_id)
        assert [(s.kind, s.name, s.status) for s in steps] == [
            ("model", "claude-sonnet-4-5", StepStatus.DONE),
            ("tool", "wait_for_signal", StepStatus.INTENT),  # the wait never took a signal
        ]
        assert len(rules()) == 1  # the model was not asked again

        # Running: cancelled while the model writes its second reply; that step finishes,
        # the tool call it asks for never begins.
        outcome: dict[str, object] = {}
        started = time.monotonic()
        runner = threading.Thread(
            target=lambda: outcome.update(
                turn=run_turn(world, "Write two files", base_url=server.url, settings=settings)
            )
        )
        runner.start()
        deadline = time.monotonic() + 30
        while len(rules()) < 3 and time.monotonic() < deadline:  # the slow reply was asked
            time.sleep(0.02)
        assert len(rules()) == 3
        running = world.list_turns(limit=1)[0]
        assert running.status is TurnStatus.RUNNING
        assert request_cancel(world, running.turn_id, "user pressed stop")
        runner.join(timeout=SLOW_S + 10)
        assert not runner.is_alive()
        took = time.monotonic() - started
        ended = world.get_turn(running.turn_id)
        assert (ended.status, ended.error) == (TurnStatus.CANCELLED, "user pressed stop")
        assert ended.result is None and took < SLOW_S + 5, took
        steps = world.load_steps(running.turn_id)
        assert [(s.kind, s.name, s.status) for s in steps] == [
            ("model", "claude-sonnet-4-5", StepStatus.DONE),
            ("tool", "write", StepStatus.DONE),
            ("model", "claude-sonnet-4-5", StepStatus.DONE),  # mid-call at the cancel
        ]
        assert len(rules()) == 3

        # The session's next turn continues from what the cancelled one finished: its
        # conversation (the unrun tool call answered as such) and its workspace.
        later = run_turn(
            world, "Continue", session_id=running.session_id, base_url=server.url, settings=settings
        )
        assert (later.status, later.result) == (TurnStatus.DONE, "a.txt still holds ALPHA-1")

        # A custom harness's turn: once the cancel is seen, its next call raises, and
        # the turn ends cancelled; a later run of the program is told so.
        with (
            pytest.raises(TurnCancelled, match="stop the job"),
            journaled_turn(world, "job-1", prompt="p", lease_seconds=5) as job,
        ):
            job.tool_call("one", {}, lambda args: "1", replay="safe")
            assert request_cancel(world, "job-1", "stop the job")
            deadline = time.monotonic() + 10
            while job._journal.cancel.reason is None and time.monotonic() < deadline:
                time.sleep(0.02)
            job.tool_call("two", {}, lambda args: "2", replay="safe")
        assert world.get_turn("job-1").status is TurnStatus.CANCELLED
        assert [s.name for s in world.load_steps("job-1")] == ["one"]
        with pytest.raises(TurnCancelled), journaled_turn(world, "job-1", prompt="p"):
            pass

        # The command says what happened; an unknown turn is an error of the World.
        with pytest.raises(NotFound):
            request_cancel(world, "turn_nope")
    capsys.readouterr()
    data_dir = ["--data-dir", str(tmp_path / "world")]
    assert main(["cancel", running.turn_id, *data_dir]) == 0
    said = capsys.readouterr().out
    assert said == f"turn {running.turn_id} had already finished (cancelled); nothing to cancel\n"
    assert main(["cancel", "turn_nope", *data_dir]) == 2
    assert "turn_nope" in capsys.readouterr().err
    # The cancel signal is the harness's own: `signal` (and signal-server) refuse its name.
    assert main(["signal", queued.turn_id, "dh.cancel", *data_dir]) == 2
    assert "durable-harness cancel TURN" in capsys.readouterr().err
