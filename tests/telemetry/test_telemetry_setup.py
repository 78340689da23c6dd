"""Exporters from the standard OTEL_* variables: none by default, OTLP/HTTP to a real local
collector, console, clear errors; and the light imports the layering promises."""

from __future__ import annotations

import gzip
import http.server
import json
import os
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from untimed import copy_untimed

import pantheon.telemetry
from pantheon.telemetry import Telemetry, TelemetryConfigError, sampling_ratio

ROOT = Path(__file__).resolve().parents[2]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PANTHEON_"))}
    env.update(extra)
    return env


def test_all_is_exactly_the_public_names() -> None:
    for name in pantheon.telemetry.__all__:
        getattr(pantheon.telemetry, name)  # the lazy ones load here
    public = {
        name
        for name, value in vars(pantheon.telemetry).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    public -= {"TYPE_CHECKING", "Any"}
    assert set(pantheon.telemetry.__all__) == public


def test_nothing_is_configured_by_default() -> None:
    telemetry = Telemetry.from_env(environ={})
    assert not telemetry.enabled and telemetry.tracer is None and telemetry.metrics is None


def test_light_imports() -> None:
    """``import bus`` and ``import agents`` never load OpenTelemetry; pantheon.telemetry loads
    the SDK only once an exporter is asked for."""
    script = (
        "import sys\n"
        "import bus, agents\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'otel in bus'\n"
        "from pantheon.telemetry import Telemetry, configure_logging\n"
        "configure_logging()\n"
        "t = Telemetry.from_env()\n"
        "assert not t.enabled\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'otel loaded'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin': unknown exporter"),
        ({"OTEL_METRICS_EXPORTER": "otlp,prom"}, "unknown exporter 'prom'"),
        ({"OTEL_TRACES_SAMPLER": "jaeger_remote"}, "OTEL_TRACES_SAMPLER='jaeger_remote'"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "often"},
            "OTEL_TRACES_SAMPLER_ARG='often'",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
            "not in [0, 1]",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL='grpc': pantheon exports OTLP over HTTP only",
        ),
    ],
)
def test_settings_it_cannot_honour_are_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(TelemetryConfigError) as info:
        Telemetry.from_env(environ=environ)
    assert message in str(info.value)


def test_sampling_precedence() -> None:
    assert sampling_ratio(None, {}) == 1.0
    assert sampling_ratio(0.2, {}) == 0.2  # the scenario's default
    env = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.05"}
    assert sampling_ratio(0.2, env) == 0.05  # the operator's variable wins
    assert sampling_ratio(0.2, {"OTEL_TRACES_SAMPLER": "always_off"}) == 0.0
    assert sampling_ratio(0.2, {"OTEL_TRACES_SAMPLER": "parentbased_always_on"}) == 1.0


def test_sdk_disabled_wins_over_an_endpoint() -> None:
    env = {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert not Telemetry.from_env(environ=env).enabled


class Collector(http.server.ThreadingHTTPServer):
    """A minimal OTLP/HTTP collector: keeps each request's path and decoded body."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CollectorHandler)
        self.requests: list[tuple[str, str, bytes]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _CollectorHandler(http.server.BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.server.requests.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    """The support scenario, 60 emails, without its latency bounds (not under test here)."""
    path = copy_untimed(tmp_path) / "support_email.yaml"
    text = path.read_text()
    assert "  rate: 1000 " in text
    path.write_text(text.replace("  rate: 1000 ", "  count: 60\n  rate: 1000 "))
    return path


def test_pantheon_run_exports_traces_and_metrics_to_an_otlp_collector(
    collector: Collector, scenario: Path, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", str(scenario), "--no-record", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=clean_env(
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
            OTEL_SERVICE_NAME="support-desk",
        ),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["inputs"] + summary["malformed"] == 60
    paths = {path for path, _, _ in collector.requests}
    assert paths == {"/v1/traces", "/v1/metrics"}
    assert {ctype for _, ctype, _ in collector.requests} == {"application/x-protobuf"}

    spans = []
    services = set()
    for path, _, body in collector.requests:
        if path != "/v1/traces":
            continue
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
            services.add(attrs["service.name"])
            spans += [s for ss in rs.scope_spans for s in ss.spans]
    assert services == {"support-desk"}
    names = {s.name for s in spans}
    assert {"publish observation.email.received", "process plan.proposed"} <= names
    assert {"invoke_agent reasoner", "chat rules", "execute_tool memory.lookup"} <= names
    roots = [s for s in spans if not s.parent_span_id]
    assert len(roots) == summary["inputs"] + summary["malformed"]  # sampling 1.0 by default

    metrics: dict[str, list[object]] = {}
    for path, _, body in collector.requests:
        if path == "/v1/metrics":
            req = ExportMetricsServiceRequest.FromString(body)
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        metrics.setdefault(m.name, []).append(m)
    published = {
        kv.value.string_value: p.as_int
        for m in metrics["pantheon.messages.published"]
        for p in m.sum.data_points
        for kv in p.attributes
        if kv.key == "topic"
    }
    assert published["observation.email.received"] == summary["inputs"]
    assert "pantheon.hop.queue_wait" in metrics and "pantheon.breaker.state" in metrics


def test_console_exporter_writes_spans_to_stderr_and_keeps_stdout_clean(
    scenario: Path, tmp_path: Path
) -> None:
    # Each of the 60 emails is a root sampled with the ratio's probability, by an unseeded
    # draw: at 0.1 no root at all was sampled once in ~560 runs (0.9**60) and stderr stayed
    # empty. At 0.5 that chance is 0.5**60, and the ratio sampler is still the one in use.
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", str(scenario), "--no-record", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=clean_env(
            OTEL_TRACES_EXPORTER="console",
            OTEL_TRACES_SAMPLER="parentbased_traceidratio",
            OTEL_TRACES_SAMPLER_ARG="0.5",
        ),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    json.loads(proc.stdout)
    assert '"name": "publish observation.email.received"' in proc.stderr
    assert '"messaging.system": "pantheon"' in proc.stderr


def test_a_bad_otel_setting_stops_pantheon_run_before_it_starts(
    scenario: Path, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", str(scenario), "--no-record"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=clean_env(OTEL_TRACES_EXPORTER="jaeger"),
    )
    assert proc.returncode == 2
    assert "OTEL_TRACES_EXPORTER='jaeger'" in proc.stderr
    assert "emails" not in proc.stdout


def test_spans_other_instrumentation_makes_in_a_handler_nest_under_the_bus_span() -> None:
    """With the provider set globally (once per process: hence a subprocess), the bus's
    current span is also the OTel context's."""
    script = (
        "import asyncio\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import "
        "InMemorySpanExporter\n"
        "from bus import Bus\n"
        "from pantheon.telemetry import Telemetry\n"
        "exporter = InMemorySpanExporter()\n"
        "t = Telemetry(span_exporters=[exporter], batch=False)\n"
        "trace.set_tracer_provider(t.tracer_provider)\n"
        "async def main():\n"
        "    async with Bus() as bus:\n"
        "        t.instrument(bus)\n"
        "        async def handle(env):\n"
        "            with trace.get_tracer('lib').start_as_current_span('inner'):\n"
        "                pass\n"
        "        bus.on('a.*', handle, name='h')\n"
        "        await bus.emit('a.b', None)\n"
        "asyncio.run(main())\n"
        "spans = {s.name: s for s in exporter.get_finished_spans()}\n"
        "inner, process = spans['inner'], spans['process a.b']\n"
        "assert inner.parent.span_id == process.context.span_id, (inner.parent, process)\n"
        "assert inner.context.trace_id == process.context.trace_id\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
