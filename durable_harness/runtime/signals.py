"""Signals: how the outside world (a CI system, a human) wakes a waiting turn.

Two doors, one rule (``World.send_signal``: signals of a name queue up in arrival order, a
duplicate delivery is ignored, a signal that arrives before its wait is kept until a wait
takes it):

* ``durable-harness signal TURN NAME --data JSON`` for people and scripts with World access;
* ``durable-harness signal-server``: an HTTP endpoint for webhooks,
  ``POST /v1/turns/<turn>/signals/<name>`` with ``Authorization: Bearer <secret>`` and the
  JSON payload as the body. The secret is per turn (generated when the turn is created;
  tools read it from ``ToolContext.signal_secret``), compared in constant time; an unknown
  turn is answered 401, the same as a wrong secret. An ``Idempotency-Key`` header is the
  delivery id (else the payload is). The same server takes CI webhooks,
  ``POST /v1/webhooks/github`` and ``/v1/webhooks/gitlab`` (:mod:`.webhooks`). The
  listener's limits (:mod:`durable_harness.harness.listener`) apply to every request, with
  a body cap of ``MAX_PAYLOAD``.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from typing import Any

from durable_harness.core.canonical import parse_json
from durable_harness.core.errors import ConfigError, NotFound
from durable_harness.core.settings import WebhookSettings
from durable_harness.core.world import World
from durable_harness.harness.events import signal_received
from durable_harness.harness.listener import (
    BodyLimit,
    Exchange,
    Limits,
    Listener,
    SyncApp,
    token_matches,
    wait_until_terminated,
)
from durable_harness.runtime import webhooks
from durable_harness.runtime.cancel import refuse_reserved_signal

MAX_PAYLOAD = 1024 * 1024
_PATH = re.compile(r"^/v1/turns/(?P<turn>[A-Za-z0-9_.-]+)/signals/(?P<name>[A-Za-z0-9_.:-]+)$")
_WEBHOOK = re.compile(r"^/v1/webhooks/(?P<provider>github|gitlab)$")


def parse_payload(data: str | None) -> str:
    """The payload as canonical JSON text; ConfigError if it is not JSON."""
    if data is None or data == "":
        return "null"
    try:
        return json.dumps(parse_json(data), sort_keys=True)
    except ValueError as exc:
        raise ConfigError(
            f'--data must be JSON ({exc}); e.g. --data \'{{"status": "ok"}}\''
        ) from exc


class SignalServer:
    """The webhook listener (see the module docstring); its socket is bound at once."""

    def __init__(
        self,
        world: World,
        host: str,
        port: int,
        quiet: bool = False,
        limits: Limits | None = None,
        secrets: WebhookSettings | None = None,
    ) -> None:
        self.world = world
        self.quiet = quiet
        self.secrets = secrets or WebhookSettings.load()
        # One World connection shared by the request threads: serialize its use.
        self.lock = threading.Lock()
        limits = limits or Limits.from_settings(max_body=MAX_PAYLOAD)
        self._listener = Listener(
            BodyLimit(SyncApp(self._handle), limits), host, port, limits, name="signal-server"
        )

    def log(self, line: str) -> None:
        if not self.quiet:
            sys.stderr.write(f"signal-server: {line}\n")

    @property
    def url(self) -> str:
        return self._listener.url

    def start(self) -> SignalServer:
        self._listener.start()
        return self

    def stop(self) -> None:
        self._listener.stop()

    def _handle(self, exchange: Exchange) -> None:
        status = self._answer(exchange)
        self.log(f"{exchange.method} {exchange.path} {status}")

    def _answer(self, exchange: Exchange) -> int:
        path = exchange.path.split("?", 1)[0]
        hook = _WEBHOOK.match(path)
        if exchange.method == "POST" and hook is not None:
            return self._webhook(exchange, hook["provider"])
        match = _PATH.match(path)
        if exchange.method != "POST" or match is None:
            return _send(
                exchange, 404, {"error": "not found: POST /v1/turns/<turn>/signals/<name>"}
            )
        turn_id, name = match["turn"], match["name"]
        given = exchange.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        try:
            refuse_reserved_signal(name)  # the turn's secret does not cancel it
            with self.lock:
                try:
                    secret = str(self.world.get_turn(turn_id).config.get("signal_secret", ""))
                except NotFound:
                    # The same answer as a wrong secret: a caller without the secret
                    # learns nothing, not even whether the turn exists.
                    secret = ""
                if not token_matches(given, secret):
                    return _send(
                        exchange, 401, {"error": "bad or missing bearer secret for this turn"}
                    )
                payload = parse_payload(exchange.body.decode("utf-8", "replace"))
                delivery = exchange.headers.get("Idempotency-Key") or None
                fresh = self.world.send_signal(turn_id, name, payload, delivery)
                signal_received(self.world, turn_id, name, payload, delivery)
        except ConfigError as exc:
            return _send(exchange, 400, {"error": str(exc)})
        return _send(
            exchange, 200 if fresh else 208, {"turn": turn_id, "signal": name, "new": fresh}
        )

    def _webhook(self, exchange: Exchange, provider: str) -> int:
        headers = {k.lower(): v for k, v in exchange.headers.items()}
        try:
            webhooks.authenticate(provider, self.secrets.secret(provider), headers, exchange.body)
            result, delivery = webhooks.parse(provider, headers, exchange.body)
        except webhooks.Refused as exc:
            return _send(exchange, exc.status, {"error": str(exc)})
        if result is None:
            self.log(f"{provider} webhook: no finished CI run in it; ignored")
            return _send(exchange, 202, {"accepted": True})
        with self.lock:
            fresh = webhooks.deliver(self.world, result, delivery)
        # Logged for the operator; the answer is the same whether any turn watched.
        self.log(
            f"{provider} {result.event} {result.repo}@{result.sha[:12]} {result.status}: "
            f"{fresh} new signal(s)"
        )
        return _send(exchange, 202, {"accepted": True})


def _send(exchange: Exchange, status: int, body: dict[str, Any]) -> int:
    exchange.send(status, json.dumps(body).encode(), {"content-type": "application/json"})
    return status


def serve(world: World, host: str, port: int) -> None:
    server = SignalServer(world, host, port)
    print(f"signal server listening on {server.url}", flush=True)
    server.start()
    try:
        wait_until_terminated()
    finally:
        server.stop()
