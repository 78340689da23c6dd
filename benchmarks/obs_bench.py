#!/usr/bin/env python
"""The cost of observability: bus throughput with OpenTelemetry on vs off, in one run.

    .venv/bin/python benchmarks/obs_bench.py [--messages 100000] [--repeats 9]
        [--sampling 0.01] [--loop asyncio|uvloop] [--json PATH]

Workload: benchmarks/bus_bench.py (a), ``await bus.emit(topic, p)`` x N then
``await bus.drain()``, one no-op async subscriber, default options. Every message is a root
(published from outside any handler), so every one takes the sampling decision: the worst
case for the unsampled path.

Configurations, each a fresh bus per repeat:

* ``off``: no tracer, no metrics (``bus.tracer is None``).
* ``on``: ``Telemetry`` with tracing at ``--sampling`` (default 1%), batched (pantheon's
  ``SpanBatcher``: spans built and exported on its thread) into an exporter that counts
  and drops spans (export itself is the
  collector's business, and happens on the processor's thread), plus metrics: every bus
  instrument on a ``PeriodicExportingMetricReader`` collecting every 100 ms into an exporter
  that drops them (far more often than the 60 s default, so collection cost shows).
* ``on-100%``: the same with every message traced, for scale (not part of the target).

The clock of an ``on`` run stops after the spans it made have been built and handed to the
exporter (``force_flush``), so work deferred to a background thread is still counted.

Repeats are interleaved (off, on, on-100%, then the next repeat in rotated order) so drift
and other work on the machine hit every configuration alike; each repeat's on/off ratio is
taken against the off run of the same repeat, and the median of those ratios is reported.
Target: ``on`` at most 15% below ``off`` in wall-clock throughput.

The machine is shared, so each run also reports throughput per CPU-second of this process
(``time.process_time``, all its threads: the span processor's and the metric reader's work
counts). Another process stealing the CPU stretches the wall clock of whichever run it hits
but not the CPU time, so the CPU ratio is the steadier figure when the machine is busy; the
wall ratio is the one the target is judged on.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import gc
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from opentelemetry.sdk.metrics.export import (  # noqa: E402
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402

from bus import Bus  # noqa: E402
from pantheon.telemetry import Telemetry  # noqa: E402

TARGET_MAX_DROP = 0.15
perf = time.perf_counter


class CountingSpanExporter(SpanExporter):
    """Counts spans and drops them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class CountingMetricExporter(MetricExporter):
    """Counts collections and drops them."""

    def __init__(self) -> None:
        super().__init__(preferred_temporality={}, preferred_aggregation={})
        self.exports = 0
        self.points = 0

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.exports += 1
        self.points = sum(
            len(m.data.data_points)
            for rm in metrics_data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        )
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


async def noop(env: Any) -> None:
    return None


async def run_once(
    payloads: list[Any], sampling: float | None, *, traces: bool = True, metrics: bool = True
) -> tuple[float, float, dict[str, int]]:
    """One (a) run; ``sampling=None`` is observability off.

    Returns (msg per wall second, msg per process CPU second, counts)."""
    telemetry = None
    spans = CountingSpanExporter()
    exported = CountingMetricExporter()
    if sampling is not None:
        telemetry = Telemetry(
            span_exporters=[spans] if traces else [],
            metric_readers=(
                [PeriodicExportingMetricReader(exported, export_interval_millis=100)]
                if metrics
                else []
            ),
            sampling=sampling,
        )
    async with Bus() as bus:
        if telemetry is not None:
            telemetry.instrument(bus)
        bus.on("bench.a", noop, name="sub0")
        await asyncio.sleep(0)
        emit = bus.emit
        c0, t0 = time.process_time(), perf()
        for p in payloads:
            await emit("bench.a", p)
        await bus.drain()
        if telemetry is not None and telemetry.tracer_provider is not None:
            # Spans are built off the event loop and exported in batches: the clock stops
            # only once this run's spans have reached the exporter, so none of that work
            # escapes the measurement.
            telemetry.tracer_provider.force_flush()
        dt, cpu = perf() - t0, time.process_time() - c0
        delivered = bus.subscriptions()["sub0"].delivered
        if delivered != len(payloads):
            raise AssertionError(f"delivered {delivered}/{len(payloads)}")
    if telemetry is not None:
        telemetry.shutdown()
    return (
        len(payloads) / dt,
        len(payloads) / cpu,
        {
            "spans": spans.spans,
            "metric_exports": exported.exports,
            "metric_points": exported.points,
        },
    )


