"""A turn's event log through worker deaths: the built-in agent on the local World, its
worker killed at every crash point of a model and a tool step and SIGKILLed while a model
reply streams, restarted each time; the log ends gap-free, each event once, each
interrupted attempt marked before the next one, the text of every model step exact."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import FIXTURES, Harness, ids_of, make_harness

from durable_harness.core.types import StepStatus
from durable_harness.harness.crash import CRASH_EXIT_CODE
from durable_harness.harness.events import read_all
from durable_harness.harness.journal import decode_output
from durable_harness.worlds.local import LocalWorld

PROMPT = "Write the note, then read it back."
REPLY = "The note says hello events, written once and read back."
CRASHES = [
    f"{seq}:{point}" for seq in (0, 1) for point in ("after_intent", "after_run", "after_outcome")
]


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    for harness in make_harness(tmp_path, FIXTURES / "events.toml"):
        harness.env["DURABLE_HARNESS_MAX_ATTEMPTS"] = "20"  # eight deaths, not a dead letter
        yield harness


def test_the_log_survives_every_crash_and_streams_text_live(h: Harness) -> None:
    out = h.cli("run", "--detach", PROMPT)
    assert out.returncode == 0, out.stderr
    turn_id = ids_of(out)["turn"]
    for point in CRASHES:
        crashed = h.cli("worker", "--until-idle", DURABLE_HARNESS_CRASH_AT=point)
        assert crashed.returncode == CRASH_EXIT_CODE, (point, crashed.stderr)

    world = LocalWorld(Path(h.env["DURABLE_HARNESS_DATA_DIR"]))
    # Live text: the slow reply of step 2 is in the log while it streams, before its
    # step.finished; the worker is SIGKILLed there, mid-stream.
    streaming = h.popen("worker", "--until-idle")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        keys = {e.key for e in read_all(world, turn_id)}
        if any(k.startswith("step:2:1:delta:") for k in keys):
            break
        time.sleep(0.02)
    else:
        pytest.fail("no text of step 2 reached the log while it streamed")
    assert "step:2:finished" not in keys
    os.killpg(streaming.pid, signal.SIGKILL)
    streaming.communicate(timeout=10)
    last = h.cli("worker", "--until-idle")
    assert last.returncode == 0, last.stderr

    events = read_all(world, turn_id)
    steps = world.load_steps(turn_id)
    turn = world.get_turn(turn_id)
    texts = {s.seq: decode_output(world, s) for s in steps if s.kind == "model"}
    world.close()
    keys = [e.key for e in events]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(set(keys)) == len(keys)
    assert events[0].kind == "turn.created" and events[-1].kind == "turn.ended"
    assert events[-1].data == {"status": "done", "result": turn.result, "error": None}
    assert turn.result == REPLY  # what a run without crashes replies (the script's)
    at = {key: i for i, key in enumerate(keys)}

    # Seven workers died; each attempt is lost before the next one starts.
    started = [e for e in events if e.kind == "attempt.started"]
    assert len(started) == len(CRASHES) + 2
    for dead, after in itertools.pairwise(started):
        assert at[f"attempt:{dead.data['epoch']}:lost"] < at[after.key]

    assert [s.status for s in steps] == [StepStatus.DONE] * 5
    assert [s.attempts for s in steps] == [3, 3, 2, 1, 1]
    for step in steps:
        finished = events[at[f"step:{step.seq}:finished"]]
        assert finished.data["attempt"] == step.attempts
        assert at[f"step:{step.seq}:{step.attempts}:started"] < at[finished.key]
        for attempt in range(1, step.attempts):  # every earlier attempt was interrupted
            abandoned = at[f"step:{step.seq}:{attempt}:abandoned"]
            assert at[f"step:{step.seq}:{attempt}:started"] < abandoned
            assert abandoned < at[f"step:{step.seq}:{attempt + 1}:started"]
        if step.kind == "model":
            reply = texts[step.seq]
            text = "".join(b["text"] for b in reply["content"] if b["type"] == "text")
            pieces = [
                e.data["text"]
                for e in events
                if e.kind == "text.delta"
                and e.data["seq"] == step.seq
                and e.data["attempt"] == step.attempts
            ]
            assert "".join(pieces) == text, step.seq
            assert finished.data["output"] == text
            assert set(finished.data["meta"]) == {
                "input_tokens",
                "output_tokens",
                "cache_read_tokens",
                "cache_write_tokens",
            }
    # The killed attempt's text is in the log, marked abandoned, and apart from the reply.
    cut = [e.data["text"] for e in events if e.key.startswith("step:2:1:delta:")]
    assert cut and at["step:2:1:abandoned"] > at["step:2:1:delta:0"]
    from collections import Counter

    print(Counter(e.kind for e in events))
