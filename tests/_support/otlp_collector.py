"""A real OTLP/HTTP trace receiver on a free loopback port, for tests whose spans come from
other processes (``pantheon node``): they export with the SDK's own OTLP exporter, chosen by
``OTEL_EXPORTER_OTLP_ENDPOINT``, exactly as a user's collector would receive them.

Run as ``python tests/_support/otlp_collector.py`` it prints its endpoint, then one line per
received span (process, name, ids) until Ctrl-C: the by-hand check of a cluster's trace."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["CollectedSpan", "OtlpCollector"]


@dataclass(frozen=True, slots=True)
class CollectedSpan:
    """One received span, reduced to what a trace's shape is made of."""

    node: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    kind: int  # the OTLP enum: 4 producer, 5 consumer, 1 internal, 3 client


class OtlpCollector:
    """Accepts ``POST /v1/traces`` (protobuf, plain or gzip) and keeps every span."""

    def __init__(self, on_span: Any = None) -> None:
        self.spans: list[CollectedSpan] = []
        self._lock = threading.Lock()
        self._on_span = on_span
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404, f"no OTLP signal at {self.path}")
                    return
                collector._take(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def _take(self, request: ExportTraceServiceRequest) -> None:
        for rs in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
            node = attrs.get("pantheon.node", "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    span = CollectedSpan(
                        node, s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                        int(s.kind),
                    )  # fmt: skip
                    with self._lock:  # handler threads run concurrently: one at a time
                        self.spans.append(span)
                        if self._on_span is not None:
                            self._on_span(span)

    def taken(self) -> list[CollectedSpan]:
        with self._lock:
            return list(self.spans)

    def clear(self) -> None:
        with self._lock:
            self.spans.clear()

    def __enter__(self) -> OtlpCollector:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


if __name__ == "__main__":
    import time

    def show(span: CollectedSpan) -> None:
        parent = span.parent_id or "-" * 16
        print(f"{span.node:11} {span.trace_id[:8]} {parent} -> {span.span_id}  {span.name}")

    with OtlpCollector(show) as c:
        print(f"OTEL_EXPORTER_OTLP_ENDPOINT={c.endpoint}", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
