"""Adapters: one module per agent (builtin now; claude_code, codex, opencode, pi to come).

``get_adapter(name)`` imports the chosen module lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_harness.harness.errors import ConfigError

if TYPE_CHECKING:
    from durable_harness.adapters.base import Adapter

AVAILABLE = ("builtin",)
PLANNED = ("claude-code", "codex", "opencode", "pi")


def get_adapter(name: str) -> Adapter:
    if name == "builtin":
        from durable_harness.adapters.builtin import BuiltinAdapter

        return BuiltinAdapter()
    if name in PLANNED:
        raise ConfigError(
            f"agent {name!r} is not available in this version yet; use --agent builtin"
        )
    raise ConfigError(
        f"unknown agent {name!r}: choose one of {', '.join(AVAILABLE)} "
        f"(coming: {', '.join(PLANNED)})"
    )
