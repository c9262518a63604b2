"""OpenCode's host-tool calls paired with the ids its plugin announced (opencode/tools.py).

The whole path, forged from inside the sandbox, is tests/security/test_forged_tool_calls.py;
here the pairing rule alone: a spent id announced again never takes a fresh one's place.
"""

from __future__ import annotations

from durable_harness.adapters.opencode.tools import CallIds

ARGS = {"text": "pricing page is live"}


def test_ids_are_paired_oldest_first_by_tool_and_arguments() -> None:
    ids = CallIds()
    ids.announce("notify", ARGS, "toolu_1")
    ids.announce("notify", ARGS, "toolu_2")
    ids.announce("notify", {"text": "other"}, "toolu_3")
    assert ids.claim("notify", {"text": "other"}) == "toolu_3"
    assert ids.claim("notify", ARGS) == "toolu_1"
    assert ids.claim("notify", ARGS) == "toolu_2"
    assert ids.claim("notify", ARGS) is None


def test_a_served_id_announced_again_does_not_take_a_fresh_ones_place() -> None:
    ids = CallIds()
    served = {"toolu_spent"}
    ids.announce("notify", ARGS, "toolu_spent")  # a forged PreToolUse for a call that ran
    ids.announce("notify", ARGS, "toolu_next")  # the model's next call, same arguments
    assert ids.claim("notify", ARGS, served.__contains__) == "toolu_next"
    # With nothing fresh waiting the spent id is paired (it gets its recorded result).
    assert ids.claim("notify", ARGS, served.__contains__) == "toolu_spent"
    assert ids.claim("notify", ARGS, served.__contains__) is None
