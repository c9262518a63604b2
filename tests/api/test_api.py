"""The public Python API (durable_harness/runtime/api.py), in this process: opening Worlds from
URLs, the lazy package namespace, turns of any agent, and a custom harness's journaled
turn (replay rules, divergence, replay of a finished turn, the lease, a worker's part).

The crash matrix of the two example programs is tests/api/test_custom_harness.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from support import DEMO, DEMO_PROMPT, DEMO_REPLY, DEMO_TOOLS

import durable_harness
from durable_harness import (
    JournaledTurn,
    TurnStatus,
    World,
    enqueue_turn,
    journaled_turn,
    open_world,
    run_turn,
    run_worker,
)
from durable_harness.adapters.custom.adapter import WAITING_FOR
from durable_harness.core.errors import (
    ConfigError,
    LeaseLost,
    ReplayDivergence,
    ToolDefinitionError,
    WorldError,
)
from durable_harness.core.types import StepStatus
from durable_harness.harness.tools import ABSENT, Checked, ToolContext, done, tool
from durable_harness.testing.fake_model import FakeModelServer
from durable_harness.worlds.local import LocalWorld

# -- open_world -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://example.com/world", "unknown World URL scheme 'http'"),
        ("redis://localhost", "use one of postgresql://, s3sqs://, local:///path"),
        ("nonsense", "unknown World 'nonsense'; known Worlds: local, postgres, s3sqs"),
        ("", "give a World URL"),
        ("   ", "give a World URL"),
        ("local://relative/folder", "local:///absolute/path (three slashes)"),
        ("local://", "local:///absolute/path (three slashes)"),
        ("file://otherhost/srv/world", "a folder on this machine"),
        ("s3sqs://", "the s3sqs World needs a bucket"),
        ("s3sqs://bucket/prefix", "the s3sqs World needs a queue"),
    ],
)
def test_open_world_refuses_bad_urls(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        open_world(url)
    assert says in str(caught.value)


def test_open_world_says_when_a_database_is_unreachable() -> None:
    with pytest.raises(WorldError, match=r"cannot reach PostgreSQL at 127\.0\.0\.1:9"):
        open_world("postgresql://user:secret@127.0.0.1:9/db")


def test_open_world_refuses_a_non_string() -> None:
    with pytest.raises(ConfigError, match="give a World URL"):
        open_world(42)  # type: ignore[arg-type]


def test_open_world_refuses_an_unknown_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) max_attemps; the settings are"):
        open_world(f"local://{tmp_path}", max_attemps=3)


@pytest.mark.parametrize("form", ["local://{}", "file://{}", "{}"])
def test_open_world_opens_a_local_folder(tmp_path: Path, form: str) -> None:
    folder = tmp_path / "world"
    with open_world(form.format(folder)) as world:
        assert isinstance(world, LocalWorld)
        world.create_session("ses_1")
    assert (folder).is_dir()


def test_open_world_by_name_takes_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_HARNESS_DATA_DIR", str(tmp_path / "from-env"))
    monkeypatch.setenv("DURABLE_HARNESS_WORLD", "local")
    with open_world() as world, open_world("local") as named:
        assert isinstance(world, LocalWorld) and isinstance(named, LocalWorld)
    assert (tmp_path / "from-env").is_dir()


# -- the package namespace ------------------------------------------------------------


def test_import_is_lazy() -> None:
    """`import durable_harness` loads only its version (a bottom-layer module); the API
    loads no backend or SDK."""
    code = (
        "import sys, durable_harness\n"
        "print(sorted(m for m in sys.modules if m.startswith('durable_harness')))\n"
        "from durable_harness import journaled_turn, open_world, run_turn, tool\n"
        "heavy = ('anthropic', 'openai', 'psycopg', 'boto3', 'docker',\n"
        "         'durable_harness.worlds.local', 'durable_harness.adapters.builtin.agent')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = "['durable_harness', 'durable_harness.core', 'durable_harness.core.version']"
    assert out.stdout.splitlines() == [loaded, "[]"]


def test_every_public_name_resolves() -> None:
    for name in durable_harness.__all__:
        assert getattr(durable_harness, name) is not None, name
    assert set(durable_harness.__all__) == {*durable_harness._EXPORTS, "__version__"}
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = durable_harness.nope  # type: ignore[attr-defined]


# -- turns of any agent ---------------------------------------------------------------


@pytest.fixture
def world(tmp_path: Path) -> Any:
    with open_world(f"local://{tmp_path / 'world'}") as w:
        yield w


def test_run_turn_and_enqueue_turn_drive_the_builtin_agent(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger.txt"
    monkeypatch.setenv("DURABLE_HARNESS_DEMO_LEDGER", str(ledger))
    with FakeModelServer(DEMO / "script.toml") as server:
        done = run_turn(world, DEMO_PROMPT, tools=[DEMO_TOOLS], base_url=server.url)
        assert done.status is TurnStatus.DONE and done.result == DEMO_REPLY
        queued = enqueue_turn(world, DEMO_PROMPT, tools=[DEMO_TOOLS], base_url=server.url)
        assert queued.status is TurnStatus.QUEUED
        assert run_worker(world) == 1
    assert world.get_turn(queued.turn_id).result == DEMO_REPLY
    # The second turn's check found the first turn's refund and did not refund again.
    assert len(ledger.read_text().splitlines()) == 1


def test_enqueue_turn_checks_the_configuration(world: World) -> None:
    with pytest.raises(ConfigError, match="unknown agent 'nobody'"):
        enqueue_turn(world, "hi", agent="nobody")
    with pytest.raises(ConfigError, match="run by its own program"):
        enqueue_turn(world, "hi", agent="custom")
    with pytest.raises(ConfigError, match=r"list of 'path/to/file\.py:NAME' specs"):
        enqueue_turn(world, "hi", tools="tools.py:TOOLS")


# -- a custom harness -----------------------------------------------------------------


class Effects:
    """Calls of the functions a test journals, counted."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def model(self, text: str) -> Any:
        def call() -> dict[str, Any]:
            self.calls.append(f"model:{text}")
            return {"content": [{"type": "text", "text": text}], "pair": (1, 2)}

        return call

    def tool(self, name: str, *, fail: bool = False) -> Any:
        def fn(args: dict[str, Any]) -> str:
            self.calls.append(f"{name}:{args}")
            if fail:
                raise RuntimeError(f"{name} died")
            return f"{name} ran"

        return fn


