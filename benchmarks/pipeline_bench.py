"""End-to-end throughput and per-hop latency of the nine-agent support pipeline.

    python benchmarks/pipeline_bench.py [--emails 2000] [--latency-ms 0 1] [--loop uvloop]
        [--modes off,recording,telemetry,outcomes]

Feeds the shipped support inbox (repeated to ``--emails``) through Observer -> Sensor ->
Reasoner (+ Memory lookup) -> Planner -> Guardian -> Actor -> Learner/Memory, with Monitor
watching, on the in-process bus. The model call is simulated: the rule provider plus an
``asyncio.sleep`` of ``--latency-ms``, like the seed blog's 1 ms "LLM/API" calls. The
Reasoner runs with ``--reasoner-concurrency`` workers (default 64) so model latency overlaps,
as it would against any real model server. Requests/s counts emails that reached
``action.executed`` (or were rejected as malformed) per second of wall time.

``--modes`` runs the same pipeline, alternating within each repeat, with nothing attached
(``off``), with a session :class:`~pantheon.sessions.Recorder` on a fresh SQLite store
(``recording``: every envelope, delivery and model call journaled, as ``pantheon run`` does;
the clock stops at ``drain``, and the time the recorder then takes to commit what is left is
reported beside it, with the store file's bytes per bus message), and with
:class:`~pantheon.telemetry.Telemetry` (``telemetry``: traces at 1% into an exporter that
counts spans, every bus metric collected every 100 ms, as
benchmarks/obs_bench.py; its clock stops once the spans are built and exported), and with the
run's :class:`~agents.Outcomes` (``outcomes``: every message seen, each item's decision kept,
as every labelled ``pantheon run`` does for its accuracy). Each mode's
overhead is the median of per-repeat ratios to ``off``; so are its CPU costs per request, of
the loop's thread and of the whole process, which a shared machine disturbs less than wall
time (a descheduled loop adds wall time, not CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents import (
    Actor,
    AgentOptions,
    ChatResult,
    Guardian,
    Learner,
    Memory,
    Monitor,
    Observer,
    Outbox,
    Outcomes,
    Planner,
    Reasoner,
    RuleProvider,
    Sensor,
)
from bus import Bus
from pantheon.runner._inputs import jsonl_labels, open_input
from pantheon.scenario import load_scenario
from pantheon.sessions import Recorder, SessionStore
from pantheon.telemetry import Telemetry

MODES = ("off", "recording", "telemetry", "outcomes")

ROOT = Path(__file__).resolve().parents[1]
BLOG_PIPELINE_RPS = 4237


class SimulatedModel:
    """The scenario's rule provider behind a fixed network-and-inference delay."""

    name = "simulated"
    model = "rules"

    def __init__(self, inner: RuleProvider, latency_s: float) -> None:
        self.inner = inner
        self.latency_s = latency_s

    def request_identity(self) -> Any:
        """What a real provider says (its server and model), so a recorded model call pays
        for its request digest as it does against a real one."""
        return ("simulated", self.inner.request_identity(), self.latency_s)

    async def chat(self, messages: Any, **kwargs: Any) -> ChatResult:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return await self.inner.chat(messages, **kwargs)

    async def aclose(self) -> None:
        await self.inner.aclose()


def make_inbox(n: int, directory: Path) -> Path:
    source = [
        ln
        for ln in (ROOT / "scenarios/data/support_emails.jsonl").read_text().splitlines()
        if ln.strip()
    ]
    path = directory / f"inbox-{n}.jsonl"
    with path.open("w") as f:
        for i in range(n):
            line = source[i % len(source)]
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                f.write(line + "\n")
                continue
            if isinstance(record, dict) and "id" in record:
                record["id"] = f"{record['id']}-{i}"
            f.write(json.dumps(record) + "\n")
    return path


