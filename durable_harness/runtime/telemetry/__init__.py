"""Traces and metrics over OpenTelemetry: the seam the worker and ``serve`` talk to.

Off unless the operator sets an OTLP endpoint (the SDK's own variables:
``OTEL_EXPORTER_OTLP_ENDPOINT``, or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` per signal) and installs the ``otel`` extra. Off,
nothing of OpenTelemetry is imported and every call here is a no-op; an endpoint without
the extra gets one line on stderr saying what to install. The SDK lives in :mod:`.traces`
and :mod:`.metrics`, imported only when a signal is on.

What is exported (``docs/observability.md``):

* a span per **delivery** of a turn (a worker's claim to its end: done, waiting,
  released, failed, lost, cancelled), and one child span per **journal step**, from its
  intent to its outcome; a step read back from the journal is a short span marked
  ``durable_harness.step.replayed``, a ``never`` step finished unrun
  ``durable_harness.step.possibly_ran``. A delivery whose worker died is exported by the
  next delivery, from the turn's event log (``durable_harness.delivery.reconstructed``);
* every span of a turn in **one trace**, whose id is stored with the turn at enqueue
  (:func:`new_trace_id`, ``TurnConfig.trace_id``). The stored value is the enqueuer's,
  so untrusted: :func:`trace_id_of` uses it only if it is a valid trace id, else derives
  one from the turn id;
* gauges of the World's turns (queued, waiting, dead-lettered), read at most once per
  export interval (:func:`export_metrics`).

Spans carry names, ids, statuses and counts only: never a prompt, a model's or a tool's
input or output, an error text (it may quote either) or a secret.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from durable_harness.core.extras import install_hint
from durable_harness.core.types import Event, Lease, Step, Turn

if TYPE_CHECKING:
    from durable_harness.core.world import World
    from durable_harness.harness.journal import StepEvent

__all__ = [
    "Delivery",
    "Telemetry",
    "bounded",
    "endpoint_set",
    "export_metrics",
    "new_trace_id",
    "telemetry",
    "trace_id_of",
]

_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_INVALID_TRACE_ID = "0" * 32


def new_trace_id() -> str:
    """A fresh W3C trace id (32 lowercase hex), stored with a turn when it is enqueued."""
    while True:
        trace_id = secrets.token_hex(16)
        if trace_id != _INVALID_TRACE_ID:
            return trace_id


def trace_id_of(turn: Turn) -> str:
    """The turn's trace id: the stored one if it is a valid trace id (32 lowercase hex,
    not all zeros), else one derived from the turn id, the same on every worker."""
    stored = turn.config.get("trace_id")
    if isinstance(stored, str) and _TRACE_ID.fullmatch(stored) and stored != _INVALID_TRACE_ID:
        return stored
    return hashlib.sha256(f"durable-harness trace {turn.turn_id}".encode()).hexdigest()[:32]


class Delivery:
    """One delivery of a turn, as the worker reports it (this base reports nothing).

    The worker makes one per claim (:meth:`Telemetry.delivery`), calls :meth:`begin` once
    the turn is really run (a turn parked behind an earlier one of its session is not a
    delivery anyone wants to see), :meth:`lost` with what the event log says about earlier
    deliveries whose worker died, :meth:`step` for every journal step event, and
    :meth:`end` exactly once. Thread-safe: steps report from the proxy's threads too.
    """

    def begin(self, turn: Turn, owner: str) -> None:
        """The turn runs now, on worker ``owner``."""

    def lost(self, started: Sequence[Event], steps: Mapping[int, Step]) -> None:
        """``started``: the ``attempt.started`` events of earlier deliveries the event log
        just marked lost (their worker died before ending them); ``steps``: the journal."""

    def step(self, event: StepEvent) -> None:
        """A journal step began, finished, was read back or finished as possibly ran."""

    def end(self, outcome: str) -> None:
        """The delivery ended with ``outcome`` (a ``TurnOutcome`` value, or ``error``):
        its spans are exported before this returns (a worker's later crash loses none)."""


class Telemetry:
    """What the process exports (this base: nothing)."""

    def delivery(self, lease: Lease) -> Delivery:
        """A new delivery of the leased turn, starting now."""
        return Delivery()

    def close(self) -> None:
        """Export what is pending and stop."""


def endpoint_set(signal: str) -> bool:
    """Whether the OTLP endpoint of ``signal`` (``traces`` or ``metrics``) is configured
    and the signal not switched off (``OTEL_SDK_DISABLED``, ``OTEL_<SIGNAL>_EXPORTER=none``)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get(f"OTEL_{signal.upper()}_EXPORTER", "").strip().lower() == "none":
        return False
    return any(
        os.environ.get(name, "").strip()
        for name in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def bounded(call: Callable[[], object], seconds: float) -> None:
    """Run ``call`` (an exporter's flush or shutdown) for at most ``seconds``, then go on:
    the SDK's own flush blocks for as long as its exporter retries (10 s by default), and
    a collector that is down must not hold a turn's delivery or a process's exit that
    long. What is still being sent then goes on in the background."""
    thread = threading.Thread(target=call, name="otel-flush", daemon=True)
    thread.start()
    thread.join(seconds)


_lock = threading.Lock()
_telemetry: Telemetry | None = None
_noticed = False


def _extra_missing(exc: ImportError) -> None:
    global _noticed
    if not _noticed:
        _noticed = True
        sys.stderr.write(
            "durable-harness: an OTLP endpoint is set but OpenTelemetry is not installed "
            f"({exc.name or exc}): nothing is exported; {install_hint('otel')}\n"
        )
        sys.stderr.flush()


def _refused(what: str, exc: Exception) -> None:
    # The SDK reads the OTEL_* variables itself and raises ValueError on some (a queue of
    # 0, an interval of 0): telemetry is the operator's view of the turns, never a reason
    # for a worker, serve or ui not to start, so it is off with one line saying why.
    sys.stderr.write(
        f"durable-harness: OpenTelemetry {what} are off: the SDK refused its settings "
        f"({type(exc).__name__}: {exc}); check the OTEL_* variables\n"
    )
    sys.stderr.flush()


def telemetry() -> Telemetry:
    """This process's telemetry, made on first use from the environment: traces over
    OTLP/HTTP when their endpoint is set and the ``otel`` extra installed, else the no-op
    base (nothing of OpenTelemetry imported)."""
    global _telemetry
    with _lock:
        if _telemetry is None:
            _telemetry = Telemetry()
            if endpoint_set("traces"):
                try:
                    from durable_harness.runtime.telemetry.traces import OtelTelemetry
                except ImportError as exc:
                    _extra_missing(exc)
                else:
                    try:
                        _telemetry = OtelTelemetry()
                    except Exception as exc:
                        _refused("traces", exc)
        return _telemetry


@contextmanager
def export_metrics(world: World) -> Iterator[None]:
    """While inside, export the gauges of ``world``'s turns over OTLP/HTTP, if the metrics
    endpoint is set and the extra installed (what ``serve`` and ``worker`` do); else
    nothing. The World is read at most once per export interval, from the exporter's
    thread (Worlds are thread-safe)."""
    if not endpoint_set("metrics"):
        yield
        return
    try:
        from durable_harness.runtime.telemetry.metrics import TurnGauges
    except ImportError as exc:
        _extra_missing(exc)
        yield
        return
    try:
        gauges = TurnGauges(world)
    except Exception as exc:
        _refused("metrics", exc)
        yield
        return
    try:
        yield
    finally:
        gauges.close()
