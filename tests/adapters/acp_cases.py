"""What the ACP adapter's tests share: harnesses for ``acp:opencode`` and for the
scripted agent (``tests/fixtures/acp_agent.py``, run in the opencode preset's place
through ``DURABLE_HARNESS_OPENCODE_BIN``, the operator's binary override)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from support import Harness, make_harness

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
FAKE_AGENT = FIXTURES / "acp_agent.py"
#: The scripted agent makes no model call; the fake model answers nothing.
_EMPTY_SCRIPT = """
[[rule]]
name = "none"
reply.text = "unused"
"""


def fake_agent_harness(
    tmp: Path, mode: str, sleep: float = 0, version: str = ""
) -> Iterator[Harness]:
    """A harness whose ``acp:opencode`` is the scripted agent in ``mode``, reporting
    ``version`` in its ``initialize`` result (default: the opencode pin)."""
    ws = tmp / "ws"
    ws.mkdir()
    (ws / ".acp-mode").write_text(f"{mode} {sleep:g} {version}".strip() + "\n")
    script = tmp / "script.toml"
    script.write_text(_EMPTY_SCRIPT)
    for h in make_harness(tmp, script):
        h.env["DURABLE_HARNESS_OPENCODE_BIN"] = str(FAKE_AGENT)
        h.env["DURABLE_HARNESS_ACP_INITIALIZE_TIMEOUT"] = "5"
        yield h


def run_args(h: Harness, *extra: str, agent: str = "acp:opencode", prompt: str = "go") -> list[str]:
    return ["run", "--agent", agent, "--workspace", str(h.tmp / "ws"), *extra, prompt]
