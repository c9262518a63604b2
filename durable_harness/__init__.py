"""durable-harness: crash-safe AI coding agents.

Every model and tool call of a turn is journaled (intent before, outcome after) in a
World; any worker can finish a turn whose process died, reading finished calls back and
following each interrupted tool's declared replay rule.

The public Python API (docs/python-api.md) is imported from here: ``from durable_harness
import open_world, journaled_turn, tool``. Each name is loaded on first use, so
``import durable_harness`` stays cheap and imports no World backend or model SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from durable_harness.api import (
        JournaledTurn,
        ToolResult,
        enqueue_turn,
        journaled_turn,
        open_world,
        resume_turn,
        run_turn,
        run_worker,
    )
    from durable_harness.harness.errors import DurableHarnessError
    from durable_harness.harness.tools import Replay, Tool, ToolContext, tool
    from durable_harness.worlds.base import Turn, TurnStatus, World

#: Public name -> the module that defines it (imported when the name is first used).
_EXPORTS = {
    "open_world": "durable_harness.api",
    "run_turn": "durable_harness.api",
    "enqueue_turn": "durable_harness.api",
    "resume_turn": "durable_harness.api",
    "run_worker": "durable_harness.api",
    "journaled_turn": "durable_harness.api",
    "JournaledTurn": "durable_harness.api",
    "ToolResult": "durable_harness.api",
    "tool": "durable_harness.harness.tools",
    "Tool": "durable_harness.harness.tools",
    "ToolContext": "durable_harness.harness.tools",
    "Replay": "durable_harness.harness.tools",
    "DurableHarnessError": "durable_harness.harness.errors",
    "World": "durable_harness.worlds.base",
    "Turn": "durable_harness.worlds.base",
    "TurnStatus": "durable_harness.worlds.base",
}

__all__ = [
    "DurableHarnessError",
    "JournaledTurn",
    "Replay",
    "Tool",
    "ToolContext",
    "ToolResult",
    "Turn",
    "TurnStatus",
    "World",
    "__version__",
    "enqueue_turn",
    "journaled_turn",
    "open_world",
    "resume_turn",
    "run_turn",
    "run_worker",
    "tool",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'durable_harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
