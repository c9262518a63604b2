"""HTTP plumbing shared by the servers in the package (the fake model, the CLI proxy)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

#: Far above any real model request; stops a runaway client.
MAX_BODY = 64 * 1024 * 1024


def read_body(handler: BaseHTTPRequestHandler, max_body: int = MAX_BODY) -> bytes | None:
    """The request body (Content-Length or chunked), or None when it is too large (the
    connection is then marked to close: the rest of the body is never read)."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks: list[bytes] = []
        total = 0
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                # Trailers end with an empty line.
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            total += size
            if total > max_body:
                handler.close_connection = True
                return None
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    if length > max_body:
        handler.close_connection = True
        return None
    return handler.rfile.read(length)
