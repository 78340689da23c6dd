"""Telemetry wired to in-memory exporters, so tests read exactly what an exporter would get.

A module of its own (not conftest.py) so test files can import :class:`Traced` by a name
unique in the tree."""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pantheon.telemetry import Telemetry


class Traced:
    """A Telemetry whose spans land, synchronously, in ``exporter``."""

    def __init__(self, sampling: float = 1.0) -> None:
        self.exporter = InMemorySpanExporter()
        self.reader = InMemoryMetricReader()
        self.telemetry = Telemetry(
            span_exporters=[self.exporter],
            metric_readers=[self.reader],
            batch=False,
            sampling=sampling,
        )

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def metrics(self) -> dict[str, list[tuple[dict[str, object], float]]]:
        """Instrument name -> [(attributes, value)] of one collection."""
        data = self.reader.get_metrics_data()
        out: dict[str, list[tuple[dict[str, object], float]]] = {}
        assert data is not None
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out[m.name] = [(dict(p.attributes or {}), p.value) for p in m.data.data_points]
        return out
