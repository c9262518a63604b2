"""The ACP agent's stdio as the library's message transport, bounded.

``agent-client-protocol``'s own NDJSON transport reads a line of any length (it joins
the chunks past its buffer limit) and skips a line that is not JSON with a log line.
The agent is untrusted, so :class:`BoundedTransport` (the library's ``Transport``
protocol: ``send``/``receive``/``close``) instead:

* reads at most ``max_line`` bytes per message: a longer line ends the connection;
* ends the connection at the first line that is not a JSON-RPC 2.0 object (a program
  that is not an ACP agent, printing something else on stdout), quoting its start;
* writes one compact JSON line per message.

Why the connection ended is kept in :attr:`BoundedTransport.broken`: the library then
fails every pending request with ``ConnectionError``, and the adapter raises this reason.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from durable_harness.core.canonical import parse_json

__all__ = ["DEFAULT_MAX_LINE", "BoundedTransport"]

#: The longest message the agent may send (a file the agent writes travels in one).
DEFAULT_MAX_LINE = 16 * 1024 * 1024
_QUOTE = 200


class BoundedTransport:
    """Newline-delimited JSON-RPC over the agent's stdout (``reader``) and stdin (``writer``)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_line: int = DEFAULT_MAX_LINE,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.max_line = max_line
        #: Why the agent's side ended, besides its EOF (None: it did not, or plain EOF).
        self.broken: str | None = None
        #: Whether any valid message came (a program that said nothing is told apart).
        self.spoke = False

    async def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
        self._writer.write(data + b"\n")
        await self._writer.drain()

    async def receive(self) -> dict[str, Any] | None:
        while True:
            try:
                line = await self._reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                line = exc.partial  # the last line, without its newline (or EOF)
                if not line.strip():
                    return None
            except asyncio.LimitOverrunError:
                self.broken = f"the agent sent a message longer than {self.max_line} bytes"
                return None
            if len(line) > self.max_line:
                self.broken = f"the agent sent a message longer than {self.max_line} bytes"
                return None
            if not line.strip():
                continue
            try:
                message = parse_json(line)
            except ValueError:
                message = None
            if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
                quoted = line[:_QUOTE].decode("utf-8", "replace").strip()
                self.broken = (
                    "the command is not an ACP agent: it wrote something other than "
                    f"JSON-RPC on its stdout: {quoted!r}"
                )
                return None
            self.spoke = True
            return message

    async def close(self) -> None:
        self._writer.close()
