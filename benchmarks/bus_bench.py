#!/usr/bin/env python
"""Benchmark of Pantheon's in-process bus (``bus.Bus``) against the blog's MessageBus.

One command measures everything, on the default asyncio loop and on uvloop::

    .venv/bin/python benchmarks/bus_bench.py [--quick] [--loop asyncio|uvloop|both] [--json PATH]

Every measurement runs ``--repeats`` times (5; 3 with ``--quick``) after one untimed warm-up, and
the table shows the median of the repeats. The JSON (``benchmarks/results/bus_bench.json`` by
default) keeps every repeat, the machine it ran on and whether other work was using the CPU.

What is measured (letters match benchmarks/README.md):

(a)  ``await bus.emit(topic, p)`` x N then ``await bus.drain()``, one no-op async subscriber,
     default subscription options (10,000-message mailbox, ``block`` overflow); the same with
     ``await bus.emit_many(topic, payloads)``; and, for reference, the emit loop with a mailbox
     large enough never to block.
(b)  the emit loop with 10 no-op subscribers on the topic: published/s and deliveries/s.
(c)  10,000 glob subscriptions ``tenant{i}.events.*``. (c1) emit loop on one repeated topic
     (fan-out 1), as a ratio to (a). (c2) the route-miss path: ``bus._route(topic)`` timed per
     call on never-seen topics ``tenant{i}.events.{j}``, without and with a few patterns whose
     first token is a wildcard (``*.audit`` ...), whose branch every topic walks; plus
     emit+deliver of never-seen topics end to end.
(d)  per-hop latency at a fixed offered load of half the median of (a) on the same loop: a
     publisher emits small bursts on a schedule (paced by ``time.monotonic``, because uvloop's
     ``loop.time()`` only moves in whole milliseconds), the handler records
     ``time.monotonic_ns() - env.created``; percentiles come from the raw samples.
(e)  memory with 100,000 messages queued behind a blocked subscriber, in a fresh subprocess:
     tracemalloc bytes the bus allocates per queued message (payloads made beforehand, so not
     counted), and the process RSS delta (a second subprocess, without tracemalloc).
(f)  a faithful replica of the blog's MessageBus (``asyncio.Queue(maxsize=10000)``, one task that
     gets ``(event, data, timestamp)`` and gathers the handlers), measured as (a) and (b).
(ceiling) a bare ``collections.deque`` drained by one worker task awaiting a no-op handler.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import gc
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bus import Bus  # noqa: E402

perf = time.perf_counter
perf_ns = time.perf_counter_ns
mono_ns = time.monotonic_ns

PROFILES: dict[str, dict[str, Any]] = {
    "full": {
        "repeats": 5,
        "n_a": 100_000,  # (a) messages per repeat
        "n_b": 30_000,  # (b) messages published per repeat (x10 deliveries)
        "glob_patterns": 10_000,  # (c)
        "n_c1": 100_000,
        "n_c2": 20_000,  # fresh topics per repeat for the route-miss timing
        "n_fresh": 20_000,  # fresh topics per repeat for emit+deliver
        "d_seconds": 1.0,  # (d) measured seconds per repeat (plus 10% warm-up)
        "n_e": 100_000,  # (e) messages queued
        "e_repeats": 3,
        "n_rep_a": 50_000,  # (f) replica, 1 subscriber
        "n_rep_b": 10_000,  # (f) replica, 10 subscribers
        "n_ceiling": 100_000,
    },
    "quick": {
        "repeats": 3,
        "n_a": 30_000,
        "n_b": 5_000,
        "glob_patterns": 10_000,
        "n_c1": 30_000,
        "n_c2": 5_000,
        "n_fresh": 5_000,
        "d_seconds": 0.3,
        "n_e": 100_000,
        "e_repeats": 1,
        "n_rep_a": 10_000,
        "n_rep_b": 2_000,
        "n_ceiling": 30_000,
    },
}

FANOUT = 10
MAX_BURST = 64  # (d) most messages one publisher tick may emit when it has fallen behind
SUBS_MEMORY = 1_000  # (e) subscriptions whose memory is measured
EMPTY_PREFIX_PATTERNS = ("*.audit", "*.errors.*", "*.system.>", "*.*.debug")

TARGETS = {
    "a_emit": (">=", 500_000),
    "a_emit_many": (">=", 500_000),
    "a_vs_replica": (">=", 8.0),
    "b_published": (">=", 80_000),
    "b_deliveries": (">=", 800_000),
    "c1_ratio": (">=", 0.8),
    "c2_miss_us": ("<=", 20.0),
    "c2_miss_empty_us": ("<=", 20.0),
    "d_p99_us": ("<=", 50.0),
    "e_bytes_per_msg": ("<=", 250.0),
}


async def noop(env: Any) -> None:
    return None


def make_payloads(n: int) -> list[dict[str, int]]:
    return [{"id": i} for i in range(n)]


def pct(sorted_samples: list[int], q: float) -> float:
    """Nearest-rank percentile of already sorted samples."""
    if not sorted_samples:
        return math.nan
    k = max(0, min(len(sorted_samples) - 1, math.ceil(q * len(sorted_samples)) - 1))
    return float(sorted_samples[k])


async def repeat(fn: Callable[[], Awaitable[Any]], repeats: int, warmup: bool = True) -> list[Any]:
    """Run ``fn`` once untimed (warm-up), then ``repeats`` times with a collected heap."""
    if warmup:
        gc.collect()
        await fn()
    out = []
    for _ in range(repeats):
        gc.collect()
        out.append(await fn())
    return out


# -- the blog's MessageBus, replicated ------------------------------------------------------


class BlogMessageBus:
    """The MessageBus of the blog post, as printed ("2. Async-First Design").

    Two unavoidable liberties: the post declares ``async def on`` yet calls ``bus.on(...)``
    without awaiting it, so ``on`` is a plain method here; and the post starts the bus with
    ``asyncio.create_task(bus.start())`` without showing ``start``, so ``start`` runs the
    processing loop it shows.
    """

    def __init__(self) -> None:
        self.handlers: defaultdict[str, list[Callable[[Any], Awaitable[Any]]]] = defaultdict(list)
        self.queue: asyncio.Queue[tuple[str, Any, float]] = asyncio.Queue(maxsize=10000)

    async def emit(self, event: str, data: Any) -> None:
        """Non-blocking event emission"""
        await self.queue.put((event, data, time.time()))

    def on(self, event: str, handler: Callable[[Any], Awaitable[Any]]) -> None:
        """Register async handler"""
        self.handlers[event].append(handler)

    async def start(self) -> None:
        await self._process_events()

    async def _process_events(self) -> None:
        """Main event loop - runs forever"""
        while True:
            event, data, timestamp = await self.queue.get()  # noqa: RUF059 - as printed

            # Fire all handlers concurrently
            tasks = [h(data) for h in self.handlers[event]]
            await asyncio.gather(*tasks, return_exceptions=True)


async def noop_data(data: Any) -> None:
    return None


async def replica_throughput(payloads: list[Any], fanout: int, count: bool = False) -> float:
    """Emit every payload, then a sentinel; FIFO with one consumer means the sentinel is
    handled last. Returns messages published per second."""
    loop = asyncio.get_running_loop()
    bus = BlogMessageBus()
    seen = [0]

    async def counting(data: Any) -> None:
        seen[0] += 1

    for _ in range(fanout):
        bus.on("test.event", counting if count else noop_data)
    done: asyncio.Future[None] = loop.create_future()

    async def finish(data: Any) -> None:
        done.set_result(None)

    bus.on("bench.done", finish)
    task = loop.create_task(bus.start())
    await asyncio.sleep(0)
    emit = bus.emit
    t0 = perf()
    for p in payloads:
        await emit("test.event", p)
    await emit("bench.done", None)
    await done
    dt = perf() - t0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    if count and seen[0] != len(payloads) * fanout:
        raise AssertionError(f"replica delivered {seen[0]}, expected {len(payloads) * fanout}")
    return len(payloads) / dt


# -- reference ceiling ----------------------------------------------------------------------


async def deque_ceiling(payloads: list[Any]) -> float:
    loop = asyncio.get_running_loop()
    q: deque[Any] = deque()
    waiter: list[asyncio.Future[None] | None] = [None]
    n = len(payloads)
    done: asyncio.Future[int] = loop.create_future()

    async def worker() -> None:
        popleft = q.popleft
        handled = 0
        while True:
            while q:
                item = popleft()
                await noop(item)
                handled += 1
            if handled >= n:
                done.set_result(handled)
                return
            fut = loop.create_future()
            waiter[0] = fut
            await fut

    task = loop.create_task(worker())
    await asyncio.sleep(0)
    append = q.append
    t0 = perf()
    for p in payloads:
        append(p)
        w = waiter[0]
        if w is not None:
            waiter[0] = None
            w.set_result(None)
    handled = await done
    dt = perf() - t0
    await task
    assert handled == n
    return n / dt


# -- (a) (b): our bus -----------------------------------------------------------------------


async def ours_emit(payloads: list[Any], fanout: int = 1, max_queue: int | None = None) -> float:
    """``await bus.emit`` x N then ``await bus.drain()``; returns messages published/s."""
    options = {} if max_queue is None else {"max_queue": max_queue}
    async with Bus() as bus:
        for i in range(fanout):
            bus.on("bench.a", noop, name=f"sub{i}", **options)
        await asyncio.sleep(0)  # workers start and park
        emit = bus.emit
        t0 = perf()
        for p in payloads:
            await emit("bench.a", p)
        await bus.drain()
        dt = perf() - t0
        for sub in bus.subscriptions().values():
            if sub.delivered != len(payloads):
                raise AssertionError(f"{sub.name} delivered {sub.delivered}/{len(payloads)}")
    return len(payloads) / dt


async def ours_emit_many(payloads: list[Any]) -> float:
    async with Bus() as bus:
        bus.on("bench.a", noop, name="sub0")
        await asyncio.sleep(0)
        t0 = perf()
        n = await bus.emit_many("bench.a", payloads)
        await bus.drain()
        dt = perf() - t0
        delivered = bus.subscriptions()["sub0"].delivered
        if n != len(payloads) or delivered != n:
            raise AssertionError(f"emit_many delivered {delivered}/{len(payloads)}")
    return len(payloads) / dt


# -- (c): 10,000 glob subscriptions ---------------------------------------------------------


async def glob_suite(cfg: dict[str, Any], payloads: list[Any]) -> dict[str, Any]:
    n_patterns = cfg["glob_patterns"]
    repeats = cfg["repeats"]
    rng = random.Random(42)
    out: dict[str, Any] = {}
    bus = Bus()
    t0 = perf()
    for i in range(n_patterns):
        bus.on(f"tenant{i}.events.*", noop, name=f"t{i}")
    out["subscribe_s"] = perf() - t0
    await bus.start()
    await asyncio.sleep(0)
    try:
        # (c1) one repeated topic, fan-out 1
        topic = "tenant4242.events.created"
        sub = bus.subscriptions()["t4242"]
        c1_payloads = payloads[: cfg["n_c1"]]

        async def c1() -> float:
            before = sub.delivered
            emit = bus.emit
            t = perf()
            for p in c1_payloads:
                await emit(topic, p)
            await bus.drain()
            dt = perf() - t
            if sub.delivered - before != len(c1_payloads):
                raise AssertionError("c1 lost messages")
            return len(c1_payloads) / dt

        out["c1_msgs"] = await repeat(c1, repeats)

        seq = [0]

        def fresh_topics(n: int) -> list[str]:
            first = seq[0]
            seq[0] += n
            return [
                f"tenant{rng.randrange(n_patterns)}.events.{j}" for j in range(first, first + n)
            ]

        def check_route(t: str, route: Any) -> None:
            want = "t" + t[len("tenant") : t.index(".")]
            names = [s.name for s in route.subs]
            if names != [want]:
                raise AssertionError(f"route of {t} is {names}, expected [{want}]")

        async def miss() -> dict[str, float]:
            topics = fresh_topics(cfg["n_c2"])
            route = bus._route
            routes = bus._routes.cache
            samples = []
            append = samples.append
            t_all = perf_ns()
            for t in topics:
                s = perf_ns()
                route(t)
                append(perf_ns() - s)
            total = perf_ns() - t_all
            for t in topics[:: max(1, len(topics) // 50)]:
                r = routes.get(t)
                if r is not None:
                    check_route(t, r)
            half = len(samples) // 2
            first, second = sorted(samples[:half]), sorted(samples[half:])
            samples.sort()
            return {
                "median_us": pct(samples, 0.5) / 1e3,
                "p99_us": pct(samples, 0.99) / 1e3,
                "mean_us": total / len(topics) / 1e3,
                "median_first_half_us": pct(first, 0.5) / 1e3,
                "median_second_half_us": pct(second, 0.5) / 1e3,
                "cache_size": len(routes),
            }

        async def fresh_emit() -> float:
            topics = fresh_topics(cfg["n_fresh"])
            p = payloads[0]
            emit = bus.emit
            subs = bus.subscriptions().values()
            before = sum(sub.delivered for sub in subs)
            t = perf()
            for tp in topics:
                await emit(tp, p)
            await bus.drain()
            dt = perf() - t
            if sum(sub.delivered for sub in subs) - before != len(topics):
                raise AssertionError("fresh-topic emits lost")
            return dt / len(topics) * 1e6

        bus._routes.changed()  # start (c2) from an empty route cache
        out["c2_miss"] = await repeat(miss, repeats, warmup=False)
        out["c2_fresh_emit_us"] = await repeat(fresh_emit, repeats)
        for k, pattern in enumerate(EMPTY_PREFIX_PATTERNS):
            bus.on(pattern, noop, name=f"empty{k}")
        await asyncio.sleep(0)
        out["c2_miss_empty"] = await repeat(miss, repeats, warmup=False)
        out["c2_fresh_emit_empty_us"] = await repeat(fresh_emit, repeats)
    finally:
        await bus.aclose()
    return out


# -- (d): latency at a fixed offered load ---------------------------------------------------


async def latency_run(rate: float, seconds: float) -> dict[str, float]:
    samples: list[int] = []
    append = samples.append

    async def record(env: Any) -> None:
        append(mono_ns() - env.created)

    async with Bus() as bus:
        bus.on("bench.d", record, name="record")
        await asyncio.sleep(0)
        emit = bus.emit
        payload = {"id": 0}
        warm = 0.1 * seconds
        clock = time.monotonic
        t0 = clock()
        t_warm = t0 + warm
        end = t_warm + seconds
        sent = 0
        ticks = 0
        warm_sent = -1
        measured_start = 0.0
        while True:
            now = clock()
            if now >= end:
                break
            if warm_sent < 0 and now >= t_warm:
                warm_sent, measured_start = sent, now
            k = int((now - t0) * rate) - sent
            if k > MAX_BURST:
                k = MAX_BURST
            for _ in range(k):
                await emit("bench.d", payload)
            sent += k
            ticks += 1
            await asyncio.sleep(0)
        measured_end = clock()
        await bus.drain()
        wait = bus.stats().subscribers["record"].queue_wait
    if len(samples) != sent:
        raise AssertionError(f"latency: {len(samples)} samples for {sent} messages")
    measured = sorted(samples[warm_sent:])
    return {
        "offered_per_s": rate,
        "achieved_per_s": (sent - warm_sent) / (measured_end - measured_start),
        "p50_us": pct(measured, 0.50) / 1e3,
        "p99_us": pct(measured, 0.99) / 1e3,
        "p999_us": pct(measured, 0.999) / 1e3,
        "max_us": measured[-1] / 1e3,
        "samples": len(measured),
        "mean_burst": sent / ticks,
        "bus_histogram_p99_us": wait.p99_us,
    }


# -- (e): memory, in a fresh subprocess -----------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def memory_child(n: int, use_tracemalloc: bool) -> dict[str, Any]:
    payloads = make_payloads(n)  # made before measuring: not counted
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()

    async def blocked(env: Any) -> None:
        await gate

    out: dict[str, Any] = {}
    async with Bus() as bus:
        bus.on("bench.e", blocked, name="blocked", max_queue=n + 10)
        await bus.emit("bench.e", None)  # the worker takes it and blocks on the gate
        for _ in range(3):
            await asyncio.sleep(0)
        sub = bus.subscriptions()["blocked"]
        assert sub.in_flight == 1 and sub.size == 0
        emit = bus.emit
        gc.collect()
        if use_tracemalloc:
            tracemalloc.start(1)
            before = tracemalloc.get_traced_memory()[0]
            snap0 = tracemalloc.take_snapshot()
        rss0 = rss_bytes()
        for p in payloads:
            await emit("bench.e", p)
        rss1 = rss_bytes()
        if use_tracemalloc:
            after = tracemalloc.get_traced_memory()[0]
            snap1 = tracemalloc.take_snapshot()
            tracemalloc.stop()
            stats = snap1.compare_to(snap0, "lineno")
            out["bytes_per_msg"] = (after - before) / n
            out["top_lines"] = [
                {
                    "where": f"{Path(s.traceback[0].filename).name}:{s.traceback[0].lineno}",
                    "bytes_per_msg": s.size_diff / n,
                    "blocks_per_msg": s.count_diff / n,
                }
                for s in stats[:6]
                if s.size_diff > 0
            ]
        assert sub.size == n, sub.size
        out["rss_delta_bytes"] = rss1 - rss0
        out["rss_bytes_per_msg"] = (rss1 - rss0) / n
        gate.set_result(None)
        await bus.drain()
        assert sub.delivered == n + 1
    return out


async def subscription_memory_child(n: int) -> dict[str, Any]:
    """tracemalloc bytes per glob subscription: idle, then after each has handled one message
    (its first delivery from a new source adds a per-edge histogram)."""
    payload = {"id": 0}
    topics = [f"tenant{i}.events.x" for i in range(n)]
    gc.collect()
    tracemalloc.start(1)
    b0 = tracemalloc.get_traced_memory()[0]
    bus = Bus()
    for i in range(n):
        bus.on(f"tenant{i}.events.*", noop, name=f"t{i}")
    await bus.start()
    await asyncio.sleep(0)
    b1 = tracemalloc.get_traced_memory()[0]
    for t in topics:
        await bus.emit(t, payload)
    await bus.drain()
    bus._routes.changed()  # drop the routes the emits cached: count subscriptions only
    gc.collect()
    b2 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    await bus.aclose()
    return {
        "bytes_per_subscription": (b1 - b0) / n,
        "bytes_per_subscription_after_delivery": (b2 - b0) / n,
    }


def run_memory(loop_name: str, n: int, repeats: int) -> dict[str, Any]:
    results: dict[str, list[Any]] = {"tracemalloc": [], "rss": [], "subs": []}
    for i in range(repeats):
        for mode in ("tracemalloc", "rss", "subs"):
            if mode == "subs" and i:
                continue  # deterministic: once is enough
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--_memory-child",
                mode,
                "--loop",
                loop_name,
                "--_n",
                str(SUBS_MEMORY if mode == "subs" else n),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
            if proc.returncode != 0:
                raise RuntimeError(f"memory child failed:\n{proc.stderr}")
            results[mode].append(json.loads(proc.stdout))
    return results


# -- driver ---------------------------------------------------------------------------------


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


async def suite(cfg: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    r = cfg["repeats"]
    payloads = make_payloads(max(cfg["n_a"], cfg["n_c1"], cfg["n_ceiling"], cfg["n_rep_a"]))
    pa = payloads[: cfg["n_a"]]
    res: dict[str, Any] = {}
    log("(a) emit loop")
    res["a_emit"] = await repeat(lambda: ours_emit(pa), r)
    log("(a) emit_many")
    res["a_emit_many"] = await repeat(lambda: ours_emit_many(pa), r)
    log("(a) emit loop, mailbox never full")
    res["a_emit_unbounded"] = await repeat(lambda: ours_emit(pa, max_queue=len(pa) + 1), r)
    log("ceiling")
    pc = payloads[: cfg["n_ceiling"]]
    res["ceiling"] = await repeat(lambda: deque_ceiling(pc), r)
    log("(b) fan-out 10")
    pb = payloads[: cfg["n_b"]]
    res["b_published"] = await repeat(lambda: ours_emit(pb, fanout=FANOUT), r)
    log("(f) replica")
    await replica_throughput(payloads[:2000], 1, count=True)  # correctness, untimed
    await replica_throughput(payloads[:500], FANOUT, count=True)
    pra = payloads[: cfg["n_rep_a"]]
    res["f_replica_a"] = await repeat(lambda: replica_throughput(pra, 1), r)
    prb = payloads[: cfg["n_rep_b"]]
    res["f_replica_b"] = await repeat(lambda: replica_throughput(prb, FANOUT), r)
    log(f"(c) {cfg['glob_patterns']:,} glob subscriptions")
    res["c"] = await glob_suite(cfg, payloads)
    rate = statistics.median(res["a_emit"]) / 2
    log(f"(d) latency at {rate:,.0f} msg/s offered")
    res["d"] = await repeat(lambda: latency_run(rate, cfg["d_seconds"]), r, warmup=False)
    return res


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def summarize(res: dict[str, Any], mem: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Medians of every repeat, keyed by row id: (value, unit, label)."""
    m: dict[str, dict[str, Any]] = {}

    def put(key: str, value: float, unit: str, label: str) -> None:
        m[key] = {"value": value, "unit": unit, "label": label}

    a = median(res["a_emit"])
    put("a_emit", a, "msg/s", "(a) emit loop -> no-op, 1 sub")
    put("a_emit_many", median(res["a_emit_many"]), "msg/s", "(a) emit_many batch, 1 sub")
    put("a_emit_unbounded", median(res["a_emit_unbounded"]), "msg/s",
        "(a) emit loop, mailbox never full")  # fmt: skip
    rep_a = median(res["f_replica_a"])
    put("a_vs_replica", a / rep_a, "x", "(a) ours / blog replica")
    ceil = median(res["ceiling"])
    put("ceiling", ceil, "msg/s", "ceiling: bare deque + 1 worker")
    put("a_vs_ceiling", a / ceil, "x", "(a) ours / ceiling")
    b = median(res["b_published"])
    put("b_published", b, "msg/s", "(b) fan-out 10: published")
    put("b_deliveries", b * FANOUT, "deliv/s", "(b) fan-out 10: deliveries")
    rep_b = median(res["f_replica_b"])
    put("b_vs_replica", b / rep_b, "x", "(b) ours / blog replica")
    c = res["c"]
    put("c_subscribe_s", c["subscribe_s"], "s", "(c) subscribe 10k glob patterns")
    c1 = median(c["c1_msgs"])
    put("c1_msgs", c1, "msg/s", "(c1) repeated topic, 10k patterns")
    put("c1_ratio", c1 / a, "x", "(c1) repeated topic / (a)")
    miss = c["c2_miss"]
    put("c2_miss_us", median([x["median_us"] for x in miss]), "us", "(c2) route miss, median")
    put("c2_miss_p99_us", median([x["p99_us"] for x in miss]), "us", "(c2) route miss, p99")
    put("c2_miss_evicting_us", median([x["median_second_half_us"] for x in miss]), "us",
        "(c2) route miss, median, cache full")  # fmt: skip
    miss_e = c["c2_miss_empty"]
    put("c2_miss_empty_us", median([x["median_us"] for x in miss_e]), "us",
        f"(c2) route miss + {len(EMPTY_PREFIX_PATTERNS)} empty-prefix, median")  # fmt: skip
    put("c2_miss_empty_p99_us", median([x["p99_us"] for x in miss_e]), "us",
        f"(c2) route miss + {len(EMPTY_PREFIX_PATTERNS)} empty-prefix, p99")  # fmt: skip
    put("c2_fresh_emit_us", median(c["c2_fresh_emit_us"]), "us/msg",
        "(c2) emit+deliver, never-seen topic")  # fmt: skip
    put("c2_fresh_emit_empty_us", median(c["c2_fresh_emit_empty_us"]), "us/msg",
        "(c2) emit+deliver, never-seen, + empty-prefix")  # fmt: skip
    d = res["d"]
    put("d_offered", median([x["offered_per_s"] for x in d]), "msg/s", "(d) offered load (a/2)")
    put("d_achieved", median([x["achieved_per_s"] for x in d]), "msg/s", "(d) achieved rate")
    put("d_p50_us", median([x["p50_us"] for x in d]), "us", "(d) per-hop latency p50")
    put("d_p99_us", median([x["p99_us"] for x in d]), "us", "(d) per-hop latency p99")
    put("d_p999_us", median([x["p999_us"] for x in d]), "us", "(d) per-hop latency p99.9")
    put("d_bus_hist_p99_us", median([x["bus_histogram_p99_us"] for x in d]), "us",
        "(d) p99 per the bus's own histogram")  # fmt: skip
    tm = mem["tracemalloc"]
    put("e_bytes_per_msg", median([x["bytes_per_msg"] for x in tm]), "B/msg",
        "(e) tracemalloc per queued msg")  # fmt: skip
    rss = mem["rss"]
    put("e_rss_mb", median([x["rss_delta_bytes"] for x in rss]) / 2**20, "MiB",
        "(e) RSS delta, 100k queued")  # fmt: skip
    put("e_rss_per_msg", median([x["rss_bytes_per_msg"] for x in rss]), "B/msg",
        "(e) RSS delta per queued msg")  # fmt: skip
    subs = mem["subs"]
    put("e_bytes_per_sub", median([x["bytes_per_subscription"] for x in subs]), "B",
        "(e) tracemalloc per subscription, idle")  # fmt: skip
    put("e_bytes_per_sub_used", median([x["bytes_per_subscription_after_delivery"] for x in subs]),
        "B", "(e) same, after its first delivery")  # fmt: skip
    put("f_replica_a", rep_a, "msg/s", "(f) blog replica, 1 sub")
    put("f_replica_b", rep_b, "msg/s", "(f) blog replica, fan-out 10: published")
    put("f_replica_b_deliv", rep_b * FANOUT, "deliv/s", "(f) blog replica, fan-out 10: deliv.")
    for key, row in m.items():
        if key in TARGETS:
            op, bound = TARGETS[key]
            row["target"] = f"{op} {bound:,g}"
            row["pass"] = row["value"] >= bound if op == ">=" else row["value"] <= bound
    return m


