"""OpenTelemetry export (runtime/telemetry/) against a real OTLP/HTTP receiver.

The receiver (``otlp_receiver.py``) is its own process and decodes what arrives with
opentelemetry-proto. The turns are the demo's, run by the real CLI against the scripted
fake model; the crash is the project's crash injection (``os._exit`` at an exact step).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import (
    DEMO,
    DEMO_PROMPT,
    DEMO_REPLY,
    DEMO_TOOLS,
    Harness,
    ids_of,
    make_harness,
    wait_for,
)

from durable_harness.core.types import Lease, StepStatus, Turn, TurnStatus
from durable_harness.harness.crash import CRASH_EXIT_CODE
from durable_harness.runtime.telemetry import new_trace_id, trace_id_of
from durable_harness.runtime.telemetry.traces import delivery_span_id
from durable_harness.worlds.local import LocalWorld

RECEIVER = Path(__file__).with_name("otlp_receiver.py")
DELIVERY = "turn delivery"
GAUGES = {
    "durable_harness.turns.queued",
    "durable_harness.turns.waiting",
    "durable_harness.turns.dead_lettered",
}


@dataclass
class Receiver:
    url: str
    out: Path

    def records(self, signal: str) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        rows = [json.loads(line) for line in self.out.read_text().splitlines() if line]
        errors = [r for r in rows if r["signal"] == "error"]
        assert not errors, errors  # every body the exporters sent decoded
        return [r for r in rows if r["signal"] == signal]

    def env(self) -> dict[str, str]:
        """The standard variables, with short intervals so the test does not wait."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
        }


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    out = tmp_path / "otlp.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(RECEIVER), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on " in line, (line, proc.stderr.read() if proc.stderr else "")
        yield Receiver(line.split("listening on ", 1)[1].strip(), out)
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Harness]:
    yield from make_harness(tmp_path, DEMO / "script.toml")


def stored_turn(h: Harness, turn_id: str) -> tuple[Turn, dict[int, Any]]:
    with LocalWorld(h.tmp / "world") as world:
        return world.get_turn(turn_id), {s.seq: s for s in world.load_steps(turn_id)}