def test_finished_steps_are_read_back_and_a_finished_turn_replays(world: World) -> None:
    fx = Effects()
    with journaled_turn(world, "turn_a", prompt="p") as turn:
        assert not turn.replaying
        reply = turn.model_call({"model": "m", "q": 1}, fx.model("hello"))
        # Live and replayed values are the same JSON: the tuple is a list both times.
        assert reply == {"content": [{"type": "text", "text": "hello"}], "pair": [1, 2]}
        assert turn.tool_call("send", {"to": "x"}, fx.tool("send"), replay="never").text == (
            "send ran"
        )
        turn.finish("all done")
    assert world.get_turn("turn_a").result == "all done"
    assert fx.calls == ["model:hello", "send:{'to': 'x'}"]

    with journaled_turn(world, "turn_a", prompt="p") as again:
        assert again.replaying
        assert again.model_call({"model": "m", "q": 1}, fx.model("other")) == reply
        result = again.tool_call("send", {"to": "x"}, fx.tool("send"), replay="never")
        assert result.replayed and result.value == "send ran"
        with pytest.raises(ReplayDivergence, match="replayed reply"):
            again.finish("something else")
        with pytest.raises(ReplayDivergence, match="no recorded outcome"):
            again.tool_call("send", {"to": "y"}, fx.tool("send"), replay="never")
        again.finish("all done")
    assert fx.calls == ["model:hello", "send:{'to': 'x'}"]  # nothing ran on replay
    assert again.replayed_steps == 2


