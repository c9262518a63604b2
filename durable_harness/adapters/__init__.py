"""Adapters: one module per agent (builtin, claude_code; codex, opencode, pi to come).

``get_adapter(name)`` imports the chosen module lazily. The CLI adapters share the
journaling model proxy (``proxy.py``) and the request canonicalizers (``canonical.py``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_harness.harness.errors import ConfigError

if TYPE_CHECKING:
    from durable_harness.adapters.base import Adapter

AVAILABLE = ("builtin", "claude-code")
PLANNED = ("codex", "opencode", "pi")


def get_adapter(name: str) -> Adapter:
    if name == "builtin":
        from durable_harness.adapters.builtin import BuiltinAdapter

        return BuiltinAdapter()
    if name == "claude-code":
        from durable_harness.adapters.claude_code import ClaudeCodeAdapter

        return ClaudeCodeAdapter()
    if name in PLANNED:
        raise ConfigError(
            f"agent {name!r} is not available in this version yet; use one of "
            f"{', '.join(AVAILABLE)}"
        )
    raise ConfigError(
        f"unknown agent {name!r}: choose one of {', '.join(AVAILABLE)} "
        f"(coming: {', '.join(PLANNED)})"
    )


def read_agent_config(path: str) -> dict[str, Any]:
    """An ``--agent-config`` TOML file as a dict, stored in the turn's configuration (so
    every worker applies the same options); the adapter's ``check`` validates it."""
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read --agent-config {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--agent-config {path} is not valid TOML: {exc}") from None
