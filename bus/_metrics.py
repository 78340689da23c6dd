"""Counters and latency histograms the bus keeps for itself, and the frozen snapshot of them.

Histograms are log-linear over nanoseconds: exact below 16 ns, then 8 buckets per power of two
(at most 12.5% relative error on any quantile), fixed at 512 integer slots so recording is a
couple of integer operations and never allocates. The bus inlines :func:`bucket` in its worker
loop; everything else here runs only when someone asks for a snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from bus._sched import SchedulingStats

if TYPE_CHECKING:
    from bus._dlq import DeadLetterQueue
    from bus._subscription import Subscription

__all__ = [
    "BusStats",
    "EdgeStats",
    "Histogram",
    "LatencySummary",
    "SubscriberStats",
    "TopicStats",
    "bucket",
    "bus_stats",
]

_SLOTS = 512


def bucket(ns: int) -> int:
    """The histogram slot for a duration in nanoseconds."""
    if ns < 16:
        return ns if ns > 0 else 0
    shift = ns.bit_length() - 4
    return min((shift << 3) + (ns >> shift), _SLOTS - 1)


def _lower_bound(slot: int) -> int:
    if slot < 16:
        return slot
    shift = (slot >> 3) - 1
    return (8 | (slot & 7)) << shift


class Histogram:
    """A fixed-size latency histogram. ``counts`` is public so hot loops can bump it inline."""

    __slots__ = ("counts", "max", "total")

    def __init__(self) -> None:
        self.counts = [0] * _SLOTS
        self.total = 0
        self.max = 0

    def record(self, ns: int) -> None:
        self.counts[bucket(ns)] += 1
        self.total += ns
        if ns > self.max:
            self.max = ns

    def merge(self, other: Histogram) -> None:
        counts = self.counts
        for i, c in enumerate(other.counts):
            if c:
                counts[i] += c
        self.total += other.total
        self.max = max(self.max, other.max)

    @property
    def count(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile in nanoseconds (the midpoint of its bucket, capped at the max)."""
        n = self.count
        if n == 0:
            return 0.0
        rank = q * n
        seen = 0
        for slot, c in enumerate(self.counts):
            seen += c
            if seen >= rank and c:
                low = _lower_bound(slot)
                high = _lower_bound(slot + 1)
                return float(min((low + high) / 2, self.max))
        return float(self.max)

    def summary(self) -> LatencySummary:
        n = self.count
        return LatencySummary(
            count=n,
            mean_us=(self.total / n / 1000) if n else 0.0,
            p50_us=self.quantile(0.50) / 1000,
            p95_us=self.quantile(0.95) / 1000,
            p99_us=self.quantile(0.99) / 1000,
            p999_us=self.quantile(0.999) / 1000,
            max_us=self.max / 1000,
        )


@dataclass(frozen=True, slots=True)
class LatencySummary:
    count: int
    mean_us: float
    p50_us: float
    p95_us: float
    p99_us: float
    p999_us: float
    max_us: float


@dataclass(frozen=True, slots=True)
class TopicStats:
    published: int


@dataclass(frozen=True, slots=True)
class EdgeStats:
    """Latency of one hop: from the ``source`` subscription's emit to ``target`` starting it."""

    source: str
    target: str
    queue_wait: LatencySummary


@dataclass(frozen=True, slots=True)
class SubscriberStats:
    """One subscription's accounting. Once drained, ``published == delivered + dead_lettered +
    shed + released``; ``queued + in_flight`` covers the difference while it runs.
    ``released`` counts messages from other buses this one gave back unhandled when it
    closed, for another member of their group: they are settled elsewhere, not here."""

    pattern: str
    published: int
    delivered: int
    dead_lettered: int
    shed: int
    released: int
    rejected: int
    filtered: int
    failures: int
    retries: int
    queued: int
    in_flight: int
    max_queue: int
    breaker: str
    breaker_trips: int
    queue_wait: LatencySummary
    handling: LatencySummary
    handling_cpu: LatencySummary
    """CPU time of the loop thread during a handling (``time.thread_time``), sampled more
    sparsely than ``handling`` (the clock is a system call). A handler's own work plus
    whatever ran on the loop while it awaited: an upper bound on its own, which the timing
    checks use to tell slow code from a busy machine."""
    handling_own: LatencySummary
    """A handling's wall time less the loop thread's run-queue wait during it (sampled with
    ``handling_cpu``; Linux only, empty elsewhere): its CPU time plus whatever it blocked on
    or awaited, what it would take had no other process wanted the CPU. The machine's
    starvation explains the rest of ``handling`` and nothing more (the timing checks)."""


@dataclass(frozen=True, slots=True)
class BusStats:
    """Everything the bus counted, read at one instant. ``scheduling`` is how long the loop
    thread waited for a CPU since the bus started (``None`` before it starts)."""

    published: int
    topics: dict[str, TopicStats]
    subscribers: dict[str, SubscriberStats]
    edges: list[EdgeStats]
    dlq_size: int
    dlq_evicted: int
    breakers: dict[str, str] = field(default_factory=dict)
    scheduling: SchedulingStats | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bus_stats(
    topics: dict[str, int],
    subs: Mapping[str, Subscription],
    dlq: DeadLetterQueue,
    breakers: dict[str, str],
    scheduling: SchedulingStats | None = None,
) -> BusStats:
    """A bus's :class:`BusStats` from its parts, read at one instant (``Bus.stats``)."""
    edges = [
        EdgeStats(source=src or "<outside>", target=sub.name, queue_wait=h.summary())
        for sub in subs.values()
        for src, h in sub.edges.items()
    ]
    return BusStats(
        published=sum(topics.values()),
        topics={t: TopicStats(published=n) for t, n in topics.items()},
        subscribers={name: sub.stats() for name, sub in subs.items()},
        edges=edges,
        dlq_size=len(dlq),
        dlq_evicted=dlq.evicted,
        breakers=breakers,
        scheduling=scheduling,
    )
