"""A streamed answer to the CLI: HTTP/1.1 chunked transfer encoding, one chunk per event.

``http.server`` writes a response whole; a streamed model answer goes out as it arrives, so
:class:`ChunkedReply` writes the chunk framing itself over the handler's socket, flushing
each event at once. A CLI that went away (killed mid-stream) does not stop the proxy: the
answer is paid for, so the tee still reads it to the end and records it; writes to the
gone client are dropped and its connection is marked to close.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

__all__ = ["ChunkedReply"]


class ChunkedReply:
    """``start`` once, ``write`` each event, ``end`` once (a stream cut short skips it)."""

    def __init__(self, handler: BaseHTTPRequestHandler) -> None:
        self._handler = handler
        self.client_gone = False

    def start(self, status: int, headers: dict[str, str]) -> None:
        handler = self._handler
        try:
            handler.send_response(status)
            for name, value in headers.items():
                handler.send_header(name, value)
            handler.send_header("Cache-Control", "no-cache")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
        except OSError:
            self.client_gone = True

    def write(self, data: bytes) -> None:
        if self.client_gone or not data:
            return
        try:
            self._handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self._handler.wfile.flush()
        except OSError:
            self.client_gone = True
            self._handler.close_connection = True

    def end(self) -> None:
        if self.client_gone:
            return
        try:
            self._handler.wfile.write(b"0\r\n\r\n")
            self._handler.wfile.flush()
        except OSError:
            self._handler.close_connection = True