def test_interrupted_steps_follow_their_replay_rule(world: World) -> None:
    fx = Effects()
    with pytest.raises(RuntimeError, match="charge died"), journaled_turn(world, "turn_b") as t:
        t.tool_call("lookup", {}, fx.tool("lookup", fail=False), replay="safe")
        t.tool_call("charge", {"cents": 5}, fx.tool("charge", fail=True), replay="never")
    turn = world.get_turn("turn_b")
    assert turn.status is TurnStatus.QUEUED and "charge died" in (turn.error or "")

    with journaled_turn(world, "turn_b") as t:
        assert t.tool_call("lookup", {}, fx.tool("lookup"), replay="safe").replayed
        charged = t.tool_call("charge", {"cents": 5}, fx.tool("charge"), replay="never")
        assert charged.possibly_ran and charged.is_error
        assert "may or may not have taken effect" in charged.text
        assert "turn_b:1" in charged.text  # the idempotency key to check with
        t.finish("checked")
    # charge started once (it died), and was not run again: the model is told instead.
    assert fx.calls == ["lookup:{}", "charge:{'cents': 5}"]


def test_an_interrupted_safe_tool_runs_again(world: World) -> None:
    fx = Effects()
    with pytest.raises(RuntimeError), journaled_turn(world, "turn_c") as t:
        t.tool_call("fetch", {}, fx.tool("fetch", fail=True), replay="safe")
    with journaled_turn(world, "turn_c") as t:
        result = t.tool_call("fetch", {}, fx.tool("fetch"), replay="safe")
        assert not result.replayed and result.value == "fetch ran"
    assert fx.calls == ["fetch:{}", "fetch:{}"]
    assert world.load_steps("turn_c")[0].attempts == 2


def test_a_changed_program_is_a_divergence(world: World) -> None:
    fx = Effects()
    with pytest.raises(RuntimeError), journaled_turn(world, "turn_d", prompt="p") as t:
        t.model_call({"model": "m", "q": 1}, fx.model("one"))
        raise RuntimeError("crash")
    with (
        pytest.raises(ReplayDivergence, match="input hash"),
        journaled_turn(world, "turn_d", prompt="p") as t,
    ):
        t.model_call({"model": "m", "q": 2}, fx.model("two"))
    with (
        pytest.raises(ReplayDivergence, match="started with prompt"),
        journaled_turn(world, "turn_d", prompt="another prompt"),
    ):
        pass


def test_tools_must_declare_a_replay_rule_and_return_json(world: World) -> None:
    fx = Effects()
    with journaled_turn(world, "turn_e") as t:
        with pytest.raises(ToolDefinitionError, match="no valid replay label"):
            t.tool_call("x", {}, fx.tool("x"), replay=None)  # type: ignore[arg-type]
        with pytest.raises(ToolDefinitionError, match="not JSON"):
            t.tool_call("y", {}, lambda args: object(), replay="safe")
        t.finish("ok")


class Order(BaseModel):
    order: int


@tool(replay="never")
def refund(args: Order) -> str:
    """Refund an order."""
    return f"refunded {args.order}"


def test_run_tool_validates_the_models_input_first(world: World) -> None:
    with journaled_turn(world, "turn_f") as t:
        bad = t.run_tool(refund, {"order": "forty-two"})
        assert bad.input_error and bad.is_error and bad.seq is None
        good = t.run_tool(refund, {"order": 42}, call_id="toolu_1")
        assert good.value == "refunded 42" and good.seq == 0
        t.finish("ok")
    assert [s.key for s in world.load_steps("turn_f")] == ["tool:0:toolu_1"]


def test_run_tool_settles_an_interrupted_never_call_by_its_check(world: World) -> None:
    """The charge landed, then its process died before the outcome: the next run's
    run_tool asks the tool's check, which finds the charge by its idempotency key, and
    returns its result; the charge is not run again and nothing says *possibly ran*."""
    charges: list[str] = []

    def find(args: Order, ctx: ToolContext) -> Checked:
        landed = ctx.idempotency_key in charges
        return done(f"charged {args.order}") if landed else ABSENT

    @tool(replay="never", check=find)
    def charge(args: Order, ctx: ToolContext) -> str:
        """Charge an order."""
        charges.append(ctx.idempotency_key)
        if len(charges) == 1:
            raise RuntimeError("the process died after the charge")
        return f"charged {args.order}"

    with pytest.raises(RuntimeError, match="died"), journaled_turn(world, "turn_s") as t:
        t.run_tool(charge, {"order": 7}, call_id="toolu_1")
    with journaled_turn(world, "turn_s") as t:
        result = t.run_tool(charge, {"order": 7}, call_id="toolu_1")
        assert (result.value, result.possibly_ran, result.replayed) == ("charged 7", False, False)
        t.finish("ok")
    assert charges == ["turn_s:0"]  # the charge ran once
    (step,) = world.load_steps("turn_s")
    assert step.status is StepStatus.DONE and step.meta["settled"] == "done"