def test_a_crashed_and_resumed_turn_is_one_trace(demo: Harness, receiver: Receiver) -> None:
    """The demo turn dies at the `never` refund (its call ran, its outcome was not
    recorded) and a second worker process finishes it; both export to the receiver."""
    otel = receiver.env()
    crashed = demo.cli(
        "run", "--tools", DEMO_TOOLS, DEMO_PROMPT, DURABLE_HARNESS_CRASH_AT="3:after_run", **otel
    )
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    turn_id = ids_of(crashed)["turn"]
    worker = demo.cli("worker", "--until-idle", **otel)
    assert worker.returncode == 0, worker.stderr
    turn, steps = stored_turn(demo, turn_id)
    assert turn.status is TurnStatus.DONE and turn.result == DEMO_REPLY and turn.attempts == 2

    spans = wait_for(
        lambda: (
            [
                s
                for s in receiver.records("span")
                if s["attributes"].get("durable_harness.turn.id") == turn_id
            ]
            if any(
                s["name"] == DELIVERY and s["attributes"].get("durable_harness.outcome") == "done"
                for s in receiver.records("span")
            )
            else None
        ),
        30,
        "the receiver",
    )
    # One trace, the one stored with the turn at enqueue.
    assert {s["trace_id"] for s in spans} == {turn.config["trace_id"]}
    assert spans[0]["resource"]["service.name"] == "durable-harness"

    # Two deliveries, both roots of the trace: the dead one exported by the next worker
    # under the span id its own step spans (if any got out) name as their parent.
    deliveries = {
        s["attributes"]["durable_harness.delivery"]: s for s in spans if s["name"] == DELIVERY
    }
    assert sorted(deliveries) == [1, 2]
    first, second = deliveries[1], deliveries[2]
    assert first["parent_span_id"] == second["parent_span_id"] == ""
    assert first["attributes"]["durable_harness.outcome"] == "lost"
    assert first["attributes"]["durable_harness.delivery.reconstructed"] is True
    assert first["status"] == 2  # STATUS_CODE_ERROR
    trace_id = int(turn.config["trace_id"], 16)
    assert first["span_id"] == f"{delivery_span_id(trace_id, 1):016x}"
    assert second["attributes"]["durable_harness.outcome"] == "done"
    assert second["attributes"]["durable_harness.epoch"] == turn.epoch
    assert second["attributes"]["durable_harness.session.id"] == turn.session_id
    assert second["attributes"]["durable_harness.agent"] == "builtin"
    assert first["start_ns"] < second["start_ns"]

    step_spans = [s for s in spans if s["name"] != DELIVERY]
    assert {s["parent_span_id"] for s in step_spans} <= {first["span_id"], second["span_id"]}
    resumed = {
        s["attributes"]["durable_harness.step.seq"]: s
        for s in step_spans
        if s["parent_span_id"] == second["span_id"]
    }
    assert sorted(resumed) == sorted(steps)  # every step, once, in the second delivery

    # Steps 0-2 were finished by the dead worker: read back, not run again.
    for seq in (0, 1, 2):
        attributes = resumed[seq]["attributes"]
        assert attributes.get("durable_harness.step.replayed") is True, attributes
    model_read_back = resumed[0]["attributes"]
    assert resumed[0]["name"] == f"chat {steps[0].name}"
    assert model_read_back["gen_ai.operation.name"] == "chat"
    assert model_read_back["durable_harness.replayed.input_tokens"] == steps[0].meta["input_tokens"]
    assert not any(k.startswith("gen_ai.usage.") for k in model_read_back)  # not paid again
    assert resumed[1]["name"] == "execute_tool check_refund"
    assert resumed[1]["attributes"]["gen_ai.tool.name"] == "check_refund"

    # Step 3, the `never` refund, possibly ran: finished unrun.
    assert steps[3].status is StepStatus.POSSIBLY_RAN
    assert resumed[3]["name"] == "execute_tool refund"
    assert resumed[3]["attributes"]["durable_harness.step.possibly_ran"] is True
    assert "durable_harness.step.replayed" not in resumed[3]["attributes"]

    # The live model steps carry the GenAI attributes with the usage the fake model
    # reported (what the journal recorded from its response).
    live_models = [seq for seq, s in steps.items() if s.kind == "model" and seq > 3]
    assert live_models
    for seq in live_models:
        span, step = resumed[seq], steps[seq]
        attributes = span["attributes"]
        assert span["name"] == f"chat {step.name}" and span["kind"] == 3  # SPAN_KIND_CLIENT
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == step.name
        assert attributes["gen_ai.provider.name"] == "anthropic"
        assert attributes["gen_ai.usage.input_tokens"] == step.meta["input_tokens"] > 0
        assert attributes["gen_ai.usage.output_tokens"] == step.meta["output_tokens"] > 0
        assert "durable_harness.step.replayed" not in attributes
        assert span["start_ns"] < span["end_ns"]

    # Names, ids and counts only: no prompt, no model text, no tool output.
    exported = json.dumps(receiver.records("span"))
    for text in (DEMO_PROMPT, DEMO_REPLY, "Let me check order 42", "refund issued", "order 42"):
        assert text not in exported

    # The worker exported the World's gauges too.
    points = wait_for(lambda: receiver.records("metric"), 30, "the receiver")
    assert {p["name"] for p in points} >= GAUGES


