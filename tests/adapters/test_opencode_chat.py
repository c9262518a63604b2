"""OpenCode on the OpenAI Chat Completions API (``[provider] api = "openai-compatible"``,
its bundled ``@ai-sdk/openai-compatible`` provider): the real OpenCode CLI against the
fake model's ``/v1/chat/completions`` through the journaling proxy, keyed by
:class:`~.canonical_chat.ChatCanonicalizer` with OpenCode's text rules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_cases import bash_runs, dump, model_keys, notify_runs, upstream_keys
from kill_matrix import Cli, Point, points, run_point
from opencode_cases import FINAL, cli_processes, kill_worker_and_cli, opencode_harness
from support import Harness, ids_of
from wire_cases import CHAT_POINTS, wire_run_args

API = "openai-compatible"
MODEL = "claude-sonnet-4-5"
BASH_SEQ = 3  # the launch is step 0, the title request step 1, the first model call step 2


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from opencode_harness(tmp_path, notify=True)


def run_args(h: Harness, *extra: str, prompt: str | None = None) -> list[str]:
    more = {"prompt": prompt} if prompt is not None else {}
    return wire_run_args(h, "opencode", API, *extra, **more)


def test_turn_with_two_tools_and_a_host_tool(h: Harness) -> None:
    out = h.cli(*run_args(h), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    show = h.show(ids_of(out)["turn"])
    kinds = [(s["kind"], s["name"]) for s in show["steps"]]
    assert kinds[:2] == [("agent", "opencode"), ("model", MODEL)], dump(show)  # the title
    tools = [s["name"] for s in show["steps"] if s["kind"] == "tool"]
    assert tools == ["bash", "write", "notify"], dump(show)
    assert all(s["status"] == "done" and s["how"] == "live" for s in show["steps"])
    assert bash_runs(h) == 1 and notify_runs(h) == 1
    requests = h.requests()
    assert {r["path"] for r in requests} == {"/v1/chat/completions"}
    assert all(r["stream"] and r["api_key_sent"] for r in requests)
    assert sorted(upstream_keys(h)) == sorted(model_keys(show))


def test_finished_turn_replays_with_zero_upstream_calls(h: Harness) -> None:
    out = h.cli(*run_args(h), timeout=300)
    assert out.returncode == 0, out.stderr
    calls = len(h.requests())
    replay = h.cli("replay", ids_of(out)["turn"], timeout=300)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == FINAL
    assert len(h.requests()) == calls  # 0 upstream calls
    assert bash_runs(h) == 1 and notify_runs(h) == 1  # no tool ran again


def test_same_prompt_same_keys_another_prompt_not(h: Harness) -> None:
    """Two turns in two sessions (two private HOMEs, two databases): the same prompt gives
    the same canonical keys for every model call; another prompt does not."""
    first = h.cli(*run_args(h), timeout=300)
    assert first.returncode == 0, first.stderr
    (h.tmp / "ws" / "site" / "pricing.html").unlink()  # so the second turn writes it anew
    second = h.cli(*run_args(h), timeout=300)
    assert second.returncode == 0, second.stderr
    keys_1 = model_keys(h.show(ids_of(first)["turn"]))
    keys_2 = model_keys(h.show(ids_of(second)["turn"]))
    assert ids_of(first)["session"] != ids_of(second)["session"]
    assert len(keys_1) == 5 and sorted(keys_1) == sorted(keys_2)
    other = h.cli(*run_args(h, prompt="add a blog page"), timeout=300)
    assert other.returncode == 0, other.stderr
    assert not set(model_keys(h.show(ids_of(other)["turn"]))) & set(keys_1)


OPENCODE = Cli(
    name="opencode/openai-compatible",
    kill=kill_worker_and_cli,
    launches=cli_processes,
    final=FINAL,
    timeout=300,
)


@pytest.mark.parametrize(
    "point", [p for p in points(BASH_SEQ) if p.name in CHAT_POINTS], ids=lambda p: p.id
)
def test_kill_matrix(tmp_path: Path, point: Point) -> None:
    harness = opencode_harness(
        tmp_path, sleep=point.sleep, chunk_delay_ms=point.chunk_delay_ms, notify=True
    )
    run_point(harness, run_args, point, OPENCODE, "host")


def test_an_unknown_api_is_refused(h: Harness) -> None:
    out = h.cli(*wire_run_args(h, "opencode", "openai-completions"))
    assert out.returncode == 2, out.stderr
    assert "provider.api" in out.stderr and "openai-compatible" in out.stderr
    assert h.requests() == []
