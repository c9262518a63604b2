"""One launch's ACP conversation: ``initialize``, ``session/new`` or ``session/load``,
``session/prompt``, each with a timeout, while the agent's requests are served.

:func:`converse` is the whole of it, on an asyncio loop of its own (the adapter runs it
with ``asyncio.run`` in the launch's thread). It ends with the reply (the agent's
message text of the prompt, ``stopReason`` ``end_turn``) or one error:

* the agent's stdout is not JSON-RPC, or a message is too long
  (:class:`~.acp.transport.BoundedTransport`): :class:`TurnFailed`, quoting it;
* it does not answer ``initialize`` in the preset's time: :class:`TurnFailed`;
* it exits: :class:`DurableHarnessError` (retried: a resume continues its session),
  with its stderr's tail;
* it asks for a method the client did not offer: :class:`TurnFailed`;
* its ``initialize`` result is refused by ``check_initialize`` (another version than the
  preset's: :class:`~durable_harness.core.errors.ConfigError`), before ``session/new``;
* the proxy's fatal error (a lost lease, a cancel, the model-call budget, a pending
  wait in stop mode) is raised as it is.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import acp
from acp.connection import StreamDirection, StreamEvent
from acp.schema import (
    AcpMcpServer,
    ClientCapabilities,
    FileSystemCapabilities,
    HttpHeader,
    HttpMcpServer,
    Implementation,
    McpServerStdio,
    SseMcpServer,
)

from durable_harness.adapters.acp.client import HarnessClient
from durable_harness.adapters.acp.process import Agent
from durable_harness.adapters.acp.transport import BoundedTransport
from durable_harness.core.errors import DurableHarnessError, TurnFailed

__all__ = ["PROMPT_TIMEOUT", "SERVED", "Conversation", "converse"]

T = TypeVar("T")

#: The agent's requests the client serves; any other request ends the turn.
SERVED = frozenset(
    {
        "session/request_permission",
        "fs/read_text_file",
        "fs/write_text_file",
        "terminal/create",
        "terminal/output",
        "terminal/wait_for_exit",
        "terminal/kill",
        "terminal/release",
    }
)
#: Seconds a session/new or session/load may take.
SESSION_TIMEOUT = 120.0
#: Seconds one prompt may take in all (its model calls and tools have their own limits).
PROMPT_TIMEOUT = 6 * 3600.0


@dataclass
class Conversation:
    """What one launch says: the message, the session to load (if any) and the MCP
    server of the host tools (None: the turn has none)."""

    message: str
    workspace: str
    load: str | None
    mcp_url: str | None
    token: str
    initialize_timeout: float
    #: Called with the ``initialize`` result's ``agentInfo`` (or None); raises to refuse
    #: the agent (the version check, :func:`~.acp.version.check_initialized`).
    check_initialize: Callable[[Any], None] | None = None


@dataclass
class Ended:
    reply: str
    session: str
    loaded: bool


async def converse(
    agent: Agent,
    client: HarnessClient,
    talk: Conversation,
    fatal: threading.Event,
    fatal_error: Any,
) -> Ended:
    """Run the conversation (module docstring); ``fatal``/``fatal_error()`` is the proxy's."""
    transport = BoundedTransport(agent.stdout, agent.stdin)

    def observe(event: StreamEvent) -> None:
        message = event.message
        if event.direction is StreamDirection.INCOMING and "id" in message:
            method = message.get("method")
            if isinstance(method, str) and method not in SERVED:
                client.note_unoffered(method)

    conn = acp.connect_to_agent(cast(acp.Client, client), transport, observers=[observe])
    watch = _Watch(agent, transport, client, fatal, fatal_error)
    try:
        init = await watch.ask(
            conn.initialize(
                protocol_version=acp.PROTOCOL_VERSION,
                client_capabilities=ClientCapabilities(
                    fs=FileSystemCapabilities(read_text_file=True, write_text_file=True),
                    terminal=True,
                ),
                client_info=Implementation(name="durable-harness", version="1"),
            ),
            "initialize",
            talk.initialize_timeout,
        )
        if talk.check_initialize is not None:
            talk.check_initialize(init.agent_info)
        servers: list[HttpMcpServer | SseMcpServer | AcpMcpServer | McpServerStdio] = []
        if talk.mcp_url is not None:
            bearer = [HttpHeader(name="Authorization", value=f"Bearer {talk.token}")]
            servers = [
                HttpMcpServer(type="http", name="durable-harness", url=talk.mcp_url, headers=bearer)
            ]
        can_load = bool(init.agent_capabilities and init.agent_capabilities.load_session)
        if talk.load is not None and can_load:
            await watch.ask(
                conn.load_session(cwd=talk.workspace, session_id=talk.load, mcp_servers=servers),
                "session/load",
                SESSION_TIMEOUT,
            )
            session, loaded = talk.load, True
        else:
            created = await watch.ask(
                conn.new_session(cwd=talk.workspace, mcp_servers=servers),
                "session/new",
                SESSION_TIMEOUT,
            )
            session, loaded = created.session_id, False
        client.texts.clear()  # a loaded session's history is replayed as updates first
        ended = await watch.ask(
            conn.prompt(session_id=session, prompt=[acp.text_block(talk.message)]),
            "session/prompt",
            PROMPT_TIMEOUT,
        )
        if ended.stop_reason != "end_turn":
            raise TurnFailed(f"the agent ended its turn with stop reason {ended.stop_reason!r}")
        return Ended("".join(client.texts), session, loaded)
    finally:
        await conn.close()


class _Watch:
    """Awaits one request of the client's at a time, against everything that ends it."""

    def __init__(
        self,
        agent: Agent,
        transport: BoundedTransport,
        client: HarnessClient,
        fatal: threading.Event,
        fatal_error: Any,
    ) -> None:
        self.agent = agent
        self.transport = transport
        self.client = client
        self.fatal = fatal
        self.fatal_error = fatal_error

    async def ask(self, request: Awaitable[T], method: str, timeout: float) -> T:
        task = asyncio.ensure_future(request)
        stops = [
            asyncio.ensure_future(self.client.unoffered_event.wait()),
            asyncio.ensure_future(_wait_event(self.fatal)),
        ]
        try:
            done, _ = await asyncio.wait(
                [task, *stops], timeout=timeout, return_when="FIRST_COMPLETED"
            )
        finally:
            for stop in stops:
                stop.cancel()
        answered = task.done() and not task.cancelled() and task.exception() is None
        if self.fatal.is_set() and not answered:
            # (An answer that came first stands: a request the agent makes as its turn
            # ends, such as a background model call, does not undo the turn.)
            task.cancel()
            raise self.fatal_error()
        if self.client.unoffered is not None:
            task.cancel()
            raise TurnFailed(self.client.unoffered)
        if task not in done:
            task.cancel()
            raise TurnFailed(f"the agent did not answer {method} within {timeout:g} s")
        try:
            return task.result()
        except ConnectionError:
            raise self._gone(method) from None
        except acp.RequestError as exc:
            raise TurnFailed(f"the agent refused {method}: {exc}") from None

    def _gone(self, method: str) -> DurableHarnessError:
        if self.transport.broken is not None:
            return TurnFailed(self.transport.broken)
        stderr = self.agent.stderr_tail(500).strip() or "nothing on stderr"
        return DurableHarnessError(
            f"the agent's connection ended before it answered {method} "
            f"(exit status {self.agent.returncode}): {stderr}"
        )


async def _wait_event(event: threading.Event) -> None:
    while not event.is_set():
        await asyncio.sleep(0.1)
