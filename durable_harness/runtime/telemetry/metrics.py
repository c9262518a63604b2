"""Gauges of a World's turns over OTLP/HTTP (what ``telemetry.export_metrics`` starts).
Imported only when the metrics endpoint is set (the ``otel`` extra).

==================================  =====================================================
instrument (observable gauge)       value
==================================  =====================================================
``durable_harness.turns.queued``    turns waiting for a worker (status ``queued``): the
                                    queue's depth
``durable_harness.turns.waiting``   turns parked by a wait (timer, signal, CI), no worker
``durable_harness.turns.dead_lettered``  turns the queue gave up on after ``max_attempts``
==================================  =====================================================

The SDK's reader collects every ``OTEL_METRIC_EXPORT_INTERVAL`` milliseconds (default
60000) and calls each gauge's callback then; the three share one
:meth:`~durable_harness.core.world.Catalog.count_turns`, read again only once the last
read is most of an interval old. Every process that exports (each worker, each
``serve``) reports the same World's numbers under its own ``service.instance.id``: a
dashboard takes one (the max) per World, not the sum.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from durable_harness.core.errors import DurableHarnessError
from durable_harness.core.types import TurnCounts
from durable_harness.core.version import __version__
from durable_harness.core.world import World
from durable_harness.runtime.telemetry import bounded

log = logging.getLogger(__name__)

#: How long :meth:`TurnGauges.close` waits for the last export (seconds).
EXIT_SECONDS = 5.0
#: The SDK's default export interval (milliseconds), when the variable is unset or bad.
DEFAULT_INTERVAL_MS = 60_000.0

GAUGES: dict[str, tuple[str, Callable[[TurnCounts], int]]] = {
    "durable_harness.turns.queued": ("turns waiting for a worker", lambda c: c.queued),
    "durable_harness.turns.waiting": ("turns parked by a wait", lambda c: c.waiting),
    "durable_harness.turns.dead_lettered": (
        "turns dead-lettered after max_attempts deliveries",
        lambda c: c.dead_lettered,
    ),
}


def export_interval() -> float:
    """The reader's export interval in seconds (``OTEL_METRIC_EXPORT_INTERVAL``, ms)."""
    try:
        millis = float(os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "") or DEFAULT_INTERVAL_MS)
    except ValueError:
        millis = DEFAULT_INTERVAL_MS
    return max(millis, 1.0) / 1000.0


class TurnGauges:
    """The gauges of one World, exported until :meth:`close`."""

    def __init__(self, world: World) -> None:
        self.world = world
        # Most of an interval: the next collection always reads anew, the three gauges of
        # one collection share a read.
        self.max_age = export_interval() * 0.8
        self._lock = threading.Lock()
        self._read: tuple[float, TurnCounts | None] | None = None
        attributes: dict[str, Any] = {
            "service.version": __version__,
            "service.instance.id": str(uuid.uuid4()),
        }
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = "durable-harness"
        reader = PeriodicExportingMetricReader(OTLPMetricExporter())
        self.provider = MeterProvider(
            resource=Resource.create(attributes), metric_readers=[reader], shutdown_on_exit=False
        )
        meter = self.provider.get_meter("durable_harness", __version__)
        for name, (description, value) in GAUGES.items():
            meter.create_observable_gauge(
                name, callbacks=[self._callback(value)], unit="{turn}", description=description
            )

    def counts(self) -> TurnCounts | None:
        """The World's counts, read at most once per ``max_age`` (None: the World could
        not be read; the gauges then report nothing rather than a made-up zero)."""
        with self._lock:
            now = time.monotonic()
            if self._read is None or now - self._read[0] >= self.max_age:
                try:
                    counts: TurnCounts | None = self.world.count_turns()
                except DurableHarnessError as exc:
                    log.warning("turn gauges: cannot read the World (%s)", exc)
                    counts = None
                self._read = (now, counts)
            return self._read[1]

    def _callback(
        self, value: Callable[[TurnCounts], int]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            counts = self.counts()
            return [] if counts is None else [Observation(value(counts))]

        return observe

    def close(self) -> None:
        """Export once more and stop the reader's thread (bounded: a collector that is
        down does not hold the process's exit)."""
        bounded(self.provider.shutdown, EXIT_SECONDS)