async def one_run(
    inbox: Path,
    latency_ms: float,
    reasoner_concurrency: int,
    mode: str = "off",
    attach: Callable[[Bus], Awaitable[Any]] | None = None,
) -> dict[str, Any]:
    """One run of the pipeline; ``attach(bus)`` is awaited once the team is attached, before
    input flows (benchmarks/live_part_bench.py attaches a live feed there)."""
    scenario = load_scenario(ROOT / "scenarios/support_email.yaml")
    provider = SimulatedModel(
        RuleProvider(
            scenario.provider.rules,
            scenario.provider.default_intent,
            intents=scenario.provider.intents,
        ),
        latency_ms / 1000,
    )
    # The support team's own logic (scenarios/support/), as the scenario gives it to each role.
    settings = {name: cfg.settings for name, cfg in scenario.agents.items()}
    done = 0

    recorder = store = telemetry = None
    spans = None
    if mode == "telemetry":
        from obs_bench import CountingMetricExporter, CountingSpanExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        spans = CountingSpanExporter()
        telemetry = Telemetry(
            span_exporters=[spans],
            metric_readers=[
                PeriodicExportingMetricReader(CountingMetricExporter(), export_interval_millis=100)
            ],
            sampling=0.01,
        )
    finish_s = 0.0
    async with Bus() as bus:
        if mode == "recording":
            store = SessionStore(inbox.parent / f"pipeline-{time.monotonic_ns()}.db")
            recorder = Recorder(store, scenario="pipeline_bench")
            recorder.attach(bus)
        elif telemetry is not None:
            telemetry.instrument(bus)
        elif mode == "outcomes":
            # What every labelled `pantheon run` attaches: each item's decision, followed.
            bus.observe(Outcomes(scenario.outcome_spec(), jsonl_labels(scenario.input)))
        inp = scenario.input.model_copy(update={"path": inbox})
        observer = Observer(source=open_input(scenario.model_copy(update={"input": inp})))
        team = [
            observer,
            Sensor(settings=settings["sensor"]),
            Memory(),
            Reasoner(
                provider=provider,
                settings=settings["reasoner"],
                options=AgentOptions(concurrency=reasoner_concurrency),
            ),
            Planner(),
            Guardian(settings={**scenario.policy.model_dump(), **settings["guardian"]}),
            Actor(outbox=Outbox(None)),
            Learner(settings=settings["learner"]),
            Monitor(sample=False),
        ]
        for agent in team:
            await agent.attach(bus)

        async def count(env: Any) -> None:
            nonlocal done
            done += 1

        if attach is not None:
            await attach(bus)
        bus.on("action.executed", count, name="bench.done")
        bus.on("observation.email.malformed", count, name="bench.malformed")
        started = time.perf_counter()
        cpu0, loop_cpu0 = time.process_time(), time.thread_time()
        await observer.start()
        await observer.done.wait()
        await bus.drain()
        if telemetry is not None and telemetry.tracer_provider is not None:
            telemetry.tracer_provider.force_flush()  # spans built off the loop count too
        elapsed = time.perf_counter() - started
        cpu, loop_cpu = time.process_time() - cpu0, time.thread_time() - loop_cpu0
        stats = bus.stats()
        if recorder is not None:
            t0 = time.perf_counter()
            await recorder.finish("completed", {})
            finish_s = time.perf_counter() - t0
    store_bytes = 0
    if store is not None:
        store.close()
        store_bytes = _store_bytes(store.path)
    if telemetry is not None:
        telemetry.shutdown()
    hops = {
        name: {
            "wait_p50_us": s.queue_wait.p50_us,
            "wait_p99_us": s.queue_wait.p99_us,
            "handle_p50_us": s.handling.p50_us,
            "handle_p99_us": s.handling.p99_us,
        }
        for name, s in stats.subscribers.items()
        if not name.startswith("bench.")
    }
    return {
        "requests": done,
        "elapsed_s": elapsed,
        "rps": done / elapsed,
        "messages": stats.published,
        "hops": hops,
        "mode": mode,
        "finish_s": finish_s,
        "spans": spans.spans if spans is not None else 0,
        "store_bytes": store_bytes,
        "cpu_s": cpu,
        "loop_cpu_s": loop_cpu,
    }


