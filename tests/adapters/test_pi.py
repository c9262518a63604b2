"""The pi agent end to end: the real Pi CLI (the pinned 0.73.1 from scripts/setup)
against the scripted fake model, through the journaling proxy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import dump, model_keys, tool_rows, upstream_keys
from pi_cases import (
    FINAL,
    SECOND_PROMPT,
    SECOND_REPLY,
    bash_runs,
    notify_runs,
    pi_harness,
    run_args,
    write_script,
)
from support import Harness, ids_of, make_harness

from durable_harness.harness.events import read_all
from durable_harness.worlds.local import LocalWorld

MODEL = "claude-sonnet-4-5"


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from pi_harness(tmp_path)


def test_turn_with_bash_write_and_host_tool(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    show = h.show(ids_of(out)["turn"])
    kinds = [(s["kind"], s["name"]) for s in show["steps"]]
    assert kinds == [
        ("agent", "pi"),
        ("model", MODEL),
        ("tool", "bash"),
        ("model", MODEL),
        ("tool", "write"),
        ("model", MODEL),
        ("tool", "notify"),
        ("model", MODEL),
    ], dump(show)
    assert all(s["status"] == "done" and s["how"] == "live" for s in show["steps"])
    assert (h.tmp / "ws" / "site" / "pricing.html").read_text() == "<h1>Pricing</h1>\n"
    assert bash_runs(h) == 1 and notify_runs(h) == 1
    # Every model call reached the fake model once, keyed as the journal keyed it, and
    # the provider key never left the harness: the CLI only had the proxy's token.
    assert sorted(upstream_keys(h)) == sorted(model_keys(show))
    assert all(r["api_key_sent"] for r in h.requests())
    # The turn's event log: the CLI's streamed model text reached it through the proxy,
    # each model step's deltas joined are its reply's text, and turn.ended is last.
    with LocalWorld(Path(h.env["DURABLE_HARNESS_DATA_DIR"])) as world:
        turn_id = ids_of(out)["turn"]
        events = read_all(world, turn_id)
        steps = world.load_steps(turn_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.kind for e in events if e.kind.startswith("turn.")] == ["turn.created", "turn.ended"]
    assert events[-1].data["result"] == FINAL
    assert sum(e.kind == "step.finished" for e in events) == len(steps) == 8
    streamed: dict[int, str] = {}
    for e in events:
        if e.kind == "text.delta":
            streamed[e.data["seq"]] = streamed.get(e.data["seq"], "") + e.data["text"]
    finished = {e.data["seq"]: e.data for e in events if e.kind == "step.finished"}
    assert streamed and all(finished[seq]["kind"] == "model" for seq in streamed)
    assert all(finished[seq]["output"] == text for seq, text in streamed.items())
    assert FINAL in streamed.values()


def test_finished_turn_replays_with_zero_upstream_calls(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    turn = ids_of(out)["turn"]
    calls = len(h.requests())
    replay = h.cli("replay", turn)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == FINAL
    assert len(h.requests()) == calls  # 0 upstream calls
    assert bash_runs(h) == 1 and notify_runs(h) == 1  # no tool ran again
    # With the model switched off entirely, the replay still answers from the journal.
    h.server.stop()
    offline = h.cli("replay", turn, ANTHROPIC_BASE_URL="http://127.0.0.1:9")
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout.strip() == FINAL


def test_second_turn_sees_the_first(h: Harness) -> None:
    first = h.cli(*run_args(h))
    assert first.returncode == 0, first.stderr
    session = ids_of(first)["session"]
    second = h.cli(*run_args(h, "--session", session, prompt=SECOND_PROMPT))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == SECOND_REPLY
    assert h.requests()[-1]["rule"] == "second"  # matched the first turn's reply
    show = h.show(ids_of(second)["turn"])
    assert [s["kind"] for s in show["steps"]] == ["agent", "model"]
    assert tool_rows(show) == []
    assert bash_runs(h) == 1


def test_prompt_text_is_journal_input_not_a_flag(h: Harness) -> None:
    """A prompt that looks like a flag or a file argument reaches the model as text."""
    out = h.cli(*run_args(h, prompt="--help @add a pricing page"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    assert h.requests()[0]["rule"] == "bash"


def test_cli_gets_only_the_proxy_token(tmp_path: Path) -> None:
    """Pi's models.json names the proxy and a per-launch token, and its environment holds
    no provider key: the bash tool copies both out for inspection."""
    ws = tmp_path / "ws"
    ws.mkdir()
    script = write_script(tmp_path, ws)
    # Into the workspace: the agent user may write there only.
    spy = f"cp $HOME/.pi/agent/models.json {ws}/models.json && env > {ws}/env.txt"
    script.write_text(script.read_text().replace("mkdir -p site", f"{spy} && mkdir -p site"))
    for h in make_harness(tmp_path, script):
        h.env["NOTIFY_LEDGER"] = str(tmp_path / "notify.txt")
        out = h.cli(*run_args(h), ANTHROPIC_API_KEY="sk-provider-secret")
        assert out.returncode == 0, out.stderr
    provider = json.loads((ws / "models.json").read_text())["providers"]["durable-harness"]
    assert provider["api"] == "anthropic-messages"
    assert provider["baseUrl"].startswith("http://127.0.0.1:")
    assert provider["apiKey"] != "sk-provider-secret" and len(provider["apiKey"]) > 30
    assert "sk-provider-secret" not in (ws / "env.txt").read_text()


_TWO_TOOLS = """
[[rule]]
name = "final"
when.conversation = "Successfully wrote"
reply.text = "Both done."

[[rule]]
name = "two"
reply.tool_use = [
  {{ name = "bash", input = {{ command = "echo ran >> bash_runs.txt && echo BASH-$((40+2))" }} }},
  {{ name = "write", input = {{ path = "{ws}/notes.txt", content = "two tools\\n" }} }},
]
"""


def test_two_tool_calls_in_one_reply(tmp_path: Path) -> None:
    """One model reply with two tool calls (Pi runs them in parallel): each is journaled
    on its own, both finish, and the turn replays with 0 upstream calls."""
    ws = tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "script.toml"
    script.write_text(_TWO_TOOLS.format(ws=ws))
    for h in make_harness(tmp_path, script):
        out = h.cli(*run_args(h, prompt="do two things"))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == "Both done."
        turn = ids_of(out)["turn"]
        show = h.show(turn)
        assert [(s["kind"], s["name"], s["status"]) for s in show["steps"]] == [
            ("agent", "pi", "done"),
            ("model", MODEL, "done"),
            ("tool", "bash", "done"),
            ("tool", "write", "done"),
            ("model", MODEL, "done"),
        ], dump(show)
        assert bash_runs(h) == 1 and (ws / "notes.txt").read_text() == "two tools\n"
        calls = len(h.requests())
        replay = h.cli("replay", turn)
        assert replay.returncode == 0, replay.stderr
        assert replay.stdout.strip() == "Both done." and len(h.requests()) == calls
        assert bash_runs(h) == 1
