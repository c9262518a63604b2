"""A streamed answer to the CLI: one HTTP/1.1 chunk per event, sent as it arrives.

:class:`ChunkedReply` starts the response without a Content-Length (the listener sends it
chunked) and hands each event to the listener at once. A CLI that went away (killed
mid-stream) does not stop the proxy: the answer is paid for, so the tee still reads it to
the end and records it; the listener drops writes to the gone client.
"""

from __future__ import annotations

from durable_harness.harness.listener import Exchange

__all__ = ["ChunkedReply"]


class ChunkedReply:
    """``start`` once, ``write`` each event, ``end`` once (a stream cut short skips it)."""

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange

    def start(self, status: int, headers: dict[str, str]) -> None:
        out = {k.lower(): v for k, v in headers.items() if k.lower() != "content-length"}
        out["cache-control"] = "no-cache"
        self._exchange.start(status, out)

    def write(self, data: bytes) -> None:
        self._exchange.write(data)

    def end(self) -> None:
        self._exchange.end()
