"""An OTLP/HTTP receiver for the tests, run as its own process (no collector is
installable here): ``python otlp_receiver.py OUT.jsonl``.

It listens on a free loopback port (printed as ``listening on http://127.0.0.1:PORT``),
accepts ``POST /v1/traces`` and ``POST /v1/metrics`` (``application/x-protobuf``,
gzip or not), decodes each body with opentelemetry-proto's
``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest`` (a body that does not
decode is answered 400 and recorded as an error), and appends one JSON line per span or
data point to OUT: what the tests read.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

_write = threading.Lock()


def value_of(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [value_of(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return None if which is None else getattr(value, which)


def attributes_of(items: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in items if isinstance(kv, KeyValue)}


def spans_of(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    found = []
    for resource_spans in request.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    {
                        "signal": "span",
                        "resource": resource,
                        "scope": scope_spans.scope.name,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": span.kind,
                        "start_ns": span.start_time_unix_nano,
                        "end_ns": span.end_time_unix_nano,
                        "attributes": attributes_of(span.attributes),
                        "status": span.status.code,
                    }
                )
    return found


def points_of(request: ExportMetricsServiceRequest) -> list[dict[str, Any]]:
    found = []
    for resource_metrics in request.resource_metrics:
        resource = attributes_of(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                data = metric.WhichOneof("data")
                points = getattr(metric, data).data_points if data in ("gauge", "sum") else []
                for point in points:
                    found.append(
                        {
                            "signal": "metric",
                            "resource": resource,
                            "name": metric.name,
                            "type": data,
                            "unit": metric.unit,
                            "value": getattr(point, point.WhichOneof("value") or "as_int"),
                            "time_ns": point.time_unix_nano,
                        }
                    )
    return found


class Handler(BaseHTTPRequestHandler):
    out_path = ""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        try:
            if self.path == "/v1/traces":
                request = ExportTraceServiceRequest.FromString(body)
                records = spans_of(request)
                reply = ExportTraceServiceResponse().SerializeToString()
            elif self.path == "/v1/metrics":
                metrics = ExportMetricsServiceRequest.FromString(body)
                records = points_of(metrics)
                reply = ExportMetricsServiceResponse().SerializeToString()
            else:
                self.send_error(404)
                return
        except DecodeError as exc:
            self._record([{"signal": "error", "path": self.path, "error": str(exc)}])
            self.send_error(400)
            return
        self._record(records)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def _record(self, records: list[dict[str, Any]]) -> None:
        with _write, open(self.out_path, "a", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(record) + "\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the records are the output


def main() -> None:
    Handler.out_path = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening on http://127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
