"""The OpenTelemetry SDK behind :class:`~durable_harness.runtime.telemetry.Telemetry`:
spans of deliveries and steps, exported over OTLP/HTTP. Imported only when the traces
endpoint is set (the ``otel`` extra).

The SDK reads its own environment: the endpoint, headers, timeout and compression of the
exporter (``OTEL_EXPORTER_OTLP_*``), the batch processor's delay (``OTEL_BSP_*``), the
sampler (``OTEL_TRACES_SAMPLER``), the resource (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``; the service name defaults to ``durable-harness``).

Ids. A turn's spans share its trace id (:func:`~.trace_id_of`); a delivery span is a
root span of that trace whose span id is derived from the turn's trace id and the
lease epoch (:func:`delivery_span_id`). So the next worker can export the span of a
delivery whose worker died (:meth:`OtelDelivery.lost`) under the id the dead worker's
step spans, if any reached the collector, name as their parent.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from durable_harness.core.types import Event, Lease, Step, Turn
from durable_harness.core.version import __version__
from durable_harness.runtime.telemetry import Delivery, Telemetry, bounded, trace_id_of

if TYPE_CHECKING:
    from durable_harness.harness.journal import StepEvent

#: How long the end of a delivery waits for its spans to be exported (seconds): a
#: collector that is down delays each delivery's end by at most this.
FLUSH_SECONDS = 3.0
#: How long a process's exit waits for the spans still to be sent (seconds).
EXIT_SECONDS = 5.0
#: The provider a model step's agent talks to, for ``gen_ai.provider.name`` (an agent
#: whose provider is its configuration's choice gets none).
PROVIDERS = {"builtin": "anthropic", "claude-code": "anthropic", "codex": "openai"}
#: Delivery outcomes that are errors (``TurnOutcome`` values, and ``error``: an
#: exception left :meth:`Worker.drive`).
ERRORS = frozenset({"failed", "released", "lost", "error"})


def delivery_span_id(trace_id: int, epoch: int) -> int:
    """The span id of the delivery at lease ``epoch`` (never 0, the invalid id)."""
    digest = hashlib.sha256(f"{trace_id:032x}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


class _TurnIds(IdGenerator):
    """Random ids, except for the root span this thread starts next (:meth:`next_root`)."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._next = threading.local()

    def next_root(self, trace_id: int, span_id: int) -> None:
        self._next.ids = (trace_id, span_id)

    def generate_trace_id(self) -> int:
        ids = getattr(self._next, "ids", None)
        return ids[0] if ids is not None else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        # The SDK asks for a root span's trace id, then its span id: the pair is used up.
        ids = getattr(self._next, "ids", None)
        if ids is None:
            return self._random.generate_span_id()
        self._next.ids = None
        return int(ids[1])

    def is_trace_id_random(self) -> bool:
        return False  # a trace id derived from a turn id is not random


class OtelTelemetry(Telemetry):
    """Spans over OTLP/HTTP (see the module docstring)."""

    def __init__(self) -> None:
        attributes: dict[str, Any] = {"service.version": __version__}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = "durable-harness"
        self.ids = _TurnIds()
        # Shut down at exit by ourselves, bounded (the SDK's own exit hook waits up to 30 s).
        self.provider = TracerProvider(
            resource=Resource.create(attributes), id_generator=self.ids, shutdown_on_exit=False
        )
        atexit.register(self.close)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer("durable_harness", __version__)

    def delivery(self, lease: Lease) -> Delivery:
        return OtelDelivery(self, lease, time.time_ns())

    def flush(self) -> None:
        bounded(self.provider.force_flush, FLUSH_SECONDS)

    def close(self) -> None:
        bounded(self.provider.shutdown, EXIT_SECONDS)


