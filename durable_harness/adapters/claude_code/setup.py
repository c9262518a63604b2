"""Claude Code's pin and the names every worker derives alike (:mod:`.claude_code.spec`):
the one pinned version (scripts/setup), the CLI's session id of a durable-harness session
and the folder its transcripts go to.
"""

from __future__ import annotations

import re
import uuid

__all__ = [
    "BIN_ENV",
    "CLAUDE_CODE_VERSION",
    "claude_session_id",
    "project_dir_name",
]

#: The one Claude Code version this adapter's rules were measured on (scripts/setup).
CLAUDE_CODE_VERSION = "2.1.332"
BIN_ENV = "DURABLE_HARNESS_CLAUDE_BIN"
_SESSION_NAMESPACE = uuid.UUID("5d0b8f5e-5b39-4bb5-9a55-3c1f1f4b0d2a")


def project_dir_name(workspace: str) -> str:
    """Claude Code's folder for a workspace's transcripts: the path, non-alphanumerics as -."""
    return re.sub(r"[^a-zA-Z0-9]", "-", workspace)


def claude_session_id(session_id: str) -> str:
    """The Claude Code session id of a durable-harness session (the same on every worker)."""
    return str(uuid.uuid5(_SESSION_NAMESPACE, session_id))
