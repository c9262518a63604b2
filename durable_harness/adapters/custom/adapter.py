"""Turns of a custom harness: the user's own program runs them, never a worker.

A program on the Python API (``durable_harness.journaled_turn``) journals its own model and
tool calls in a turn of agent ``custom``. Only that program knows how to continue it, so a
``durable-harness worker`` that claims such a turn (its program died and the lease ran
out, or the program released it after an error) must neither run nor fail it: it parks it
(status ``waiting``, no worker holds it, not counted as a delivery), and the program's next
run takes it back. Without this a worker sharing the World would dead-letter the turn as
an unknown agent and the program could never finish it.
"""

from __future__ import annotations

import time
from typing import Any

from durable_harness.adapters.base import Adapter, TurnRun
from durable_harness.core.errors import ConfigError, TurnSuspended
from durable_harness.core.settings import Settings

NAME = "custom"
#: What ``ls`` shows a parked custom turn waiting for.
WAITING_FOR = "its own program to run it again (a custom harness turn)"
#: A parked turn is looked at again after this long (and parked again): the queue's
#: backends bound how far ahead a message can be hidden, none forbids a long park.
PARK_SECONDS = 30 * 24 * 3600.0


class CustomAdapter(Adapter):
    name = NAME

    def check(self, config: dict[str, Any], settings: Settings) -> None:
        raise ConfigError(
            "a custom harness turn is run by its own program, through "
            "durable_harness.journaled_turn (docs/python-api.md); it cannot be started with "
            "`durable-harness run`: choose another --agent"
        )

    def run_turn(self, run: TurnRun) -> str:
        if run.journal.replay_only:
            raise ConfigError(
                f"turn {run.turn.turn_id} is a custom harness turn: replay it by running its "
                "program again with the same turn id (it reads every step back, 0 calls)"
            )
        raise TurnSuspended(time.time() + PARK_SECONDS, WAITING_FOR)
