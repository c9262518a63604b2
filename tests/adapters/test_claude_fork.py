"""``durable-harness fork`` of a Claude Code turn at its second model call: the real CLI
in the session's Docker container against the fake model. The origin is claude_cases'
turn: launch, model -> Bash, model -> Write, model -> notify, model -> reply (steps 0-7).
The fork is cut before step 3 (the second model call): its transcript ends with the Bash
result, its workspace is the Bash step's snapshot, and it is asked to do something else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from claude_cases import (
    FINAL,
    bash_runs,
    claude_harness,
    dump,
    model_keys,
    notify_runs,
    run_args,
    upstream_keys,
)
from support import Harness, ids_of

from durable_harness import open_world
from durable_harness.adapters.cli.records import TranscriptStore, jsonl_messages
from durable_harness.core.fork import load_fork
from durable_harness.harness.workspace import SnapshotStore

NEW_PROMPT = "Instead of a pricing page, make an about page."
FORK_REPLY = "About page made instead."
FORK_RULES = f"""
[[rule]]
name = "fork final"
when.conversation = "ABOUT-42"
reply.text = "{FORK_REPLY}"

[[rule]]
name = "fork bash"
when.last_user_text = "{NEW_PROMPT}"
reply.tool_use = [ {{ name = "Bash", input = {{ command = "echo about > site/about.html && echo ABOUT-$((40+2))", description = "about" }} }} ]
"""  # noqa: E501


@pytest.fixture
def h(tmp_path: Path, docker_host: str) -> Iterator[Harness]:
    yield from claude_harness(tmp_path, where="docker", first_rules=FORK_RULES)


def world_of(h: Harness) -> Any:
    return open_world(f"local://{h.env['DURABLE_HARNESS_DATA_DIR']}")


def stored(h: Harness, session_id: str) -> dict[str, Any]:
    with world_of(h) as world:
        return {
            t.turn_id: (t.status, t.result, [s.__dict__ for s in world.load_steps(t.turn_id)])
            for t in world.list_turns(session_id)
        }


def files(session_id: str) -> dict[str, str]:
    """The session container's workspace (what a snapshot of it holds)."""
    from durable_harness.sandbox.docker import DockerSandbox

    box = DockerSandbox(session_id)
    try:
        state = box.export_state()
    finally:
        box.close()
    return {p: d.decode() for p, d in state.files.items()}


def test_fork_a_claude_code_turn_at_its_second_model_call(h: Harness) -> None:
    out = h.cli(*run_args(h))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    origin = ids_of(out)
    show = h.show(origin["turn"])
    model_seqs = [s["seq"] for s in show["steps"] if s["kind"] == "model"]
    at = model_seqs[1]
    assert at == 3, dump(show)
    before = stored(h, origin["session"])
    origin_files = files(origin["session"])
    calls = len(h.requests())
    with world_of(h) as world:
        snapshot = world.load_steps(origin["turn"])[at - 1].meta["workspace"]

    refused = h.cli("fork", origin["turn"], "--at", "2", NEW_PROMPT)
    assert refused.returncode == 2 and "before one of its model calls" in refused.stderr
    refused = h.cli("fork", origin["turn"], "--at", str(at))
    assert refused.returncode == 2 and "needs a new prompt" in refused.stderr

    forked = h.cli("fork", origin["turn"], "--at", str(at), NEW_PROMPT)
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout.strip().splitlines()[-1] == FORK_REPLY
    ids = ids_of(forked)
    fork_show = h.show(ids["turn"])
    assert [(s["kind"], s["name"]) for s in fork_show["steps"]] == [
        ("agent", "claude-code"),
        ("model", "claude-sonnet-4-5"),
        ("tool", "Bash"),
        ("model", "claude-sonnet-4-5"),
    ], dump(fork_show)

    # 0 upstream calls for the steps kept: the fork's requests are its own model steps,
    # each once, none of them one the origin made.
    new = upstream_keys(h, since=calls)
    assert sorted(new) == sorted(model_keys(fork_show))
    assert not set(new) & set(upstream_keys(h)[:calls])
    assert [r["rule"] for r in h.requests()[calls:]] == ["fork bash", "fork final"]

    # The cut transcript: the original prompt and the first reply and its Bash result,
    # nothing of the second call on; the fork's own session id.
    with world_of(h) as world:
        fork = load_fork(world, world, ids["session"])
        assert fork is not None and fork.record is not None and fork.workspace == snapshot
        cut = TranscriptStore(world).load(fork.record)
        assert SnapshotStore(world).load(snapshot).files.keys() == {
            "site/index.html",
            "bash_runs.txt",
        }
    replies = [m for m in jsonl_messages(cut) if m.get("role") == "assistant"]
    assert len({m.get("id") for m in replies}) == 1, replies
    assert b"BASH-42" in cut and b"pricing.html" not in cut

    # The workspace was the snapshot at the fork point: the Bash step's files, then the
    # fork's about page; no pricing page, and the Bash command did not run again.
    assert files(ids["session"]) == {
        "bash_runs.txt": "ran\n",
        "site/about.html": "about\n",
        "site/index.html": "PRICING-42\n",
    }
    assert bash_runs(h, ids["session"]) == 1 and notify_runs(h) == 1

    # The original is unchanged: its session's turns and steps, and its folder.
    assert stored(h, origin["session"]) == before
    assert files(origin["session"]) == origin_files
    assert "site/pricing.html" in origin_files and "site/about.html" not in origin_files

    # The fork's turn replays from its own journal: 0 upstream calls.
    calls = len(h.requests())
    replayed = h.cli("replay", ids["turn"])
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.strip() == FORK_REPLY and len(h.requests()) == calls
