"""The journal side of the proxy: a model call's step, and the tee that records it.

:class:`ModelSteps` finds or opens the journal step of a model request (its key is
``model:<hash>`` of the canonical request), makes an identical request that arrives while
the first is still streaming wait for its outcome instead of paying twice, and records an
outcome. :func:`tee_stream` reads an upstream SSE stream event by event, passing each to
the CLI as it arrives and keeping it for the journal, and stops *before* the events the
CLI may see only once the outcome is recorded (:meth:`~.wire.base.WireFormat.holds_back`);
:meth:`Teed.release` sends those after the caller recorded the outcome.
:func:`read_json_reply` is the same for a non-streamed reply.

A recorded outcome is ``{"status", "headers", "stream": True, "events": [raw text, ...]}``
(each event exactly as upstream sent it) or ``{..., "stream": False, "body": message}``;
:func:`message_of` reads the JSON response back from either.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from durable_harness.adapters.proxy.canonical import Canonicalizer
from durable_harness.adapters.proxy.chunked import ChunkedReply
from durable_harness.adapters.proxy.sse import EventSplitter, MalformedStream, event_bytes
from durable_harness.adapters.proxy.upstream import UpstreamBroke, UpstreamReply
from durable_harness.adapters.proxy.wire.anthropic import ANTHROPIC
from durable_harness.adapters.proxy.wire.base import WireFormat, error_text
from durable_harness.core.canonical import sha256_hex
from durable_harness.core.keys import model_key, tool_key
from durable_harness.core.types import StepStatus
from durable_harness.harness.journal import Journal, OpenStep, Outcome, StepResult

__all__ = ["ModelSteps", "ProxyStats", "Teed", "message_of", "read_json_reply", "tee_stream"]


@dataclass
class ProxyStats:
    upstream_calls: int = 0  # model calls forwarded upstream
    replayed: int = 0  # answered from the journal
    by_key: dict[str, int] = field(default_factory=dict)  # forwards per journal key


class ModelSteps:
    """The model-call steps of one proxy: lookup, in-flight dedup, outcome, counters."""

    def __init__(self, journal: Journal, canonicalizer: Canonicalizer) -> None:
        self.journal = journal
        self.canonicalizer = canonicalizer
        self.stats = ProxyStats()
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}

    def tool_outcome(self, tool_use_id: str) -> str | None:
        """Digest of the recorded outcome of CLI tool call ``tool_use_id`` (canonical form)."""
        step = self.journal.lookup(tool_key(tool_use_id))
        if step is None or step.status is not StepStatus.DONE:
            return None
        return step.output_blob or sha256_hex((step.output or "").encode())

    def recorded(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> bool:
        """Whether the journal holds the outcome of this request (a replay, no upstream)."""
        try:
            digest = self.canonicalizer.key(path, headers, body, self.tool_outcome)
        except Exception:  # a body the CLI's canonical form cannot read was never recorded
            return False
        step = self.journal.lookup(model_key(digest))
        return step is not None and step.status is StepStatus.DONE

    def begin(
        self, path: str, headers: dict[str, str], body: dict[str, Any]
    ) -> tuple[str, StepResult | OpenStep]:
        """Find or open the journal step of a request; waits out an identical one in flight.

        An open step must be given back with :meth:`finished` once its call is over.
        """
        digest = self.canonicalizer.key(path, headers, body, self.tool_outcome)
        key = model_key(digest)
        model = str(body.get("model") or "model")
        while True:
            with self._lock:
                running = self._inflight.get(key)
                if running is None:
                    self._inflight[key] = threading.Event()
            if running is None:
                break
            running.wait()  # a retry of a request still streaming: answer it from its outcome
        try:
            begun = self.journal.begin_keyed(
                kind="model",
                name=model,
                key=key,
                input={"canonical_sha256": digest},
                replay="safe",
                store_input=False,
            )
        except BaseException:
            self.finished(key)
            raise
        if isinstance(begun, StepResult):
            self.finished(key)
        return key, begun

    def wait_idle(self, timeout: float) -> None:
        """Wait (up to ``timeout`` seconds) until the model calls in flight now have ended:
        their outcomes are then in the journal, or they failed."""
        deadline = time.monotonic() + timeout
        with self._lock:
            running = list(self._inflight.values())
        for event in running:
            event.wait(max(deadline - time.monotonic(), 0.0))

    def finished(self, key: str) -> None:
        with self._lock:
            event = self._inflight.pop(key, None)
        if event is not None:
            event.set()

    def count_forward(self, key: str) -> None:
        with self._lock:
            self.stats.upstream_calls += 1
            self.stats.by_key[key] = self.stats.by_key.get(key, 0) + 1

    def record(
        self,
        step: OpenStep,
        wire: WireFormat,
        value: dict[str, Any],
        message: dict[str, Any],
        started: float,
        first_byte: float | None,
    ) -> None:
        """Record the outcome (raises what the journal raises: a lost lease stops the turn)."""
        meta = wire.meta(message)
        if not meta.get("model"):
            meta["model"] = step.step.name  # the request's model (see ``begin``)
        if first_byte is not None:
            meta["first_byte_ms"] = round((first_byte - started) * 1000, 1)
        self.journal.end(step, Outcome(value, meta))


@dataclass
class Teed:
    """A stream read to its end. ``problem`` set: it failed (nothing to record; the CLI's
    stream was already ended or is to be cut). Otherwise ``value`` and ``message`` are the
    outcome to record, then :meth:`release` sends the held-back events."""

    client: ChunkedReply
    value: dict[str, Any]
    message: dict[str, Any]
    first_byte: float | None
    problem: str | None
    held: list[str]

    def release(self) -> None:
        for text in self.held:
            self.client.write(event_bytes(text))
        self.client.end()


def tee_stream(
    reply: UpstreamReply,
    client: ChunkedReply,
    wire: WireFormat,
    closing: threading.Event,
    on_text: Callable[[str], None] | None = None,
) -> Teed:
    """Pass upstream's events to ``client`` as they arrive and keep them; see the module
    docstring. The chunked response to the CLI is started here. ``on_text`` gets each
    piece of model text as its event arrives (the turn's live text)."""
    headers = reply.passed_headers()
    splitter = EventSplitter()
    kept: list[str] = []
    parsed: list[dict[str, Any]] = []
    first_byte: float | None = None
    client.start(200, headers)
    problem: str | None = None
    stopped = False
    held: int | None = None  # kept[held:] wait until the outcome is recorded
    chunks = reply.chunks()
    try:
        while not stopped and problem is None and not closing.is_set():
            chunk = next(chunks, None)
            if chunk is None:
                break
            first_byte = first_byte or time.monotonic()
            for text in splitter.feed(chunk):
                event = wire.parse_event(text)
                if event is None:  # a keep-alive comment
                    client.write(event_bytes(text))
                    continue
                kept.append(text)
                parsed.append(event.data)
                piece = wire.text_delta(event) if on_text is not None else None
                if piece and on_text is not None:
                    on_text(piece)
                if held is None and wire.holds_back(event):
                    held = len(kept) - 1
                if event.type == wire.final_event:
                    stopped = True
                    break
                if held is None or event.type in wire.error_events:
                    client.write(event_bytes(text))
                if event.type in wire.error_events:
                    problem = f"the model endpoint failed mid-stream: {error_text(text)}"
                    client.end()
                    break
        if stopped:
            for _ in chunks:  # the chunked terminator, so the connection can be reused
                pass
    except MalformedStream as exc:
        problem = f"the model endpoint sent a malformed stream ({exc})"
        client.write(wire.error_event("api_error", f"durable-harness proxy: {problem}").encode())
        client.end()
    except UpstreamBroke as exc:
        problem = f"the model stream broke off: {exc}"
    if problem is None and not stopped:
        problem = f"the model stream ended before {wire.final_event}"
    if problem is not None:
        reply.close()  # its connection is not reused
        return Teed(client, {}, {}, first_byte, problem, [])
    value = {"status": 200, "headers": headers, "stream": True, "events": kept}
    release = kept[held if held is not None else -1 :]
    return Teed(client, value, wire.assemble(parsed), first_byte, None, release)


def read_json_reply(reply: UpstreamReply, wire: WireFormat) -> dict[str, Any]:
    """The whole JSON response of a non-streamed reply.

    UpstreamBroke when it broke off, ValueError when it is not a response of ``wire``.
    """
    try:
        data = reply.read()
    finally:
        reply.close()
    message: dict[str, Any] = json.loads(data)
    if not wire.is_response(message):
        raise ValueError(f"not a {wire.name} response")
    return message


def message_of(recorded: dict[str, Any], wire: WireFormat = ANTHROPIC) -> dict[str, Any]:
    """The JSON response of a recorded outcome, whichever way it was received."""
    if not recorded.get("stream"):
        body: dict[str, Any] = recorded["body"]
        return body
    events = (wire.parse_event(text) for text in recorded["events"])
    parsed = [e.data for e in events if e is not None]
    return wire.assemble(parsed)
