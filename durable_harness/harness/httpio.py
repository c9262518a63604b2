"""HTTP plumbing shared by the servers in the package (the fake model, the CLI proxy)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

#: Far above any real model request; stops a runaway client.
MAX_BODY = 64 * 1024 * 1024


class BodyCut(Exception):
    """The client went away before its body was whole (a killed worker, mid-send).

    Nobody is left to read an answer, and half a body must never be taken for a request
    (a fake model would log it as a bad request, a proxy could journal it).
    """


def read_body(handler: BaseHTTPRequestHandler, max_body: int = MAX_BODY) -> bytes | None:
    """The request body (Content-Length or chunked), or None when it is too large (the
    connection is then marked to close: the rest of the body is never read).

    Raises :class:`BodyCut` (and marks the connection to close) when the stream ends first.
    """
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks: list[bytes] = []
        total = 0
        while True:
            line = handler.rfile.readline()
            if not line:
                handler.close_connection = True
                raise BodyCut("the stream ended before the last chunk")
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                # Trailers end with an empty line.
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            total += size
            if total > max_body:
                handler.close_connection = True
                return None
            chunk = handler.rfile.read(size)
            if len(chunk) < size:
                handler.close_connection = True
                raise BodyCut(f"a chunk ended after {len(chunk)} of {size} bytes")
            chunks.append(chunk)
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    if length > max_body:
        handler.close_connection = True
        return None
    body = handler.rfile.read(length)
    if len(body) < length:
        handler.close_connection = True
        raise BodyCut(f"the body ended after {len(body)} of {length} bytes")
    return body