def test_two_owners_cannot_both_write(world: World) -> None:
    """A second run that takes the turn (force) fences the first out: its next write is
    refused, and it cannot finish the turn either."""
    fx = Effects()
    with pytest.raises(LeaseLost), journaled_turn(world, "turn_g") as first:
        first.tool_call("a", {}, fx.tool("a"), replay="safe")
        with journaled_turn(world, "turn_g", force=True) as second:
            assert second.tool_call("a", {}, fx.tool("a"), replay="safe").replayed
            with pytest.raises(LeaseLost):
                first.tool_call("b", {}, fx.tool("b"), replay="safe")
            second.finish("second won")
    assert world.get_turn("turn_g").result == "second won"
    assert fx.calls == ["a:{}"]


def test_a_worker_parks_a_custom_turn_for_its_program(world: World) -> None:
    fx = Effects()
    with pytest.raises(RuntimeError), journaled_turn(world, "turn_h") as t:
        t.tool_call("a", {}, fx.tool("a"), replay="safe")
        raise RuntimeError("the program stopped")
    assert run_worker(world, until_idle=False, max_turns=1) == 1
    parked = world.get_turn("turn_h")
    assert parked.status is TurnStatus.WAITING and parked.waiting_for == WAITING_FOR
    with journaled_turn(world, "turn_h") as t:  # takes it back at once
        assert t.tool_call("a", {}, fx.tool("a"), replay="safe").replayed
        t.finish("finished by its program")
    assert world.get_turn("turn_h").status is TurnStatus.DONE


def test_a_custom_turn_is_not_another_agents(world: World, tmp_path: Path) -> None:
    with FakeModelServer(DEMO / "script.toml") as server:
        queued = enqueue_turn(world, DEMO_PROMPT, tools=[DEMO_TOOLS], base_url=server.url)
    with (
        pytest.raises(ConfigError, match="not of a custom harness"),
        journaled_turn(world, queued.turn_id, prompt=DEMO_PROMPT),
    ):
        pass
    with pytest.raises(ConfigError, match="needs a turn id"), journaled_turn(world, ""):
        pass


def test_leaving_the_block_finishes_the_turn(world: World) -> None:
    with journaled_turn(world, "turn_i") as t:
        assert isinstance(t, JournaledTurn)
    assert world.get_turn("turn_i").status is TurnStatus.DONE
    with pytest.raises(ConfigError, match="is finished"):
        t.tool_call("late", {}, lambda args: "x", replay="safe")


def test_a_step_retried_in_the_same_run_is_the_same_step(world: World) -> None:
    """A program that catches a failed call and tries again makes that step again (a model
    call runs again, a never tool comes back possibly-ran), not a new step that a resumed
    run would find out of order."""
    fx = Effects()
    failures = iter([RuntimeError("overloaded")])

    def flaky() -> dict[str, Any]:
        for exc in failures:
            raise exc
        return {"text": "finally"}

    with journaled_turn(world, "turn_j") as t:
        with pytest.raises(RuntimeError, match="overloaded"):
            t.model_call({"model": "m"}, flaky)
        assert t.model_call({"model": "m"}, flaky) == {"text": "finally"}
        with pytest.raises(RuntimeError, match="pay died"):
            t.tool_call("pay", {}, fx.tool("pay", fail=True), replay="never")
        assert t.tool_call("pay", {}, fx.tool("pay"), replay="never").possibly_ran
        t.finish("ok")
    steps = world.load_steps("turn_j")
    assert [(s.seq, s.kind, s.status.value, s.attempts) for s in steps] == [
        (0, "model", "done", 2),
        (1, "tool", "possibly_ran", 1),
    ]
    assert fx.calls == ["pay:{}"]
