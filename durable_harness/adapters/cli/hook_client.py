"""The hook command a CLI runs before and after each tool call (standard library only).

``python -I -S hook_client.py <endpoint.json> <event>`` reads the hook's JSON on stdin,
posts it to the journaling proxy named in ``endpoint.json`` (``{"url", "token"}``, a file
in the CLI's private HOME) and prints the proxy's reply, which the CLI reads as the hook's
decision. Any failure (the worker is gone, the proxy refused) exits with status 2, which
Claude Code treats as *block the tool*: a tool never runs unless its intent was recorded.
"""

from __future__ import annotations

import http.client
import json
import sys
from urllib.parse import urlsplit

TIMEOUT_SECONDS = 600.0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: hook_client.py <endpoint.json> <event>\n")
        return 2
    try:
        with open(argv[0], encoding="utf-8") as f:
            endpoint = json.load(f)
        body = sys.stdin.buffer.read()
        parts = urlsplit(endpoint["url"])
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT_SECONDS)
        conn.request(
            "POST",
            f"/_dh/{argv[1]}",
            body=body,
            headers={
                "Content-Type": "application/json",
                "X-Durable-Harness-Token": endpoint["token"],
            },
        )
        response = conn.getresponse()
        reply = response.read()
    except (OSError, ValueError, KeyError, http.client.HTTPException) as exc:
        sys.stderr.write(f"durable-harness is not reachable, so this tool is blocked: {exc}\n")
        return 2
    if response.status != 200:
        detail = reply.decode("utf-8", "replace")[:500]
        sys.stderr.write(f"durable-harness refused this tool call: {detail}\n")
        return 2
    sys.stdout.write(reply.decode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
