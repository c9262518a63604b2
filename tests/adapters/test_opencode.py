"""The opencode agent end to end: the real OpenCode CLI (the pinned version from
scripts/setup) against the scripted fake model, through the journaling proxy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import bash_runs, dump, model_keys, upstream_keys
from opencode_cases import (
    FINAL,
    SECOND_PROMPT,
    SECOND_REPLY,
    TOOLS,
    opencode_harness,
    run_args,
)
from support import Harness, ids_of, make_harness

from durable_harness.adapters import get_adapter


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from opencode_harness(tmp_path)


def test_two_tool_turn(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    show = h.show(ids_of(out)["turn"])
    kinds = [(s["kind"], s["name"]) for s in show["steps"]]
    assert kinds == [
        ("agent", "opencode"),
        ("model", "claude-sonnet-4-5"),  # the title request
        ("model", "claude-sonnet-4-5"),
        ("tool", "bash"),
        ("model", "claude-sonnet-4-5"),
        ("tool", "write"),
        ("model", "claude-sonnet-4-5"),
    ], dump(show)
    assert all(s["status"] == "done" and s["how"] == "live" for s in show["steps"])
    assert (h.tmp / "ws" / "site" / "pricing.html").read_text() == "<h1>Pricing</h1>\n"
    assert bash_runs(h) == 1
    # Every model call (the title request too) reached the fake model once, keyed as the
    # journal keyed it, with the proxy's key (never the CLI's token) sent upstream.
    rules = [r["rule"] for r in h.requests()]
    assert sorted(rules[:2]) == ["bash", "title"] and rules[2:] == ["write", "final"]
    assert sorted(upstream_keys(h)) == sorted(model_keys(show))
    assert all(r["api_key_sent"] for r in h.requests())


def test_finished_turn_replays_with_zero_upstream_calls(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    turn = ids_of(out)["turn"]
    calls = len(h.requests())
    replay = h.cli("replay", turn)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == FINAL
    assert len(h.requests()) == calls  # 0 upstream calls
    assert bash_runs(h) == 1  # no tool ran again
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
    last = h.requests()[-1]
    assert last["rule"] == "second"  # matched on the first turn's reply in the history
    assert bash_runs(h) == 1


def test_host_tool_over_mcp_keyed_by_the_call_id(tmp_path: Path) -> None:
    """A host tool (notify, ``never``) served to OpenCode over MCP by the harness: one
    journal step keyed by OpenCode's call id, run once, and not again on replay."""
    for h in opencode_harness(tmp_path, notify=True):
        out = h.cli(*run_args(h, "--tools", TOOLS))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == FINAL
        turn = ids_of(out)["turn"]
        show = h.show(turn)
        tools = [(s["name"], s["status"]) for s in show["steps"] if s["kind"] == "tool"]
        assert tools == [("bash", "done"), ("write", "done"), ("notify", "done")], dump(show)
        notify = next(s for s in show["steps"] if s["name"] == "notify")
        assert notify["key"].startswith("tool:toolu_")
        ledger = (h.tmp / "notify.txt").read_text().splitlines()
        assert ledger == [f"{turn}:{notify['seq']} pricing page is live"]
        calls = len(h.requests())
        replay = h.cli("replay", turn)
        assert replay.returncode == 0, replay.stderr
        assert replay.stdout.strip() == FINAL and len(h.requests()) == calls
        assert len((h.tmp / "notify.txt").read_text().splitlines()) == 1


def test_registered() -> None:
    assert get_adapter("opencode").name == "opencode"


def test_model_error_releases_the_turn(tmp_path: Path) -> None:
    """A model call that fails (HTTP 400 from the model) ends the launch with the model's
    error; the turn is left for a later delivery, its model step an intent."""
    script = tmp_path / "script.toml"
    script.write_text(
        '[[rule]]\nname = "title"\nwhen.system = "You are a title generator"\n'
        'reply.text = "T"\n\n[[rule]]\nname = "main"\n'
        'reply.error = { type = "invalid_request_error", status = 400, message = "bad seed" }\n'
    )
    (tmp_path / "ws").mkdir()
    for h in make_harness(tmp_path, script):
        out = h.cli(*run_args(h))
        assert out.returncode != 0
        assert "the model call failed" in out.stderr and "bad seed" in out.stderr, out.stderr
        show = h.show(ids_of(out)["turn"])
        assert show["turn"]["status"] == "queued", dump(show)
        statuses = [s["status"] for s in show["steps"] if s["kind"] == "model"]
        assert "intent" in statuses, dump(show)
