"""The Adapter seam: an agent that runs one turn with every call going through a Journal.

An adapter gets a :class:`TurnRun` (the World, the claimed turn, its Journal, settings) and
returns the turn's final reply. It must route every model call and tool call through
``run.journal.run`` so a worker that resumes the turn replays instead of re-running.
``check`` validates a turn's configuration before it is enqueued, so a bad flag fails at
``run`` time rather than in a worker later.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from durable_harness.core.errors import ConfigError
from durable_harness.core.fork import Cut
from durable_harness.core.settings import Settings
from durable_harness.core.turn_config import VIRTUAL, TurnConfig
from durable_harness.core.types import Step, Turn
from durable_harness.core.world import World
from durable_harness.harness.cancel import Cancellation
from durable_harness.harness.journal import Journal


@dataclass
class TurnRun:
    world: World
    turn: Turn
    journal: Journal
    settings: Settings

    @property
    def config(self) -> dict[str, Any]:
        """The stored configuration, as stored (see :attr:`turn_config`)."""
        return self.turn.config

    @property
    def turn_config(self) -> TurnConfig:
        """The typed view of :attr:`config`."""
        return TurnConfig.of(self.turn.config)

    @property
    def cancel(self) -> Cancellation:
        """The turn's cancel request (the journal's): an adapter whose agent does not stop
        at its next step by itself (a CLI in its own process) registers a stopper here."""
        return self.journal.cancel


class Adapter(abc.ABC):
    name: str
    #: Where a turn of this agent runs when it names no workspace (``run`` without
    #: ``--workspace``): the virtual workspace, ``docker`` for the CLI agents.
    default_workspace: str = VIRTUAL

    @abc.abstractmethod
    def check(self, config: dict[str, Any], settings: Settings) -> None:
        """Raise ConfigError/ToolDefinitionError if the turn could never run."""

    @abc.abstractmethod
    def run_turn(self, run: TurnRun) -> str:
        """Run (or resume) the turn; return its final reply."""

    def fork_cut(self, world: World, turn: Turn, steps: list[Step], session_id: str) -> Cut:
        """What a fork of ``turn`` keeps, its journal cut after ``steps`` (its finished
        steps before the fork point), for the new session ``session_id``: ``durable-harness
        fork``. ConfigError for an agent whose own session record cannot be cut (yet)."""
        raise ConfigError(
            f"forking a turn of the {self.name} agent is not supported yet: the built-in "
            "agent's and Claude Code's turns can be forked (docs/fork.md)"
        )
