"""One process's OpenTelemetry wiring: where spans and metrics go, and which buses report.

Exporters follow the standard ``OTEL_*`` environment variables, with one deliberate
difference from the SDK's defaults: nothing is exported unless asked, so a plain
``pantheon run`` pays nothing and never tries to reach a collector that is not there.

* traces: ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``; comma-separated). Unset,
  it is ``otlp`` when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
  is set, else ``none``. The OTLP exporter is OTLP/HTTP and reads its own variables
  (endpoint, headers, timeout, compression).
* metrics: ``OTEL_METRICS_EXPORTER`` likewise (``..._METRICS_ENDPOINT``), exported every
  ``OTEL_METRIC_EXPORT_INTERVAL`` ms and once more at shutdown.
* sampling: ``OTEL_TRACES_SAMPLER`` (``parentbased_traceidratio`` and friends, all treated as
  parent-based: the decision is made once per root message) with ``OTEL_TRACES_SAMPLER_ARG``;
  unset, the caller's ratio (a scenario's ``observability.sampling``), else 1.0.
* ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` name the resource (default service
  ``pantheon``); ``OTEL_SDK_DISABLED=true`` turns everything off.

The SDK is imported only when something is configured: ``pip install pantheon`` without the
``otel`` extra runs fine until an ``OTEL_*`` variable asks for an exporter.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bus import Bus
from pantheon._errors import PantheonError

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from pantheon.telemetry._metrics import BusMetrics
    from pantheon.telemetry._tracing import BusTracer

__all__ = ["Telemetry", "TelemetryConfigError", "require_otel", "sampling_ratio"]

_EXPORTERS = ("otlp", "console", "none")
_RATIO_SAMPLERS = {"traceidratio", "parentbased_traceidratio"}
_FIXED_SAMPLERS = {
    "always_on": 1.0,
    "parentbased_always_on": 1.0,
    "always_off": 0.0,
    "parentbased_always_off": 0.0,
}


class TelemetryConfigError(PantheonError, ValueError):
    """An ``OTEL_*`` variable or an ``observability`` setting this setup cannot honour."""


def require_otel() -> None:
    """Raise an ImportError that names the extra to install when the SDK is missing."""
    try:
        import opentelemetry.sdk  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "OpenTelemetry export needs the SDK: pip install 'pantheon[otel]'"
        ) from exc


def sampling_ratio(default: float | None, environ: Mapping[str, str]) -> float:
    """The root sampling ratio: ``OTEL_TRACES_SAMPLER[_ARG]`` over ``default`` over 1.0."""
    sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not sampler:
        ratio = 1.0 if default is None else default
    elif sampler in _FIXED_SAMPLERS:
        ratio = _FIXED_SAMPLERS[sampler]
    elif sampler in _RATIO_SAMPLERS:
        arg = environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(arg)
        except ValueError:
            raise TelemetryConfigError(
                f"OTEL_TRACES_SAMPLER_ARG={arg!r}: want a number in [0, 1]"
            ) from None
    else:
        known = ", ".join(sorted([*_FIXED_SAMPLERS, *_RATIO_SAMPLERS]))
        raise TelemetryConfigError(f"OTEL_TRACES_SAMPLER={sampler!r}: want one of {known}")
    if not 0.0 <= ratio <= 1.0:
        raise TelemetryConfigError(f"sampling ratio {ratio!r} is not in [0, 1]")
    return ratio


def _exporters(signal: str, environ: Mapping[str, str]) -> list[str]:
    var = f"OTEL_{signal.upper()}_EXPORTER"
    raw = environ.get(var)
    if raw is None:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(
            f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in _EXPORTERS]
    if unknown:
        raise TelemetryConfigError(
            f"{var}={raw!r}: unknown exporter {unknown[0]!r} (want otlp, console or none)"
        )
    return [n for n in names if n != "none"]


def _check_protocol(signal: str, environ: Mapping[str, str]) -> None:
    for var in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = environ.get(var)
        if value:
            if value.strip() != "http/protobuf":
                raise TelemetryConfigError(
                    f"{var}={value!r}: pantheon exports OTLP over HTTP only "
                    "(set it to http/protobuf, or unset it)"
                )
            return


def _span_exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)  # stdout may carry ``--json`` output
    _check_protocol("traces", environ)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _metric_reader(name: str, environ: Mapping[str, str]) -> MetricReader:
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        MetricExporter,
        PeriodicExportingMetricReader,
    )

    exporter: MetricExporter
    if name == "console":
        exporter = ConsoleMetricExporter(out=sys.stderr)
    else:
        _check_protocol("metrics", environ)
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter()
    return PeriodicExportingMetricReader(exporter)


def _resource(node: str | None = None) -> Resource:
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create()  # reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "pantheon"}))
    if node is not None:
        # One trace spans the run's processes: this says which process made a span.
        resource = resource.merge(Resource({"pantheon.node": node}))
    return resource


class Telemetry:
    """Where spans and metrics go; :meth:`instrument` makes a bus report there.

    Build it from exporters (``span_exporters`` are batched, or given to the SDK's
    ``SimpleSpanProcessor`` with ``batch=False``, as tests do), span processors, and metric
    readers, or from the environment with :meth:`from_env`. With none of them it is
    disabled: :meth:`instrument` does nothing and the bus keeps its zero-cost path.
    Use as a context manager, or call :meth:`shutdown`, to flush what is buffered.
    """

    def __init__(
        self,
        *,
        span_exporters: Sequence[SpanExporter] = (),
        span_processors: Sequence[SpanProcessor] = (),
        metric_readers: Sequence[MetricReader] = (),
        sampling: float = 1.0,
        batch: bool = True,
        resource: Resource | None = None,
    ) -> None:
        if not 0.0 <= sampling <= 1.0:
            raise TelemetryConfigError(f"sampling ratio {sampling!r} is not in [0, 1]")
        self.sampling = sampling
        self.tracer: BusTracer | None = None
        self.tracer_provider: TracerProvider | None = None
        self.metrics: BusMetrics | None = None
        self.meter_provider: MeterProvider | None = None
        self._shut = False
        processors = list(span_processors)
        if not (span_exporters or processors or metric_readers):
            return
        require_otel()
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        if resource is None:
            resource = _resource()
        scope = InstrumentationScope("pantheon", _version())
        if span_exporters or processors:
            from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor, TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

            from pantheon.telemetry._tracing import BusTracer, SpanBatcher

            # For spans anything else makes (set it as the global provider, and spans made
            # inside handlers nest under the bus's); the bus's own go to the same processor.
            self.tracer_provider = TracerProvider(
                sampler=ParentBased(TraceIdRatioBased(sampling)), resource=resource
            )
            target: SpanProcessor
            if batch:
                # Built and exported on the batcher's thread (see pantheon.telemetry._tracing).
                target = SpanBatcher(list(span_exporters), processors)
            else:
                processors += [SimpleSpanProcessor(e) for e in span_exporters]
                target = processors[0]
                if len(processors) > 1:
                    target = SynchronousMultiSpanProcessor()
                    for p in processors:
                        target.add_span_processor(p)
            self.tracer_provider.add_span_processor(target)
            self.tracer = BusTracer(target, ratio=sampling, resource=resource, scope=scope)
        if metric_readers:
            from opentelemetry.sdk.metrics import MeterProvider

            from pantheon.telemetry._metrics import BusMetrics

            self.meter_provider = MeterProvider(
                metric_readers=list(metric_readers), resource=resource
            )
            self.metrics = BusMetrics(self.meter_provider.get_meter("pantheon.bus", _version()))

    @classmethod
    def from_env(
        cls,
        *,
        sampling: float | None = None,
        metrics: bool = True,
        environ: Mapping[str, str] | None = None,
        node: str | None = None,
    ) -> Telemetry:
        """Exporters chosen by the ``OTEL_*`` variables (see the module docstring).

        ``sampling`` and ``metrics`` are the scenario's defaults; the variables win.
        ``node`` names this process of a multi-process run (the ``pantheon.node``
        resource attribute of everything it exports)."""
        env = os.environ if environ is None else environ
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return cls()
        ratio = sampling_ratio(sampling, env)
        traces = _exporters("traces", env)
        readers = _exporters("metrics", env) if metrics else []
        if not traces and not readers:
            return cls(sampling=ratio)
        require_otel()
        return cls(
            span_exporters=[_span_exporter(n, env) for n in traces],
            metric_readers=[_metric_reader(n, env) for n in readers],
            sampling=ratio,
            resource=_resource(node),
        )

    @property
    def enabled(self) -> bool:
        return self.tracer is not None or self.metrics is not None

    @classmethod
    def for_scenario(
        cls,
        scenario: Any,
        *,
        environ: Mapping[str, str] | None = None,
        node: str | None = None,
    ) -> Telemetry:
        """:meth:`from_env` with a scenario's ``observability`` section as the defaults.

        Every process of a multi-process run calls this with the same scenario and
        (inherited) environment, so they sample at one ratio; a message's decision is made
        once, where its root is published, and travels in its envelope's ``trace``. ``node``
        defaults to ``driver`` for a scenario whose transport spans processes."""
        from pantheon.scenario import DRIVER_NODE

        obs = scenario.observability
        if node is None and scenario.transport.kind != "inprocess":
            node = DRIVER_NODE
        return cls.from_env(sampling=obs.sampling, metrics=obs.metrics, environ=environ, node=node)

    def instrument(self, bus: Bus) -> Bus:
        """Trace ``bus`` and report its counters; returns it."""
        if self.tracer is not None:
            bus.observe(self.tracer)
        if self.metrics is not None:
            self.metrics.add(bus)
        return bus

    def wrap_setup(
        self, setup: Callable[[Bus], Awaitable[None]]
    ) -> Callable[[Bus], Awaitable[None]]:
        """A ``setup(bus)`` (as replay and redrive take) that instruments the bus first."""
        if not self.enabled:
            return setup

        async def observed(bus: Bus) -> None:
            self.instrument(bus)
            await setup(bus)

        return observed

    def force_flush(self) -> None:
        """Export every span ended so far and collect the metrics once more, now."""
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush()
        if self.meter_provider is not None:
            self.meter_provider.force_flush()

    def shutdown(self) -> None:
        """Export what is buffered (spans, a last metrics collection) and stop; once (a
        node shuts down before its report and again on every way out)."""
        if self._shut:
            return
        self._shut = True
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pantheon")
    except PackageNotFoundError:
        return "0"