# -- machine --------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_jiffies() -> tuple[int, int, int]:
    """(busy, total, steal) jiffies over all CPUs from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    steal = fields[7] if len(fields) > 7 else 0
    total = sum(fields[:8])
    return total - idle, total, steal


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "bus"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
        return head + ("+dirty(bus/)" if dirty else "")
    except OSError:
        return "unknown"


def machine_info() -> dict[str, Any]:
    import msgspec

    try:
        import uvloop

        uv = uvloop.__version__
    except ImportError:
        uv = None
    return {
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "python_impl": platform.python_implementation(),
        "uvloop": uv,
        "msgspec": msgspec.__version__,
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "loadavg_start": os.getloadavg(),
    }


# -- output ---------------------------------------------------------------------------------


def fmt(value: float, unit: str) -> str:
    if unit in ("msg/s", "deliv/s"):
        return f"{value:,.0f}"
    if unit == "x":
        return f"{value:.2f}x"
    if unit in ("B", "B/msg"):
        return f"{value:,.0f} B" if unit == "B" else f"{value:,.0f}"
    if unit in ("s", "MiB"):
        return f"{value:.2f}"
    return f"{value:.2f}"


def print_table(summary: dict[str, dict[str, dict[str, Any]]], busy: dict[str, Any]) -> None:
    loops = list(summary)
    keys = list(next(iter(summary.values())))
    headers = ["metric", "unit", *loops, "target"]
    rows = []
    for key in keys:
        first = summary[loops[0]][key]
        cells = [first["label"], first["unit"]]
        for ln in loops:
            row = summary[ln][key]
            cell = fmt(row["value"], row["unit"])
            if "pass" in row:
                cell += " PASS" if row["pass"] else " FAIL"
            cells.append(cell)
        cells.append(first.get("target", ""))
        rows.append(cells)
    title = "Bus benchmark (medians)" + (" - PRELIMINARY: machine busy" if busy["busy"] else "")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
        for r in [headers, *rows]:
            print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
        return
    table = Table(title=title)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right", no_wrap=True)
    for r in rows:
        styled = [
            c.replace(" PASS", " [green]PASS[/]").replace(" FAIL", " [red]FAIL[/]") for c in r
        ]
        table.add_row(*styled)
    console = Console()
    if console.width < 120:
        console = Console(width=120)
    console.print(table)


def markdown_table(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    loops = list(summary)
    keys = list(next(iter(summary.values())))
    lines = [
        "| metric | unit | " + " | ".join(loops) + " | target |",
        "|---|---|" + "---:|" * len(loops) + "---|",
    ]
    for key in keys:
        first = summary[loops[0]][key]
        cells = []
        for ln in loops:
            row = summary[ln][key]
            cell = fmt(row["value"], row["unit"])
            if "pass" in row:
                cell += " ✅" if row["pass"] else " ❌"
            cells.append(cell)
        lines.append(
            f"| {first['label']} | {first['unit']} | "
            + " | ".join(cells)
            + f" | {first.get('target', '')} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, 3 repeats (~30 s)")
    ap.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "bus_bench.json"))
    ap.add_argument("--repeats", type=int, help="override the number of timed repeats")
    ap.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    ap.add_argument("--_memory-child", dest="memory_child", help=argparse.SUPPRESS)
    ap.add_argument("--_n", dest="n", type=int, default=100_000, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.memory_child:
        loop_name = "uvloop" if args.loop == "uvloop" else "asyncio"
        with asyncio.Runner(loop_factory=loop_factory(loop_name)) as runner:
            if args.memory_child == "subs":
                out = runner.run(subscription_memory_child(args.n))
            else:
                out = runner.run(memory_child(args.n, args.memory_child == "tracemalloc"))
        print(json.dumps(out))
        return 0

    cfg = dict(PROFILES["quick" if args.quick else "full"])
    if args.repeats:
        cfg["repeats"] = args.repeats
    loops = ["asyncio", "uvloop"] if args.loop == "both" else [args.loop]
    info = machine_info()
    started = perf()

    def log(msg: str) -> None:
        print(f"[{perf() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    busy0, total0, steal0 = cpu_jiffies()
    own0 = own_cpu_seconds()
    raw: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    per_loop_load: dict[str, float] = {}
    for ln in loops:
        log(f"== {ln} ==")
        lb0, _, _ = cpu_jiffies()
        lown0, lwall0 = own_cpu_seconds(), perf()
        with asyncio.Runner(loop_factory=loop_factory(ln)) as runner:
            res = runner.run(suite(cfg, lambda s, ln=ln: log(f"{ln}: {s}")))
        log(f"{ln}: (e) memory, {cfg['n_e']:,} queued (subprocesses)")
        mem = run_memory(ln, cfg["n_e"], cfg["e_repeats"])
        raw[ln] = {**res, "e": mem}
        summary[ln] = summarize(res, mem)
        lb1, _, _ = cpu_jiffies()
        l_other = (lb1 - lb0) / os.sysconf("SC_CLK_TCK") - (own_cpu_seconds() - lown0)
        per_loop_load[ln] = max(0.0, l_other / (perf() - lwall0))
    wall = perf() - started
    busy1, total1, steal1 = cpu_jiffies()
    hz = os.sysconf("SC_CLK_TCK")
    other = (busy1 - busy0) / hz - (own_cpu_seconds() - own0)
    busy = {
        "wall_s": wall,
        "other_work_cores": max(0.0, other / wall),
        "steal_fraction": (steal1 - steal0) / max(1, total1 - total0),
        "loadavg_end": os.getloadavg(),
        "other_work_cores_per_loop": per_loop_load,
    }
    # Another process using a fifth of a core, or the hypervisor stealing 5%, makes it busy.
    busy["busy"] = busy["other_work_cores"] > 0.2 or busy["steal_fraction"] > 0.05
    print_table(summary, busy)
    print(
        f"machine: {info['cpu_model']}, {info['cpus']} CPUs, Python {info['python']}, "
        f"{info['platform']}; other work: {busy['other_work_cores']:.2f} cores, "
        f"steal {busy['steal_fraction']:.1%}; wall {wall:.0f} s"
    )
    print(
        "other work per loop: "
        + ", ".join(f"{ln} {v:.2f} cores" for ln, v in per_loop_load.items())
    )
    if args.markdown:
        print(markdown_table(summary))
    failed = [
        f"{ln}:{k}"
        for ln, rows in summary.items()
        for k, row in rows.items()
        if row.get("pass") is False
    ]
    print("targets failed: " + (", ".join(failed) if failed else "none"))
    out = {
        "benchmark": "bus_bench",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "profile": "quick" if args.quick else "full",
        "config": cfg,
        "machine": info,
        "load": busy,
        "preliminary": busy["busy"],
        "targets": {k: f"{op} {v}" for k, (op, v) in TARGETS.items()},
        "summary": summary,
        "raw": raw,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(out, indent=2, default=str))
    tmp.replace(path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