def loop_factory(name: str) -> Any:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def busy_jiffies() -> int:
    """Jiffies the whole machine spent busy, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system


async def suite(
    n: int, repeats: int, sampling: float, log: Any, breakdown: bool = False
) -> dict[str, Any]:
    payloads = [{"id": i} for i in range(n)]
    configs: list[tuple[str, float | None, dict[str, bool]]] = [
        ("off", None, {}),
        ("on", sampling, {}),
        ("on-100%", 1.0, {}),
    ]
    if breakdown:
        configs += [
            ("traces-0%-only", 0.0, {"metrics": False}),
            (f"traces-{sampling:.0%}-only", sampling, {"metrics": False}),
            ("metrics-only", sampling, {"traces": False}),
        ]
    # Warm-up: one untimed run of each, so imports, caches and the JIT-less interpreter's
    # specializations are in place before anything is timed.
    for _, s, parts in configs:
        await run_once(payloads[: n // 4], s, **parts)
    raw: dict[str, list[float]] = {name: [] for name, _, _ in configs}
    raw_cpu: dict[str, list[float]] = {name: [] for name, _, _ in configs}
    counts: dict[str, list[dict[str, int]]] = {name: [] for name, _, _ in configs}
    for r in range(repeats):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for name, s, parts in order:
            gc.collect()
            rate, rate_cpu, c = await run_once(payloads, s, **parts)
            raw[name].append(rate)
            raw_cpu[name].append(rate_cpu)
            counts[name].append(c)
        log(
            f"repeat {r + 1}/{repeats}: "
            + ", ".join(f"{name} {raw[name][-1]:,.0f}" for name, _, _ in configs)
        )
    return {"raw": raw, "raw_cpu": raw_cpu, "counts": counts}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--sampling", type=float, default=0.01)
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="also run the parts alone: tracer at 0%%, traces only, metrics only",
    )
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "obs_bench.json"))
    args = ap.parse_args()
    if args.repeats < 1 or args.messages < 1000:
        ap.error("--repeats must be >= 1 and --messages >= 1000")
    started = perf()
    # At 100% the span queue overflows (as it would in production at that load); the SDK
    # logs every dropped span, which would bury the output. The exported count shows it.
    logging.getLogger("opentelemetry.sdk._shared_internal").setLevel(logging.ERROR)

    def log(msg: str) -> None:
        print(f"[{perf() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    busy0 = busy_jiffies()
    own0 = own_cpu()
    with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
        res = runner.run(suite(args.messages, args.repeats, args.sampling, log, args.breakdown))
    wall = perf() - started
    busy1 = busy_jiffies()
    other = (busy1 - busy0) / os.sysconf("SC_CLK_TCK") - (own_cpu() - own0)
    raw, raw_cpu = res["raw"], res["raw_cpu"]
    ratios = [on / off for on, off in zip(raw["on"], raw["off"], strict=True)]
    ratios_full = [on / off for on, off in zip(raw["on-100%"], raw["off"], strict=True)]
    ratios_cpu = [on / off for on, off in zip(raw_cpu["on"], raw_cpu["off"], strict=True)]
    ratio = statistics.median(ratios)
    ratio_cpu = statistics.median(ratios_cpu)
    med = {name: statistics.median(v) for name, v in raw.items()}
    med_cpu = {name: statistics.median(v) for name, v in raw_cpu.items()}
    drop = 1 - ratio
    passed = drop <= TARGET_MAX_DROP
    spans_on = statistics.median(c["spans"] for c in res["counts"]["on"])
    print(f"bus (a) emit loop, {args.messages:,} messages x {args.repeats} repeats, {args.loop}")
    print(f"  off                       {med['off']:>12,.0f} msg/s")
    print(
        f"  on  (traces {args.sampling:.0%} + metrics) {med['on']:>12,.0f} msg/s   "
        f"median ratio {ratio:.3f} ({drop:+.1%} lower)   target <= 15% lower: "
        + ("PASS" if passed else "FAIL")
    )
    print(
        f"  on  (traces 100% + metrics) {med['on-100%']:>10,.0f} msg/s   "
        f"median ratio {statistics.median(ratios_full):.3f}"
    )
    print(
        f"  per CPU-second of this process: off {med_cpu['off']:,.0f}, "
        f"on {med_cpu['on']:,.0f} msg/s, median ratio {ratio_cpu:.3f} "
        f"({1 - ratio_cpu:+.1%} lower)"
    )
    for name in list(raw)[3:]:
        part = statistics.median(a / b for a, b in zip(raw_cpu[name], raw_cpu["off"], strict=True))
        print(f"  breakdown, per CPU-second: {name:<16} median ratio {part:.3f}")
    print(
        f"  spans exported per 'on' run: {spans_on:,.0f} "
        f"(2 per traced message: {spans_on / 2 / args.messages:.2%} of messages traced)"
    )
    print(
        f"  machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {sys.version.split()[0]}; other work during the run {other / wall:.2f} cores; "
        f"loadavg {os.getloadavg()[0]:.2f}; wall {wall:.0f} s"
    )
    out = {
        "benchmark": "obs_bench",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "loop": args.loop,
        },
        "other_work_cores": other / wall,
        "messages": args.messages,
        "repeats": args.repeats,
        "sampling": args.sampling,
        "median_msgs_per_s": med,
        "ratios_on_over_off": ratios,
        "median_ratio": ratio,
        "ratios_full_over_off": ratios_full,
        "median_msgs_per_cpu_s": med_cpu,
        "ratios_cpu_on_over_off": ratios_cpu,
        "median_ratio_cpu": ratio_cpu,
        "target_max_drop": TARGET_MAX_DROP,
        "passed": passed,
        "raw": raw,
        "raw_cpu": raw_cpu,
        "counts": res["counts"],
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