def _store_bytes(path: Path) -> int:
    """The store file's size once its WAL is checkpointed into it (the recorder has
    materialized every row by then): what the run's record costs on disk."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--emails", type=int, default=2000)
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reasoner-concurrency", type=int, default=64)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    parser.add_argument(
        "--modes",
        default="off",
        help=f"comma-separated, alternating within each repeat: {', '.join(MODES)}",
    )
    parser.add_argument(
        "--json", type=Path, default=ROOT / "benchmarks/results/pipeline_bench.json"
    )
    args = parser.parse_args()
    modes = args.modes.split(",")
    if "off" not in modes or not set(modes) <= set(MODES):
        parser.error(f"--modes must include off and only {', '.join(MODES)}: got {args.modes}")

    runner = asyncio.run
    if args.loop == "uvloop":
        import uvloop

        runner = uvloop.run
    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loop": args.loop,
        },
        "emails": args.emails,
        "reasoner_concurrency": args.reasoner_concurrency,
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        inbox = make_inbox(args.emails, Path(tmp))
        for latency in args.latency_ms:
            by_mode: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
            for rep in range(args.repeats):
                for mode in modes[rep % len(modes) :] + modes[: rep % len(modes)]:
                    by_mode[mode].append(
                        runner(one_run(inbox, latency, args.reasoner_concurrency, mode))
                    )
            for mode in modes:
                runs = by_mode[mode]
                best = sorted(runs, key=lambda r: r["rps"])[len(runs) // 2]
                rps = statistics.median(r["rps"] for r in runs)
                key = f"{latency:g}ms" if mode == "off" else f"{latency:g}ms/{mode}"
                results["runs"][key] = {
                    "median_rps": rps,
                    "ratio_to_blog": rps / BLOG_PIPELINE_RPS,
                    "median_run": best,
                    "runs": [
                        {k: r[k] for k in ("rps", "finish_s", "spans", "store_bytes", "cpu_s")}
                        for r in runs
                    ],
                }
                line = (
                    f"model latency {latency:g} ms, {mode}: {rps:,.0f} requests/s "
                    f"({rps / BLOG_PIPELINE_RPS:.1f}x the blog's {BLOG_PIPELINE_RPS:,}), "
                    f"{best['messages'] / best['elapsed_s']:,.0f} bus msg/s"
                )
                if mode != "off":
                    loss = 1 - statistics.median(
                        r["rps"] / off["rps"] for r, off in zip(runs, by_mode["off"], strict=True)
                    )
                    results["runs"][key]["overhead"] = loss
                    line += f"; overhead {loss:.1%} (median of per-repeat ratios to off)"
                    # CPU per request, steadier than wall time on a shared machine: the loop
                    # thread's (what the team waits on) and the process's (writer included).
                    for what in ("loop_cpu_s", "cpu_s"):
                        extra = statistics.median(
                            r[what] / r["requests"] / (off[what] / off["requests"]) - 1
                            for r, off in zip(runs, by_mode["off"], strict=True)
                        )
                        results["runs"][key][f"{what}_overhead"] = extra
                        line += f"; {what.removesuffix('_s').replace('_', ' ')} +{extra:.1%}"
                    if mode == "recording":
                        finish = statistics.median(r["finish_s"] for r in runs)
                        line += f"; then {finish * 1000:,.0f} ms to commit the rest"
                        per_msg = statistics.median(r["store_bytes"] / r["messages"] for r in runs)
                        results["runs"][key]["store_bytes_per_message"] = per_msg
                        line += f"; store {per_msg:,.0f} B per message"
                print(line)
                if mode != "off":
                    continue
                print(
                    f"  {'hop (µs)':<34}{'wait p50':>10}{'wait p99':>10}"
                    f"{'handle p50':>12}{'handle p99':>12}"
                )
                for name, h in best["hops"].items():
                    print(
                        f"  {name:<34}{h['wait_p50_us']:>10.1f}{h['wait_p99_us']:>10.1f}"
                        f"{h['handle_p50_us']:>12.1f}{h['handle_p99_us']:>12.1f}"
                    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
