"""The one CLI adapter's typed edges: the launch plan and the turn config keep the stored
JSON of earlier versions exactly, and every CLI agent is a spec run by ``CliAdapter``."""

from __future__ import annotations

from typing import Any

import pytest

from durable_harness.adapters import get_adapter
from durable_harness.adapters.cli.agent import CliAdapter
from durable_harness.adapters.cli.launches import LaunchPlan
from durable_harness.core.turn_config import TurnConfig

#: Launch plans as the four adapters stored them before the spec (Claude Code, Pi, OpenCode, Codex).
STORED_PLANS: list[dict[str, Any]] = [
    {"mode": "new", "message": "hi", "transcript": None},
    {"mode": "resume", "message": "hi", "transcript": "abc"},
    {"mode": "resume", "message": "again", "transcript": "abc", "launch": 2},
    {"mode": "resume", "message": "", "transcript": "abc", "launch": 1},
    {"mode": "new", "message": "hi", "rollout": None},
    {
        "mode": "resume",
        "message": "m",
        "rollout": {"thread": "t", "path": "sessions/r.jsonl", "transcript": "d"},
        "launch": 1,
    },
    # Since the bridge's port is drawn per launch (Docker), it is stored last.
    {"mode": "new", "message": "hi", "transcript": None, "port": 23456},
    {"mode": "resume", "message": "m", "rollout": None, "launch": 3, "port": 10001},
]


@pytest.mark.parametrize("stored", STORED_PLANS)
def test_a_stored_plan_round_trips(stored: dict[str, Any]) -> None:
    plan = LaunchPlan.of(stored)
    assert plan.stored() == stored
    assert list(plan.stored()) == list(stored)  # key order too: the input is hashed
    assert plan.port == stored.get("port")  # None: the port the job id derives


def test_a_stored_turn_config_round_trips() -> None:
    stored = {
        "agent": "pi",
        "workspace": "/tmp/ws",
        "tools": [],
        "model": "m",
        "max_tokens": 1,
        "max_model_calls": 2,
        "max_files": 3,
        "max_bytes": 4,
        "signal_secret": "s",
        "agent_config": {"replay": {}},
        "from_a_later_version": [1],
    }
    config = TurnConfig.of(stored)
    assert config.stored() == stored and list(config.stored()) == list(stored)
    assert TurnConfig.of({"agent": "pi"}).workspace == "virtual"
    assert TurnConfig.of({"agent": "pi"}).stored() == {"agent": "pi"}


@pytest.mark.parametrize("agent", ["claude-code", "codex", "opencode", "pi"])
def test_every_cli_agent_is_a_spec(agent: str) -> None:
    adapter = get_adapter(agent)
    assert isinstance(adapter, CliAdapter)
    assert adapter.name == agent == adapter.spec.name


@pytest.mark.parametrize(
    ("agent", "where"),
    [("builtin", "virtual"), ("claude-code", "docker"), ("codex", "docker"),
     ("opencode", "docker"), ("pi", "docker")],
)  # fmt: skip
def test_a_turn_naming_no_workspace_gets_its_agents_default(agent: str, where: str) -> None:
    """``run`` without ``--workspace``: a CLI agent runs in the session's container (it
    never runs in the virtual workspace), the built-in agent in the virtual one; one that
    names its workspace keeps it."""
    from durable_harness.core.settings import Settings
    from durable_harness.runtime.turns import turn_config

    settings = Settings.load()
    made = turn_config(
        agent=agent, workspace=None, tools=[], model=None, base_url=None, settings=settings
    )
    assert made["workspace"] == where
    named = turn_config(
        agent=agent, workspace="virtual", tools=[], model=None, base_url=None, settings=settings
    )
    assert named["workspace"] == "virtual"
