"""``durable-harness fork``: a finished five-step built-in turn cut before a step and
continued in a new session, through the CLI as real processes against the fake model.

The turn (``tests/fixtures/fork.toml``): model -> write a.txt -> model -> write b.txt ->
model replies; steps 0-4, in the virtual workspace (which exists only as snapshots).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import FIXTURES, Harness, ids_of, make_harness

from durable_harness import open_world
from durable_harness.adapters import get_adapter
from durable_harness.core.errors import ConfigError
from durable_harness.core.fork import load_fork
from durable_harness.harness.workspace import SnapshotStore, session_snapshot

PROMPT = "Write a.txt, then b.txt."
REPLY = "a.txt and b.txt are written."
NEW_PROMPT = "Instead of b.txt, write c.txt."


@pytest.fixture
def fork_harness(tmp_path: Path) -> Iterator[Harness]:
    yield from make_harness(tmp_path, FIXTURES / "fork.toml")


def finished_turn(h: Harness) -> dict[str, str]:
    ran = h.cli("run", PROMPT)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().splitlines()[-1] == REPLY
    ids = ids_of(ran)
    steps = h.show(ids["turn"])["steps"]
    assert [(s["kind"], s["name"]) for s in steps] == [
        ("model", steps[0]["name"]),
        ("tool", "write"),
        ("model", steps[0]["name"]),
        ("tool", "write"),
        ("model", steps[0]["name"]),
    ]
    return ids


def world_of(h: Harness) -> Any:
    return open_world(f"local://{h.env['DURABLE_HARNESS_DATA_DIR']}")


def files_of(h: Harness, session_id: str) -> dict[str, str]:
    """The newest workspace of a session, as its snapshots hold it."""
    with world_of(h) as world:
        digest = session_snapshot(world, session_id)
        assert digest is not None
        state = SnapshotStore(world).load(digest)
    return {p: d.decode() for p, d in state.files.items()}


def everything(h: Harness, session_id: str) -> dict[str, Any]:
    """A session as stored: its turns and every step of them, for "unchanged"."""
    with world_of(h) as world:
        turns = world.list_turns(session_id)
        return {
            t.turn_id: (
                t.status,
                t.result,
                t.index,
                [s.__dict__ for s in world.load_steps(t.turn_id)],
            )
            for t in turns
        }


def test_fork_before_step_3_with_a_new_prompt(fork_harness: Harness) -> None:
    h = fork_harness
    origin = finished_turn(h)
    before = everything(h, origin["session"])
    calls = len(h.requests())
    with world_of(h) as world:
        at_fork = world.load_steps(origin["turn"])[1].meta["workspace"]

    forked = h.cli("fork", origin["turn"], "--at", "3", NEW_PROMPT)
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout.strip().splitlines()[-1] == "c.txt is written instead of b.txt."
    ids = ids_of(forked)
    assert ids["session"] != origin["session"]

    # The steps kept (0-2) were not asked again: the fork made its own two model calls,
    # and its journal holds only its own steps.
    new = h.requests()[calls:]
    data = h.show(ids["turn"])
    assert [(s["kind"], s["name"], s["how"]) for s in data["steps"]] == [
        ("model", data["steps"][0]["name"], "live"),
        ("tool", "write", "live"),
        ("model", data["steps"][0]["name"], "live"),
    ]
    assert [r["rule"] for r in new] == ["fork write", "fork reply"]

    # The workspace started as it was at the fork point (a.txt only), so it ends with
    # a.txt and c.txt and never had b.txt.
    with world_of(h) as world:
        fork = load_fork(world, world, ids["session"])
        assert fork is not None and fork.workspace == at_fork and fork.at == 3
        assert fork.turn_id == origin["turn"]
        # What the model was given before the new prompt: the original conversation up
        # to step 3, the cut write of b.txt answered "not run".
        assert [m["role"] for m in fork.history] == [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
        ]
        assert fork.history[0]["content"] == PROMPT
        (cut,) = fork.history[-1]["content"]
        assert cut["is_error"] and cut["content"].startswith("not run: the session was forked")
        assert cut["tool_use_id"] == fork.history[-2]["content"][0]["id"]
        assert SnapshotStore(world).load(at_fork).files == {"a.txt": b"a"}
        session = world.get_session(ids["session"])
        assert session.meta["forked_from"] == {"turn": origin["turn"], "at": 3}
    assert files_of(h, ids["session"]) == {"a.txt": "a", "c.txt": "c"}

    # The original session is unchanged: its turn, steps and workspace.
    assert everything(h, origin["session"]) == before
    assert files_of(h, origin["session"]) == {"a.txt": "a", "b.txt": "b"}

    # The fork is a session like any other: replayed from its own journal, 0 calls.
    replayed = h.cli("replay", ids["turn"])
    assert replayed.returncode == 0, replayed.stderr
    assert len(h.requests()) == calls + 2


def test_fork_at_a_model_step_without_a_prompt_goes_on_as_the_original(
    fork_harness: Harness,
) -> None:
    h = fork_harness
    origin = finished_turn(h)
    calls = len(h.requests())
    forked = h.cli("fork", origin["turn"], "--at", "2")
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout.strip().splitlines()[-1] == REPLY
    ids = ids_of(forked)
    # Steps 0 and 1 kept; the fork asked the model step 2's question again (the same
    # request: nothing new was said) and went on from there.
    assert len(h.show(ids["turn"])["steps"]) == 3
    hashes = [r["request_hash"] for r in h.requests()]
    assert len(hashes) == calls + 2
    assert hashes[calls] == hashes[1]
    assert files_of(h, ids["session"]) == {"a.txt": "a", "b.txt": "b"}

    # A later turn of the fork's session sees the fork's conversation: the origin's
    # prompt (in the fork's record) and the fork's own turn, which had no prompt.
    with world_of(h) as world:
        assert world.get_turn(ids["turn"]).prompt == ""
    later = h.cli("run", "--session", ids["session"], "Which files did you write?")
    assert later.returncode == 0, later.stderr
    assert later.stdout.strip().splitlines()[-1] == "a.txt and b.txt."


def test_bad_forks_are_refused_and_record_nothing(fork_harness: Harness, tmp_path: Path) -> None:
    h = fork_harness
    origin = finished_turn(h)
    with world_of(h) as world:
        sessions = len(world.list_sessions())
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for args, says in [
        (["--at", "9"], "has steps 0..4 (or 5: after its reply)"),
        (["--at", "-1"], "has steps 0..4"),
        (["--at", "2", "   "], "the prompt is empty"),
        (["--at", "5"], "ends with the agent's reply: give a new prompt"),
        (["--at", "2", "--workspace", str(tmp_path)], "is not empty"),
        (["--at", "2", "--workspace", str(a_file)], "is not empty"),
    ]:
        out = h.cli("fork", origin["turn"], *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert says in out.stderr, (args, out.stderr)
    out = h.cli("fork", "turn_nope", "--at", "0")
    assert out.returncode != 0 and "turn_nope" in out.stderr
    with world_of(h) as world:
        assert len(world.list_sessions()) == sessions


def test_a_host_folder_turn_forks_only_into_a_new_folder(
    fork_harness: Harness, tmp_path: Path
) -> None:
    h = fork_harness
    folder = tmp_path / "work"
    folder.mkdir()
    ran = h.cli("run", "--workspace", str(folder), PROMPT)
    assert ran.returncode == 0, ran.stderr
    turn = ids_of(ran)["turn"]
    out = h.cli("fork", turn, "--at", "3", NEW_PROMPT)
    assert out.returncode == 2 and "a fork works in its own" in out.stderr, out.stderr
    out = h.cli("fork", turn, "--at", "3", NEW_PROMPT, "--workspace", str(folder))
    assert out.returncode == 2 and "a fork works in its own" in out.stderr, out.stderr
    other = tmp_path / "fork"
    out = h.cli("fork", turn, "--at", "3", NEW_PROMPT, "--workspace", str(other))
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in other.iterdir()) == ["a.txt", "c.txt"]
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt", "b.txt"]


def test_the_other_cli_agents_say_they_cannot_be_forked_yet() -> None:
    for agent in ("codex", "opencode", "pi", "acp:opencode", "acp:claude-code"):
        with pytest.raises(ConfigError, match="Claude Code's turns can be forked"):
            get_adapter(agent).fork_cut(None, None, [], "ses_x")  # type: ignore[arg-type]


def test_fork_after_the_final_reply_and_export_before_it_ran(
    fork_harness: Harness, tmp_path: Path
) -> None:
    """A cut after a finished turn's last step keeps all of it (a new branch of the
    conversation); the fork's session exports the fork point's files before its own
    turn has run."""
    h = fork_harness
    origin = finished_turn(h)
    forked = h.cli("fork", origin["turn"], "--at", "5", "Which files did you write?", "--detach")
    assert forked.returncode == 0, forked.stderr
    ids = ids_of(forked)
    out = tmp_path / "out"
    exported = h.cli("export", ids["session"], str(out))
    assert exported.returncode == 0, exported.stderr
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt"]
    ran = h.cli("worker", "--until-idle")
    assert ran.returncode == 0, ran.stderr
    assert h.show(ids["turn"])["turn"]["result"] == "a.txt and b.txt."
