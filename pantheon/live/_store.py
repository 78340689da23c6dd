"""The snapshot of a finished (or running) session, from the session store's read model."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from pantheon import readmodel
from pantheon.live._parts import merge_breakers
from pantheon.live._snapshot import (
    MAX_TALLIED,
    BreakerState,
    Check,
    HopBar,
    HopLatency,
    OutcomeTally,
    Series,
    Snapshot,
    Totals,
    Trace,
)
from pantheon.runner import expectation_state
from pantheon.sessions import SessionStore

__all__ = ["DEFAULT_BUCKETS", "snapshot_from_store", "trace_from_store"]

#: A finished session's throughput is cut into about this many buckets (never finer than
#: the read model's 0.1 s), so a sparkline shows the whole run at any length.
DEFAULT_BUCKETS = 120


def snapshot_from_store(
    store: SessionStore, session_id: str, *, bucket_s: float | None = None
) -> Snapshot:
    """The same :class:`Snapshot` a live feed publishes, built from the read model: exact
    latency quantiles, every dead letter and breaker transition, and every request as a
    :class:`Trace` without its hops (ask :func:`trace_from_store` for one waterfall: each
    costs a pass over the session), and the model usage without its calls.
    ``session_id`` may be a unique prefix."""
    info = store.session(session_id)
    sid = info.id
    requests = readmodel.requests(store, sid)
    t_s = max((r.start_ms + r.total_ms for r in requests), default=0.0) / 1000
    if bucket_s is None:
        bucket_s = max(0.1, round(t_s / DEFAULT_BUCKETS, 3))
    letters = readmodel.dead_letters(store, sid)
    last_stats: dict[str, Any] = {}
    metrics = store.metrics(sid)
    if metrics:
        last_stats = metrics[-1].stats
    subs: dict[str, Any] = last_stats.get("subscribers") or {}
    latency = readmodel.hop_latency(store, sid)
    delivered = failed = 0
    for d in store.deliveries(sid):
        if d.outcome == "delivered":
            delivered += 1
        else:
            failed += 1
    totals = Totals(
        published=store.envelope_counts().get(sid, 0),
        delivered=delivered,
        dead_lettered=sum(1 for d in letters if d.reason != "shed"),
        shed=sum(1 for d in letters if d.reason == "shed"),
        rejected=sum(int(s.get("rejected", 0)) for s in subs.values()),
        failures=sum(int(s.get("failures", 0)) for s in subs.values()) or failed,
        retries=sum(int(s.get("retries", 0)) for s in subs.values()),
        queued=sum(int(s.get("queued", 0)) for s in subs.values()),
        in_flight=sum(int(s.get("in_flight", 0)) for s in subs.values()),
        dlq_size=len(letters),
    )
    nodes = readmodel.nodes(store, sid)
    events = readmodel.breaker_timeline(store, sid)
    if nodes:  # the recording process's own transitions are the driver's
        events = [msgspec.structs.replace(e, node=e.node or readmodel.DRIVER) for e in events]
    return Snapshot(
        session_id=sid,
        scenario=info.scenario,
        status=info.status,
        live=False,
        seq=0,
        t_s=t_s,
        totals=totals,
        series=_series(readmodel.throughput(store, sid, bucket_s=bucket_s), bucket_s),
        hops=tuple(_hop_latency(h) for h in latency),
        # The stored metrics are the recording process's: the driver's, if it had nodes.
        breakers=_breakers(last_stats, events, readmodel.DRIVER if nodes else None),
        breaker_events=tuple(events),
        dead_letters=tuple(letters),
        traces=tuple(
            Trace(r.correlation_id, r.topic, r.label, r.start_ms, r.total_ms, r.hops, r.outcome)
            for r in requests
        ),
        usage=(used := readmodel.usage(store, sid, calls=False)),
        budget=readmodel.budget(store, sid, used),
        # Read once the session has ended: a running one is polled every second, and
        # reading its outcomes means decoding every envelope it has so far.
        outcomes=OutcomeTally() if info.status == "running" else _tally(store, sid),
        checks=_checks(info.summary.get("expectations")),
        unjudged=readmodel.unjudged(info),
        nodes=tuple(n.text for n in nodes),
    )


def _tally(store: SessionStore, sid: str) -> OutcomeTally:
    """What the recorded team decided, read as ``pantheon diff`` reads it."""
    from collections import Counter

    from agents import decision_text
    from pantheon.rerun import session_outcomes

    out = session_outcomes(store, sid)
    score = out.score
    counts = Counter(decision_text(d, out.spec.fields) for d in out.decisions.values())
    return OutcomeTally(
        noun=out.spec.noun,
        decided=score.decided,
        scored=score.scored,
        right=score.correct,
        counts=tuple(counts.most_common(MAX_TALLIED)),
    )


def _checks(expectations: Any) -> tuple[Check, ...]:
    """The summary's expectations as :class:`Check` values; a summary recorded before
    checks had a ``state`` reads it from ``passed``."""
    if not isinstance(expectations, list):
        return ()
    return tuple(
        Check(
            name=str(e.get("name")),
            state=expectation_state(e),
            expected=_json(e.get("expected")),
            actual=_json(e.get("actual")),
            why=None if e.get("why") is None else str(e["why"]),
        )
        for e in expectations
        if isinstance(e, dict)
    )


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=repr)


def trace_from_store(
    store: SessionStore, session_id: str, correlation_id: int
) -> tuple[HopBar, ...]:
    """One request's waterfall (:func:`pantheon.readmodel.waterfall`), as a snapshot's."""
    return tuple(readmodel.waterfall(store, session_id, correlation_id))


def _hop_latency(h: readmodel.HopLatency) -> HopLatency:
    return HopLatency(
        h.kind, h.name, h.count,
        h.wait_p50_ms, h.wait_p95_ms, h.wait_p99_ms,
        h.handle_p50_ms, h.handle_p95_ms, h.handle_p99_ms,
    )  # fmt: skip


def _series(points: list[readmodel.ThroughputPoint], bucket_s: float) -> tuple[Series, ...]:
    grouped: dict[tuple[str, str], list[readmodel.ThroughputPoint]] = {}
    for p in points:
        grouped.setdefault((p.kind, p.key), []).append(p)
    out = []
    for (kind, key), pts in grouped.items():
        counts = tuple(p.count for p in pts)
        out.append(Series(kind, key, bucket_s, pts[0].t_s, counts, sum(counts)))  # type: ignore[arg-type]
    return tuple(out)


def _breakers(
    stats: dict[str, Any], events: list[readmodel.BreakerEvent], here: str | None
) -> tuple[BreakerState, ...]:
    """Every breaker the recording process (``here``) had at its last metrics snapshot,
    with trips and last reason, and every breaker of any process its transitions mention:
    one per (name, process), its state its last transition's, then merged by name as the
    live feed merges its nodes' (the worst state, trips added, the nodes in that state)."""
    subs: dict[str, Any] = stats.get("subscribers") or {}
    rows: dict[tuple[str, str | None], list[Any]] = {}  # -> [state, trips, reason]
    for name, state in (stats.get("breakers") or {}).items():
        trips = int(subs[name].get("breaker_trips", 0)) if name in subs else 0
        rows[(name, here)] = [state, trips, None]
    opened: dict[tuple[str, str | None], int] = {}
    for e in events:
        key = (e.name, e.node or here)
        row = rows.setdefault(key, [e.new, 0, None])
        row[0], row[2] = e.new, e.reason
        if e.new == "open":
            opened[key] = opened.get(key, 0) + 1
    return merge_breakers(
        BreakerState(name, state, max(trips, opened.get((name, node), 0)), None, reason, node)
        for (name, node), (state, trips, reason) in rows.items()
    )
