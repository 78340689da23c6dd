"""``/metrics``: the bus's own counters (``bus.stats()``) and the gateway's, in the
Prometheus text format, rendered by ``prometheus_client`` at each scrape.

Nothing is counted twice: the families are built from the live counters when scraped,
so there is no second set of counters to drift from the bus's.

A scrape runs on the run's event loop, so its cost is bounded: the per-topic family has
the ``MAX_TOPIC_LABELS`` busiest topics and one ``topic="(other)"`` series for the rest
(parentheses are not valid in a topic, so it never collides with one). Reading the bus's
stats still costs time per topic, so a rendering that took more than ``CACHE_AFTER``
seconds is served again to scrapes for ``DUTY`` times as long as it took: however often
``/metrics`` is scraped, it holds the loop at most 1/``DUTY`` of the time. A cheap one is
never reused, so a small run's counters are always current. With 20,000 topics every
scrape used to hold the loop for 150-200 ms.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import time
from collections.abc import Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from bus import BusStats

if TYPE_CHECKING:
    from pantheon.gateway._app import GatewayState

__all__ = ["MAX_TOPIC_LABELS", "render_metrics"]

_BREAKER_STATES = ("closed", "open", "half_open")
#: Topics with a series of their own in ``pantheon_bus_topic_published_total``.
MAX_TOPIC_LABELS = 1000
#: The label of the series that sums every other topic.
OTHER_TOPICS = "(other)"
#: A rendering that cost more CPU than this (seconds) is reused for a while.
CACHE_AFTER = 0.01
#: How many times its own cost a slow rendering is reused for.
DUTY = 50


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """Everything a rendering reads, taken on the loop, so the rendering itself can run in
    a thread without reading anything the loop changes meanwhile."""

    stats: BusStats
    requests: list[tuple[tuple[str, int], int]]
    published: int
    clients: int
    delivered: int
    dropped: int
    malformed_frames: int

    @classmethod
    def of(cls, state: GatewayState) -> _Snapshot:
        clients = list(state.clients.values())
        return cls(
            state.bus.stats(),
            sorted(state.requests.items()),
            state.published,
            len(clients),
            state.delivered_closed + sum(c.delivered for c in clients),
            state.dropped_closed + sum(c.dropped for c in clients),
            state.malformed_frames,
        )


class _Collector:
    __slots__ = ("state",)

    def __init__(self, state: _Snapshot) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        state = self.state
        stats = state.stats
        yield CounterMetricFamily(
            "pantheon_bus_published", "Messages published on the bus.", value=stats.published
        )
        topics = CounterMetricFamily(
            "pantheon_bus_topic_published", "Messages published, by topic.", labels=["topic"]
        )
        counts = [(topic, t.published) for topic, t in stats.topics.items()]
        if len(counts) > MAX_TOPIC_LABELS:
            kept = heapq.nlargest(MAX_TOPIC_LABELS, counts, key=itemgetter(1))
            rest = stats.published - sum(n for _, n in kept)
            counts = [*kept, (OTHER_TOPICS, rest)]
        for topic, n in counts:
            topics.add_metric([topic], n)
        yield topics
        per_sub = {
            "delivered": "Messages handled successfully.",
            "dead_lettered": "Messages sent to the dead letter queue.",
            "shed": "Messages shed from a full mailbox.",
            "rejected": "Messages a full mailbox refused.",
            "failures": "Handler failures (each attempt).",
            "retries": "Handler retries.",
        }
        families = {
            key: CounterMetricFamily(f"pantheon_bus_subscriber_{key}", help_, labels=["subscriber"])
            for key, help_ in per_sub.items()
        }
        queued = GaugeMetricFamily(
            "pantheon_bus_subscriber_queued",
            "Messages waiting in a mailbox.",
            labels=["subscriber"],
        )
        breaker = GaugeMetricFamily(
            "pantheon_bus_breaker_state",
            "1 for the breaker's current state.",
            labels=["subscriber", "state"],
        )
        for name, sub in stats.subscribers.items():
            for key, family in families.items():
                family.add_metric([name], getattr(sub, key))
            queued.add_metric([name], sub.queued)
            for st in _BREAKER_STATES:
                breaker.add_metric([name, st], 1.0 if sub.breaker == st else 0.0)
        yield from families.values()
        yield queued
        yield breaker
        yield GaugeMetricFamily("pantheon_bus_dlq_size", "Dead letters held.", value=stats.dlq_size)
        yield CounterMetricFamily(
            "pantheon_bus_dlq_evicted", "Dead letters evicted (DLQ full).", value=stats.dlq_evicted
        )
        requests = CounterMetricFamily(
            "pantheon_gateway_requests", "HTTP and WebSocket requests.", labels=["route", "status"]
        )
        for (route, status), n in state.requests:
            requests.add_metric([route, str(status)], n)
        yield requests
        yield CounterMetricFamily(
            "pantheon_gateway_published",
            "Messages the gateway published on the bus.",
            value=state.published,
        )
        yield GaugeMetricFamily(
            "pantheon_gateway_clients", "Connected WebSocket and SSE clients.", value=state.clients
        )
        yield CounterMetricFamily(
            "pantheon_gateway_delivered",
            "Messages sent to WebSocket and SSE clients.",
            value=state.delivered,
        )
        yield CounterMetricFamily(
            "pantheon_gateway_dropped",
            "Messages dropped for clients that read too slowly.",
            value=state.dropped,
        )
        yield CounterMetricFamily(
            "pantheon_gateway_malformed_frames",
            "Frames subscribers sent, which the gateway ignores.",
            value=state.malformed_frames,
        )


async def render_metrics(state: GatewayState) -> tuple[bytes, str]:
    """The exposition text and its content type: a slow one again while it is fresh. The
    counters are read on the loop; the text is made in a thread."""
    now = time.perf_counter()
    cached = state.metrics_cache
    if cached is not None and now < cached[0]:
        return cached[1], CONTENT_TYPE_LATEST
    # The snapshot allocates an object per topic; with tens of thousands of topics the
    # collections those allocations trigger (each one walking the whole heap) cost more
    # than the snapshot itself, all of it on the loop. Nothing here makes cycles.
    collecting = gc.isenabled()
    gc.disable()
    cpu = time.thread_time()
    try:
        collector = _Collector(_Snapshot.of(state))
    finally:
        if collecting:
            gc.enable()
    cpu = time.thread_time() - cpu
    body, rendering = await asyncio.to_thread(_generate, collector)
    # What the rendering cost in CPU (both threads), not how long it took: on a machine
    # short of cores a cheap one waits for a core, and caching it would say nothing about it.
    took = cpu + rendering
    state.metrics_cache = (now + took * (DUTY + 1), body) if took > CACHE_AFTER else None
    return body, CONTENT_TYPE_LATEST


def _generate(collector: _Collector) -> tuple[bytes, float]:
    """The exposition text, and the CPU time this thread spent making it."""
    cpu = time.thread_time()
    body = generate_latest(collector)
    return body, time.thread_time() - cpu