class OtelDelivery(Delivery):
    def __init__(self, owner: OtelTelemetry, lease: Lease, started_ns: int) -> None:
        self._tel = owner
        self._lease = lease
        self._started_ns = started_ns
        self._lock = threading.Lock()
        self._span: Span | None = None
        self._context = Context()
        self._trace_id = 0
        self._turn: dict[str, Any] = {}
        self._agent = ""
        self._request_model: str | None = None
        self._open: dict[int, Span] = {}

    def begin(self, turn: Turn, owner: str) -> None:
        self._trace_id = int(trace_id_of(turn), 16)
        self._agent = str(turn.config.get("agent", "builtin"))
        model = turn.config.get("model")
        self._request_model = model if isinstance(model, str) else None
        self._turn = {
            "durable_harness.turn.id": turn.turn_id,
            "durable_harness.session.id": turn.session_id,
        }
        attributes = {
            **self._turn,
            "durable_harness.turn.index": turn.index,
            "durable_harness.delivery": self._lease.attempt,
            "durable_harness.epoch": self._lease.epoch,
            "durable_harness.agent": self._agent,
            "durable_harness.worker": owner,
        }
        self._span = self._root(self._lease.epoch, attributes, self._started_ns)
        self._context = trace.set_span_in_context(self._span)

    def lost(self, started: Sequence[Event], steps: Mapping[int, Step]) -> None:
        if self._span is None:
            return
        for event in started:
            epoch = int(event.data.get("epoch", 0))
            attempt = int(event.data.get("attempt", 0))
            # The last the journal heard of that delivery: its last intent or outcome.
            heard = [event.at]
            for step in steps.values():
                if step.epoch == epoch:
                    heard.append(step.started_at)
                if step.finished_at is not None and step.meta.get("turn_attempt") == attempt:
                    heard.append(step.finished_at)
            attributes = {
                **self._turn,
                "durable_harness.delivery": attempt,
                "durable_harness.epoch": epoch,
                "durable_harness.agent": self._agent,
                "durable_harness.worker": str(event.data.get("worker", "")),
                "durable_harness.outcome": "lost",
                "durable_harness.delivery.reconstructed": True,
            }
            span = self._root(epoch, attributes, _ns(event.at))
            span.set_status(Status(StatusCode.ERROR, "lost"))
            span.set_attribute("error.type", "lost")
            span.end(_ns(max(heard)))

    def step(self, event: StepEvent) -> None:
        if self._span is None:
            return
        if event.phase == "start":
            span = self._start(event)
            with self._lock:
                self._open[event.seq] = span
            return
        with self._lock:
            opened = self._open.pop(event.seq, None)
        # Read back, or finished unrun: a short span of its own.
        span = opened if opened is not None else self._start(event)
        if event.phase == "replayed":
            span.set_attribute("durable_harness.step.replayed", True)
        elif event.phase == "possibly_ran":
            span.set_attribute("durable_harness.step.possibly_ran", True)
        if event.kind == "model":
            span.set_attributes(self._usage(event))
        span.end()

    def end(self, outcome: str) -> None:
        if self._span is None:
            return
        with self._lock:
            interrupted, self._open = list(self._open.values()), {}
        for span in interrupted:  # its call raised, or the delivery stopped under it
            span.set_status(Status(StatusCode.ERROR, "interrupted"))
            span.set_attribute("error.type", "interrupted")
            span.end()
        self._span.set_attribute("durable_harness.outcome", outcome)
        if outcome in ERRORS:
            self._span.set_status(Status(StatusCode.ERROR, outcome))
            self._span.set_attribute("error.type", outcome)
        self._span.end()
        self._tel.flush()

    # -- helpers -------------------------------------------------------------------
    def _root(self, epoch: int, attributes: dict[str, Any], start_ns: int) -> Span:
        self._tel.ids.next_root(self._trace_id, delivery_span_id(self._trace_id, epoch))
        return self._tel.tracer.start_span(
            "turn delivery",
            context=Context(),  # a root: never a child of whatever the caller has open
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            start_time=start_ns,
        )

    def _start(self, event: StepEvent) -> Span:
        attributes: dict[str, Any] = {
            **self._turn,
            "durable_harness.step.seq": event.seq,
            "durable_harness.step.kind": event.kind,
            "durable_harness.step.name": event.name,
            "durable_harness.step.attempts": event.attempts,
        }
        kind = SpanKind.INTERNAL
        if event.kind == "model":
            name = f"chat {event.name}"
            kind = SpanKind.CLIENT
            attributes["gen_ai.operation.name"] = "chat"
            attributes["gen_ai.request.model"] = event.name or self._request_model or ""
            provider = PROVIDERS.get(self._agent)
            if provider is not None:
                attributes["gen_ai.provider.name"] = provider
        elif event.kind == "tool":
            name = f"execute_tool {event.name}"
            attributes["gen_ai.operation.name"] = "execute_tool"
            attributes["gen_ai.tool.name"] = event.name
        else:
            name = f"{event.kind} {event.name}"
        tracer = self._tel.tracer
        return tracer.start_span(name, context=self._context, kind=kind, attributes=attributes)

    @staticmethod
    def _usage(event: StepEvent) -> dict[str, Any]:
        """A model step's usage as the GenAI conventions spell it. A read-back step paid
        nothing now: its recorded usage goes under ``durable_harness.replayed.*``, so a
        dashboard summing ``gen_ai.usage.*`` counts what was paid, once."""
        meta = event.meta
        found: dict[str, Any] = {}
        if isinstance(meta.get("model"), str):
            found["gen_ai.response.model"] = meta["model"]
        counts = {
            k: int(meta[k])
            for k in _TOKENS
            if isinstance(meta.get(k), int | float) and not isinstance(meta.get(k), bool)
        }
        if not counts:
            return found
        cache_read = counts.get("cache_read_tokens", 0)
        cache_write = counts.get("cache_write_tokens", 0)
        # The step's input_tokens are those not read from or written to a cache (the
        # journal's split); the conventions' input_tokens count every input token.
        usage = {
            "input_tokens": counts.get("input_tokens", 0) + cache_read + cache_write,
            "output_tokens": counts.get("output_tokens", 0),
            "cache_read.input_tokens": cache_read,
            "cache_creation.input_tokens": cache_write,
        }
        prefix = "durable_harness.replayed." if event.phase == "replayed" else "gen_ai.usage."
        found.update({prefix + k: v for k, v in usage.items()})
        return found


_TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)