def test_gauges_count_queued_waiting_and_dead_lettered_turns(
    demo: Harness, receiver: Receiver
) -> None:
    """`serve` exports the gauges of the World it serves: one turn of each kind."""
    with LocalWorld(demo.tmp / "world", max_attempts=1) as world:

        def claimed(turn_id: str) -> Lease:
            world.create_session(f"s-{turn_id}")
            world.create_turn(f"s-{turn_id}", turn_id, "p", {"agent": "builtin"})
            lease = world.claim("test", 30.0)
            assert lease is not None and lease.turn_id == turn_id
            return lease

        world.suspend(claimed("waiting"), time.time() + 3600, "a signal")
        world.complete_turn(claimed("done"), "ok")
        world.release(claimed("dead"), error="boom")  # its one delivery is used up
        assert world.claim("test", 30.0) is None  # "dead" is dead-lettered instead
        world.create_session("s-queued")
        world.create_turn("s-queued", "queued", "p", {"agent": "builtin"})
        counts = world.count_turns()
    assert (counts.queued, counts.waiting, counts.dead_lettered, counts.done) == (1, 1, 1, 1)

    proc = demo.popen("serve", "--port", "0", **receiver.env())
    try:

        def latest() -> dict[str, Any] | None:
            values = {p["name"]: p for p in receiver.records("metric")}
            return values if set(values) >= GAUGES else None

        values = wait_for(latest, 30, "the receiver")
        assert all(values[name]["type"] == "gauge" for name in GAUGES)
        assert all(values[name]["unit"] == "{turn}" for name in GAUGES)
        assert values["durable_harness.turns.queued"]["value"] == 1
        assert values["durable_harness.turns.waiting"]["value"] == 1
        assert values["durable_harness.turns.dead_lettered"]["value"] == 1
    finally:
        proc.terminate()
        proc.communicate(timeout=15)


def test_without_an_endpoint_nothing_of_opentelemetry_is_imported(demo: Harness) -> None:
    """A turn run end to end with no OTLP endpoint: the SDK and the exporter are installed
    here, yet never imported (the bare API may be: the anthropic SDK imports it when it is
    present); with an endpoint and no SDK importable, one line says what to install."""
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['durable-harness', *sys.argv[1:]]\n"
        "try:\n"
        "    runpy.run_module('durable_harness.cli', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "ours = ('opentelemetry.sdk', 'opentelemetry.exporter', 'opentelemetry.proto',\n"
        "        'durable_harness.runtime.telemetry.')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(ours))\n"
        "print('LOADED', loaded, file=sys.stderr)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe, "run", "--tools", DEMO_TOOLS, DEMO_PROMPT],
        env=demo.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "LOADED []" in run.stderr, run.stderr
    assert "refund" in run.stderr  # the turn did run (its steps were printed)

    missing = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if the otel extra were not installed\n"
        "from durable_harness.runtime.telemetry import telemetry, Telemetry\n"
        "assert type(telemetry()) is Telemetry\n"
        "assert type(telemetry()) is Telemetry\n"
    )
    env = {**demo.env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    out = subprocess.run(
        [sys.executable, "-c", missing], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "durable-harness[otel]" in lines[0], out.stderr


def test_a_stored_trace_id_is_used_only_if_valid() -> None:
    """The stored trace id is the enqueuer's, so untrusted: anything but 32 lowercase hex
    (not all zeros) gives way to the one derived from the turn id."""

    def turn(trace_id: object, turn_id: str = "turn_a") -> Turn:
        config = {"agent": "builtin", "trace_id": trace_id}
        return Turn(turn_id, "ses", 0, "p", TurnStatus.QUEUED, config, 0.0)

    good = new_trace_id()
    assert trace_id_of(turn(good)) == good
    derived = trace_id_of(turn(None))
    assert len(derived) == 32 and int(derived, 16) != 0
    for bad in (good.upper(), "0" * 32, good[:31], good + "0", f"{good[:31]}g", 42, [good]):
        assert trace_id_of(turn(bad)) == derived
    assert trace_id_of(turn(None, "turn_b")) != derived


def test_a_collector_that_is_down_fails_no_turn(demo: Harness) -> None:
    """Nothing listens at the endpoint: the exporter's retries are its own business, the
    turn runs to its reply as it would without telemetry."""
    closed = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    out = demo.cli("run", "--tools", DEMO_TOOLS, DEMO_PROMPT, **closed)
    assert out.returncode == 0, out.stderr
    turn, _steps = stored_turn(demo, ids_of(out)["turn"])
    assert turn.status is TurnStatus.DONE and turn.result == DEMO_REPLY
