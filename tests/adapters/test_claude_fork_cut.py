"""Claude Code's transcript cut (``adapters/claude_code/fork.py``) on a real local World,
without the CLI: what the agent wrote into its transcript is untrusted (odd bytes, deep
nesting, ids of any type) and never stops the cut; a model call whose reply the main
transcript does not hold (a subagent's, a reply lost to a crash) cannot be the cut."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_harness.adapters.claude_code.fork import cut_transcript
from durable_harness.adapters.claude_code.setup import claude_session_id
from durable_harness.adapters.cli.records import TranscriptStore
from durable_harness.core.errors import ConfigError
from durable_harness.core.keys import input_digest
from durable_harness.core.types import Step, StepStatus, Turn
from durable_harness.worlds.local import LocalWorld

OLD = "11111111-1111-1111-1111-111111111111"


def _line(entry: object) -> bytes:
    return json.dumps(entry).encode()


TRANSCRIPT = (
    b"\n".join(
        [
            _line({"type": "user", "sessionId": OLD, "message": {"role": "user", "content": "go"}}),
            # A tool output cut inside an emoji: a lone surrogate, escaped.
            b'{"type": "assistant", "sessionId": "' + OLD.encode() + b'", "message": {"role": '
            b'"assistant", "id": "msg_1", "content": [{"type": "text", "text": "\\ud83d half"}]}}',
            b"[" * 100_000 + b"]" * 100_000,  # deeper than the JSON parser goes
            _line({"type": "user", "message": {"id": ["not", "a", "string"], "content": []}}),
            b'{"half a line',
            _line({"type": "assistant", "message": {"role": "assistant", "id": "msg_2"}}),
            _line({"type": "user", "message": {"role": "user", "content": "after the cut"}}),
        ]
    )
    + b"\n"
)


@pytest.fixture
def turn(tmp_path: Path) -> Iterator[tuple[LocalWorld, Turn]]:
    with LocalWorld(tmp_path) as world:
        world.create_session("s")
        world.create_turn("s", "t", "go", {"agent": "claude-code"})
        lease = world.claim_turn("t", "w", 30)
        assert lease is not None
        for seq, kind, meta in [
            (0, "agent", {}),
            (1, "model", {"message_id": "msg_1"}),
            (2, "model", {"message_id": "msg_sub"}),  # a subagent's: not in the transcript
            (3, "model", {"message_id": "msg_2"}),
        ]:
            world.insert_intent(
                Step("t", seq, f"k{seq}", kind, "n", input_digest(seq), epoch=lease.epoch)
            )
            world.finish_step("t", seq, lease.epoch, StepStatus.DONE, "{}", None, meta)
        store = TranscriptStore(world)
        store.point("s", "t", lease.epoch, store.save(TRANSCRIPT))
        yield world, world.get_turn("t")


def test_the_cut_survives_what_the_agent_wrote(turn: tuple[LocalWorld, Turn]) -> None:
    world, origin = turn
    kept = sorted(world.load_steps("t"), key=lambda s: s.seq)[:3]
    digest = cut_transcript(world, origin, kept, "ses_new")
    lines = [json.loads(line) for line in TranscriptStore(world).load(digest).splitlines()]
    # The prompt, the first reply (its lone surrogate intact), the odd-id entry; not the
    # deep line, the half line, nor anything from msg_2 on.
    assert [e.get("message", {}).get("id") for e in lines] == [
        None,
        "msg_1",
        ["not", "a", "string"],
    ]
    assert lines[1]["message"]["content"][0]["text"] == "\ud83d half"
    assert {e.get("sessionId") for e in lines} == {claude_session_id("ses_new"), None}


def test_a_call_outside_the_main_transcript_is_not_a_cut(turn: tuple[LocalWorld, Turn]) -> None:
    world, origin = turn
    kept = sorted(world.load_steps("t"), key=lambda s: s.seq)[:2]
    with pytest.raises(ConfigError, match="not in Claude Code's transcript"):
        cut_transcript(world, origin, kept, "ses_new")
