"""What the tests of Pi and OpenCode on another wire API share: an agent config choosing
the provider's API (``[provider] api``), and the run arguments that use it."""

from __future__ import annotations

from pathlib import Path

from claude_cases import (
    AGENT_CONFIG,
    PROMPT,
)
from support import Harness

__all__ = ["CHAT_POINTS", "agent_config", "wire_run_args"]

#: The kill points run on another wire API (:mod:`kill_matrix`): while a response
#: streams, while the tool runs, after the tool's outcome (before the next model call).
CHAT_POINTS = ("model streaming", "tool running", "after tool")

HERE = Path(__file__).resolve().parent
TOOLS = f"{HERE.parent / 'fixtures' / 'claude_tools.py'}:TOOLS"


def agent_config(tmp: Path, api: str) -> Path:
    """The tests' agent config (cat and ls replay as safe) with ``[provider] api``."""
    path = tmp / f"agent-{api}.toml"
    path.write_text(AGENT_CONFIG.read_text() + f'\n[provider]\napi = "{api}"\n')
    return path


def wire_run_args(h: Harness, agent: str, api: str, *extra: str, prompt: str = PROMPT) -> list[str]:
    return [
        "run",
        "--agent",
        agent,
        "--workspace",
        str(h.tmp / "ws"),
        "--tools",
        TOOLS,
        "--agent-config",
        str(agent_config(h.tmp, api)),
        *extra,
        prompt,
    ]
