"""Comparing two recorded sessions: where they first part ways, and how their hops' latency
moved."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pantheon.sessions._align import Lineage, compare_runs
from pantheon.sessions._errors import ReplayDivergence
from pantheon.sessions._store import SessionStore, StoredDelivery, StoredEnvelope

__all__ = ["LatencyDelta", "LatencyStats", "SessionDiff", "diff_sessions"]


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Nearest-rank percentiles of one latency series, in microseconds."""

    count: int
    p50_us: float
    p99_us: float

    @classmethod
    def of(cls, values_ns: list[int]) -> LatencyStats:
        if not values_ns:
            return cls(0, 0.0, 0.0)
        values = sorted(values_ns)
        return cls(len(values), _rank(values, 0.50) / 1000, _rank(values, 0.99) / 1000)

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "p50_us": self.p50_us, "p99_us": self.p99_us}


def _rank(values: list[int], q: float) -> float:
    i = max(0, min(len(values) - 1, int(-(-q * len(values) // 1)) - 1))
    return float(values[i])


@dataclass(frozen=True, slots=True)
class LatencyDelta:
    """One hop's latency in both sessions. ``scope`` is ``subscriber`` (``name`` is the
    subscription) or ``edge`` (``name`` is ``source -> subscriber``, ``<outside>`` for
    inputs); ``metric`` is ``queue_wait`` (publish to handler start) or ``handling``."""

    scope: str
    name: str
    metric: str
    a: LatencyStats
    b: LatencyStats

    @property
    def delta_p50_us(self) -> float:
        return self.b.p50_us - self.a.p50_us

    @property
    def delta_p99_us(self) -> float:
        return self.b.p99_us - self.a.p99_us

    def to_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "name": self.name,
            "metric": self.metric,
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "delta_p50_us": self.delta_p50_us,
            "delta_p99_us": self.delta_p99_us,
        }


@dataclass(frozen=True, slots=True)
class SessionDiff:
    """``b`` aligned hop by hop onto ``a`` (the same alignment a replay uses).

    ``divergence`` is the first place they differ (a :class:`ReplayDivergence` whose
    ``original_id`` is in ``a`` and ``replay_id`` in ``b``; ``diff`` has a readable payload
    diff), ``hops_compared`` the aligned message pairs, ``latency`` per-hop p50/p99 of both."""

    a: str
    b: str
    hops_compared: int
    messages_a: int
    messages_b: int
    divergence: ReplayDivergence | None
    latency: list[LatencyDelta] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.divergence is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "identical": self.identical,
            "hops_compared": self.hops_compared,
            "messages_a": self.messages_a,
            "messages_b": self.messages_b,
            "divergence": None if self.divergence is None else self.divergence.to_dict(),
            "latency": [d.to_dict() for d in self.latency],
        }


def _series(
    envelopes: Iterable[StoredEnvelope], deliveries: Iterable[StoredDelivery]
) -> dict[tuple[str, str, str], list[int]]:
    source = {e.id: e.source for e in envelopes}
    out: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for d in deliveries:
        edge = f"{source.get(d.envelope_id) or '<outside>'} -> {d.subscriber}"
        wait, handling = d.queue_wait_ns, d.handling_ns
        out[("subscriber", d.subscriber, "queue_wait")].append(wait)
        out[("subscriber", d.subscriber, "handling")].append(handling)
        out[("edge", edge, "queue_wait")].append(wait)
        out[("edge", edge, "handling")].append(handling)
    return out


def diff_sessions(store: SessionStore, a: str, b: str) -> SessionDiff:
    """Compare session ``b`` with session ``a`` (ids or unique prefixes)."""
    sa, sb = store.session(a), store.session(b)
    env_a, env_b = store.envelopes(sa.id), store.envelopes(sb.id)
    del_a, del_b = store.deliveries(sa.id), store.deliveries(sb.id)
    eff_a, eff_b = store.effects(sa.id), store.effects(sb.id)
    lineage = Lineage(env_a, eff_a)
    comparison = compare_runs(
        lineage,
        env_b,
        original_deliveries=del_a,
        new_deliveries=del_b,
        original_effects=eff_a,
        new_effects=eff_b,
    )
    lat_a, lat_b = _series(env_a, del_a), _series(env_b, del_b)
    latency = [
        LatencyDelta(
            scope,
            name,
            metric,
            LatencyStats.of(lat_a.get(key, [])),
            LatencyStats.of(lat_b.get(key, [])),
        )
        for key in sorted(set(lat_a) | set(lat_b))
        for scope, name, metric in (key,)
    ]
    return SessionDiff(
        a=sa.id,
        b=sb.id,
        hops_compared=len(comparison.pairs),
        messages_a=len(lineage.envelopes),
        messages_b=len(Lineage(env_b, eff_b).envelopes),
        divergence=comparison.divergence,
        latency=latency,
    )
