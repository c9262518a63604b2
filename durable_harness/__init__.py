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

from durable_harness.core.version import __version__

if TYPE_CHECKING:
    from durable_harness.core.errors import DurableHarnessError
    from durable_harness.core.types import Replay, Turn, TurnStatus
    from durable_harness.core.world import World
    from durable_harness.harness.tools import (
        ABSENT,
        UNKNOWN,
        Checked,
        Tool,
        ToolContext,
        done,
        tool,
    )
    from durable_harness.runtime.api import (
        JournaledTurn,
        ToolResult,
        enqueue_turn,
        journaled_turn,
        open_world,
        resume_turn,
        run_turn,
        run_worker,
    )

#: Public name -> the module that defines it (imported when the name is first used).
_EXPORTS = {
    "open_world": "durable_harness.runtime.api",
    "run_turn": "durable_harness.runtime.api",
    "enqueue_turn": "durable_harness.runtime.api",
    "resume_turn": "durable_harness.runtime.api",
    "run_worker": "durable_harness.runtime.api",
    "journaled_turn": "durable_harness.runtime.api",
    "JournaledTurn": "durable_harness.runtime.api",
    "ToolResult": "durable_harness.runtime.api",
    "tool": "durable_harness.harness.tools",
    "Checked": "durable_harness.harness.tools",
    "done": "durable_harness.harness.tools",
    "ABSENT": "durable_harness.harness.tools",
    "UNKNOWN": "durable_harness.harness.tools",
    "Tool": "durable_harness.harness.tools",
    "ToolContext": "durable_harness.harness.tools",
    "Replay": "durable_harness.core.types",
    "DurableHarnessError": "durable_harness.core.errors",
    "World": "durable_harness.core.world",
    "Turn": "durable_harness.core.types",
    "TurnStatus": "durable_harness.core.types",
}

__all__ = [
    "ABSENT",
    "UNKNOWN",
    "Checked",
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
    "done",
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
