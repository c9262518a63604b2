"""Signals: how the outside world (a CI system, a human) wakes a waiting turn.

Two doors, one rule (``World.send_signal``: first payload wins, a duplicate is ignored, a
signal that arrives before its wait is kept):

* ``durable-harness signal TURN NAME --data JSON`` for people and scripts with World access;
* ``durable-harness signal-server``: an HTTP endpoint for webhooks,
  ``POST /v1/turns/<turn>/signals/<name>`` with ``Authorization: Bearer <secret>`` and the
  JSON payload as the body. The secret is per turn (generated when the turn is created;
  tools read it from ``ToolContext.signal_secret``), compared in constant time.
"""

from __future__ import annotations

import hmac
import json
import re
import signal as os_signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from durable_harness.core.errors import ConfigError, NotFound
from durable_harness.core.world import World

MAX_PAYLOAD = 1024 * 1024
_PATH = re.compile(r"^/v1/turns/(?P<turn>[A-Za-z0-9_.-]+)/signals/(?P<name>[A-Za-z0-9_.:-]+)$")


def parse_payload(data: str | None) -> str:
    """The payload as canonical JSON text; ConfigError if it is not JSON."""
    if data is None or data == "":
        return "null"
    try:
        return json.dumps(json.loads(data), sort_keys=True)
    except ValueError as exc:
        raise ConfigError(
            f'--data must be JSON ({exc}); e.g. --data \'{{"status": "ok"}}\''
        ) from exc


class _Handler(BaseHTTPRequestHandler):
    server: SignalServer

    def log_message(self, format: str, *args: Any) -> None:
        self.server.log(f"{self.address_string()} {format % args}")

    def do_POST(self) -> None:
        match = _PATH.match(self.path.split("?", 1)[0])
        if match is None:
            self._send(404, {"error": "not found: POST /v1/turns/<turn>/signals/<name>"})
            return
        turn_id, name = match["turn"], match["name"]
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_PAYLOAD:
            self._send(413, {"error": f"payload over {MAX_PAYLOAD} bytes"})
            return
        body = self.rfile.read(length).decode("utf-8", "replace")
        try:
            with self.server.lock:
                turn = self.server.world.get_turn(turn_id)
                secret = str(turn.config.get("signal_secret", ""))
                given = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
                if not secret or not hmac.compare_digest(given.encode(), secret.encode()):
                    self._send(401, {"error": "bad or missing bearer secret for this turn"})
                    return
                payload = parse_payload(body)
                fresh = self.server.world.send_signal(turn_id, name, payload)
        except NotFound:
            self._send(404, {"error": f"no turn {turn_id}"})
            return
        except ConfigError as exc:
            self._send(400, {"error": str(exc)})
            return
        self._send(200 if fresh else 208, {"turn": turn_id, "signal": name, "new": fresh})

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class SignalServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, world: World, host: str, port: int, quiet: bool = False) -> None:
        super().__init__((host, port), _Handler)
        self.world = world
        self.quiet = quiet
        # One World connection shared by the handler threads: serialize its use.
        self.lock = threading.Lock()

    def log(self, line: str) -> None:
        if not self.quiet:
            sys.stderr.write(f"signal-server: {line}\n")

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


def serve(world: World, host: str, port: int) -> None:
    server = SignalServer(world, host, port)
    print(f"signal server listening on {server.url}", flush=True)

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    os_signal.signal(os_signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
