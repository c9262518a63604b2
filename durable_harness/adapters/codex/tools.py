"""The user's host tools (and the wait tools) served to Codex over MCP, keyed by call id.

Codex 0.171.0 connects to the harness's MCP endpoint (``/mcp`` on the journaling proxy,
``[mcp_servers."durable-harness"]`` in its ``config.toml``, streamable HTTP, the bearer
token read from :data:`~.codex.spec.TOKEN_ENV`). Measured against the fake model:

* it offers the server's tools to the model as the Responses namespace
  ``mcp__durable_harness`` (the ``-`` becomes ``_``), each tool under its own name;
* its PreToolUse hook fires for them first, with ``tool_name`` =
  ``mcp__durable_harness__<tool>`` and ``tool_use_id`` = the model's call id;
* its ``tools/call`` then carries that same call id in ``_meta["callId"]``.

So, unlike OpenCode (:mod:`.opencode.tools`, matching by tool and arguments), the MCP call
names its own call id: the step is keyed ``tool:<call_id>`` and journaled by
:class:`~.mcp.HostToolServer` under the tool's own replay label.
"""

from __future__ import annotations

from typing import Any

from durable_harness.adapters.cli.mcp import TOOL_USE_META, HostToolServer

__all__ = ["CALL_ID_META", "HOST_TOOL_PREFIX", "CodexHostTools"]


#: How Codex's hooks name a tool of the MCP server ``durable-harness``.
HOST_TOOL_PREFIX = "mcp__durable_harness__"
#: Where Codex's ``tools/call`` puts the model's call id.
CALL_ID_META = "callId"


class CodexHostTools(HostToolServer):
    """:class:`~.mcp.HostToolServer` taking the call id from Codex's ``_meta.callId``."""

    def call(self, params: dict[str, Any]) -> dict[str, Any]:
        meta = dict(params.get("_meta") or {})
        if not meta.get(TOOL_USE_META) and meta.get(CALL_ID_META):
            meta[TOOL_USE_META] = meta[CALL_ID_META]
        return super().call({**params, "_meta": meta})
