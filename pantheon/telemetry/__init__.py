"""Observability for a Pantheon run: OpenTelemetry traces and metrics, structlog logging.

``Telemetry.from_env()`` builds the exporters the ``OTEL_*`` variables ask for (none by
default) and ``telemetry.instrument(bus)`` makes a bus report to them; ``configure_logging()``
sets up the one log format. The OTel SDK is imported only when an exporter is configured:
``BusTracer`` and ``BusMetrics`` load it on first access and raise an ImportError naming the
``otel`` extra when it is missing.
"""

from typing import TYPE_CHECKING, Any

from pantheon.telemetry._logging import LOG_LEVEL_ENV, BusContext, configure_logging, get_logger
from pantheon.telemetry._setup import Telemetry, TelemetryConfigError, sampling_ratio

if TYPE_CHECKING:
    from pantheon.telemetry._metrics import BusMetrics
    from pantheon.telemetry._tracing import UNSAMPLED, BusTracer, parse_traceparent

__all__ = [
    "LOG_LEVEL_ENV",
    "UNSAMPLED",
    "BusContext",
    "BusMetrics",
    "BusTracer",
    "Telemetry",
    "TelemetryConfigError",
    "configure_logging",
    "get_logger",
    "parse_traceparent",
    "sampling_ratio",
]

_LAZY = {
    "BusMetrics": "pantheon.telemetry._metrics",
    "BusTracer": "pantheon.telemetry._tracing",
    "UNSAMPLED": "pantheon.telemetry._tracing",
    "parse_traceparent": "pantheon.telemetry._tracing",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pantheon.telemetry' has no attribute {name!r}")
    from importlib import import_module

    from pantheon.telemetry._setup import require_otel

    require_otel()
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
