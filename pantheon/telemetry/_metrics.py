"""The bus's own counters and histograms, exported as OTel observable instruments.

Nothing is recorded per message: the bus already counts everything (``bus.stats()``), so
each instrument is asynchronous and its callback reads those counters when a reader
collects. One collection reads one :class:`~bus.BusStats` snapshot per bus, shared by every
instrument, so the numbers of one export agree with each other.

OTel's Python API has no asynchronous histogram, and re-recording the bus's histograms
into a synchronous one would be the per-message cost this avoids. Hop latencies are
therefore exported as gauges of the bus histogram's quantiles (attribute ``quantile``: 0.5,
0.95, 0.99, and 1.0 for the maximum), in seconds, like a Prometheus summary.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from bus import Bus, BusStats, LatencySummary, SubscriberStats

__all__ = ["BREAKER_STATES", "BusMetrics"]

#: ``pantheon.breaker.state`` values.
BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}

#: Counters kept per subscription: instrument name suffix, SubscriberStats field, help.
_SUBSCRIBER_COUNTERS = (
    ("accepted", "published", "Messages accepted into the subscription's mailbox."),
    ("delivered", "delivered", "Messages its handler finished without error."),
    ("failed", "failures", "Handler failures, each retry counted."),
    ("retried", "retries", "Retries of failed handlings."),
    ("dead_lettered", "dead_lettered", "Messages sent to the dead letter queue."),
    ("shed", "shed", "Messages dropped (and listed in the DLQ) by the shed overflow policy."),
    ("rejected", "rejected", "Publishes refused because the mailbox was full."),
    ("filtered", "filtered", "Messages the subscription's filter or sampling declined."),
)
_QUANTILES = ((0.5, "p50_us"), (0.95, "p95_us"), (0.99, "p99_us"), (1.0, "max_us"))


class BusMetrics:
    """Observable instruments over every bus passed to :meth:`add`, on one meter.

    Buses are held weakly: a bus that is gone stops reporting.
    """

    def __init__(self, meter: Meter) -> None:
        self._buses: list[weakref.ref[Bus]] = []
        self._snapshot: list[tuple[dict[str, str], BusStats]] = []
        self._seen: set[str] = set()
        counter, gauge = meter.create_observable_counter, meter.create_observable_gauge
        counter(
            "pantheon.messages.published",
            [self._observer("published", self._published)],
            unit="{message}",
            description="Messages published, by topic.",
        )
        for suffix, field, help_ in _SUBSCRIBER_COUNTERS:
            counter(
                f"pantheon.messages.{suffix}",
                [self._observer(suffix, self._subscriber_field(field))],
                unit="{message}",
                description=help_ + " By subscription.",
            )
        gauge(
            "pantheon.queue.depth",
            [self._observer("depth", self._subscriber_field("queued"))],
            unit="{message}",
            description="Messages waiting in the subscription's mailbox.",
        )
        gauge(
            "pantheon.messages.in_flight",
            [self._observer("in_flight", self._subscriber_field("in_flight"))],
            unit="{message}",
            description="Messages its handlers are working on.",
        )
        gauge(
            "pantheon.breaker.state",
            [self._observer("breaker", self._breakers)],
            description="Circuit breaker state: 0 closed, 1 half open, 2 open.",
        )
        counter(
            "pantheon.breaker.trips",
            [self._observer("trips", self._subscriber_field("breaker_trips"))],
            unit="{trip}",
            description="Times the subscription's breaker opened.",
        )
        gauge(
            "pantheon.dlq.size",
            [self._observer("dlq", self._dlq)],
            unit="{message}",
            description="Entries in the dead letter queue.",
        )
        gauge(
            "pantheon.hop.queue_wait",
            [self._observer("queue_wait", self._queue_wait)],
            unit="s",
            description="Queue wait per hop (emitting subscription -> subscription), "
            "quantiles of the bus's histogram.",
        )
        gauge(
            "pantheon.hop.handling",
            [self._observer("handling", self._handling)],
            unit="s",
            description="Handling time per subscription, quantiles of the bus's histogram.",
        )

    def add(self, bus: Bus) -> None:
        """Report ``bus`` from the next collection on."""
        self._buses.append(weakref.ref(bus))

    # -- collection ------------------------------------------------------------------------

    def _stats(self, name: str) -> list[tuple[dict[str, str], BusStats]]:
        # The SDK calls every callback once per collection. A callback seen again means a new
        # collection began: take one fresh snapshot then, shared by all the instruments.
        if name in self._seen or not self._seen:
            self._seen.clear()
            self._buses = [ref for ref in self._buses if ref() is not None]
            snapshot = []
            for ref in self._buses:
                bus = ref()
                if bus is not None:
                    base = {"session": bus.session_id} if bus.session_id else {}
                    snapshot.append((base, bus.stats()))
            self._snapshot = snapshot
        self._seen.add(name)
        return self._snapshot

    def _observer(
        self,
        name: str,
        observe: Callable[[dict[str, str], BusStats], Iterable[Observation]],
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [obs for base, stats in self._stats(name) for obs in observe(base, stats)]

        return callback

    @staticmethod
    def _published(base: dict[str, str], stats: BusStats) -> Iterable[Observation]:
        for topic, t in stats.topics.items():
            yield Observation(t.published, {**base, "topic": topic})

    @staticmethod
    def _subscriber_field(
        field: str,
    ) -> Callable[[dict[str, str], BusStats], Iterable[Observation]]:
        def observe(base: dict[str, str], stats: BusStats) -> Iterable[Observation]:
            for name, s in stats.subscribers.items():
                yield Observation(getattr(s, field), {**base, "subscription": name})

        return observe

    @staticmethod
    def _breakers(base: dict[str, str], stats: BusStats) -> Iterable[Observation]:
        for name, state in stats.breakers.items():
            yield Observation(BREAKER_STATES.get(state, -1), {**base, "breaker": name})

    @staticmethod
    def _dlq(base: dict[str, str], stats: BusStats) -> Iterable[Observation]:
        yield Observation(stats.dlq_size, base)

    @staticmethod
    def _quantiles(summary: LatencySummary, attrs: dict[str, Any]) -> Iterable[Observation]:
        if not summary.count:
            return
        for q, field in _QUANTILES:
            yield Observation(getattr(summary, field) / 1e6, {**attrs, "quantile": q})

    @classmethod
    def _queue_wait(cls, base: dict[str, str], stats: BusStats) -> Iterable[Observation]:
        for edge in stats.edges:
            attrs = {**base, "subscription": edge.target, "source": edge.source}
            yield from cls._quantiles(edge.queue_wait, attrs)

    @classmethod
    def _handling(cls, base: dict[str, str], stats: BusStats) -> Iterable[Observation]:
        subs: dict[str, SubscriberStats] = stats.subscribers
        for name, s in subs.items():
            yield from cls._quantiles(s.handling, {**base, "subscription": name})
