"""The run report: what one bus contributes, the merged summary, and the verdict on the
scenario's expectations."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agents import Guardian, Learner, Monitor, Observer
from bus import Bus
from pantheon._team import Team, sum_usage
from pantheon.scenario import Scenario

__all__ = ["MAX_LISTED_DEAD_LETTERS", "RunSummary", "judge", "local_report", "summarize"]

#: Dead letters listed by name in a summary; the session store has all of them.
MAX_LISTED_DEAD_LETTERS = 100


@dataclass
class RunSummary:
    """What ``pantheon run`` prints (and ``--json`` emits)."""

    scenario: str
    session_id: str | None
    seed: int
    elapsed_s: float
    messages: int
    throughput: float
    inputs: int
    malformed: int
    hops: dict[str, dict[str, float]]
    edges: list[dict[str, Any]]
    dlq: dict[str, int]
    dead_letters: list[dict[str, Any]]
    breaker_trips: int
    accuracy: dict[str, Any]
    decisions: dict[str, int]
    outbox: dict[str, int]
    alerts: int
    accounting_ok: bool
    expectations: list[dict[str, Any]] = field(default_factory=list)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per process of a ZeroMQ run (``driver`` and each node): pid, agents, how it ended,
    clock offset and transport counters. Empty for an in-process run."""
    usage: dict[str, Any] = field(default_factory=dict)
    """Model calls, input and output tokens, cost in USD and whether every call was
    priced, summed over the team, and the same per agent under ``by_agent``."""

    @property
    def passed(self) -> bool:
        return all(e["passed"] for e in self.expectations)


def local_report(bus: Bus, team: Team) -> dict[str, Any]:
    """What one bus and the agents on it contribute to a run summary, as plain JSON data.

    An in-process run has one; a ZeroMQ run has one per process, which each node sends to
    the driver when it leaves (see :func:`summarize`)."""
    stats = bus.stats()
    subscribers = {}
    accounting_ok = bus.outstanding == 0
    for name, s in stats.subscribers.items():
        subscribers[name] = {
            "handled": s.delivered + s.dead_lettered,
            "wait_p50_ms": s.queue_wait.p50_us / 1000,
            "wait_p95_ms": s.queue_wait.p95_us / 1000,
            "wait_p99_ms": s.queue_wait.p99_us / 1000,
            "handle_p50_ms": s.handling.p50_us / 1000,
            "handle_p95_ms": s.handling.p95_us / 1000,
            "handle_p99_ms": s.handling.p99_us / 1000,
            "breaker_trips": s.breaker_trips,
        }
        if s.published != s.delivered + s.dead_lettered + s.shed or s.rejected:
            accounting_ok = False
    entries = bus.dlq.entries()
    learners = team.of_role(Learner)
    decisions: Counter[str] = Counter()
    for g in team.of_role(Guardian):
        decisions.update(g.decisions)
    observers = team.of_role(Observer)
    return {
        "published": stats.published,
        "subscribers": subscribers,
        "edges": [
            {
                "source": e.source,
                "target": e.target,
                "count": e.queue_wait.count,
                "p50_ms": e.queue_wait.p50_us / 1000,
                "p99_ms": e.queue_wait.p99_us / 1000,
            }
            for e in stats.edges
        ],
        "dlq": dict(Counter(e.reason for e in entries)),
        "dead_letters": [
            {
                "subscriber": e.subscriber,
                "topic": e.envelope.topic,
                "email_id": e.envelope.payload.get("email_id")
                if isinstance(e.envelope.payload, dict)
                else None,
                "reason": e.reason,
                "error": e.error,
            }
            for e in entries
            if e.reason != "shed"
        ][:MAX_LISTED_DEAD_LETTERS],
        "accounting_ok": accounting_ok,
        "inputs": sum(o.emitted for o in observers),
        "malformed": sum(o.malformed for o in observers),
        "accuracy": learners[0].report() if learners else None,
        "decisions": dict(decisions),
        "outbox": dict(team.outbox.counts),
        "alerts": sum(len(m.alerts) for m in team.of_role(Monitor)),
        "usage": team.usage(),
    }


def summarize(
    scenario: Scenario,
    reports: list[dict[str, Any]],
    *,
    seed: int,
    elapsed: float,
    session_id: str | None,
    messages: int | None = None,
) -> RunSummary:
    """Merge the :func:`local_report` of every process of a run and judge the result.

    A subscription present in several reports (competing consumers on several nodes) adds
    its counts; its latency quantiles are the worst of its members', an upper bound (the
    reports carry quantiles, not histograms). ``messages`` defaults to the sum of the
    reports' publish counts, right for one bus; a multi-process run passes its own count,
    since a message that crossed to another bus is counted by both."""
    hops: dict[str, dict[str, float]] = {}
    trips = 0
    for r in reports:
        for name, h in r["subscribers"].items():
            trips += h["breaker_trips"]
            row = {k: v for k, v in h.items() if k != "breaker_trips"}
            seen = hops.get(name)
            if seen is None:
                hops[name] = row
            else:
                for k, v in row.items():
                    seen[k] = seen[k] + v if k == "handled" else max(seen[k], v)
    dlq: Counter[str] = Counter()
    decisions: Counter[str] = Counter()
    outbox: Counter[str] = Counter()
    for r in reports:
        dlq.update(r["dlq"])
        decisions.update(r["decisions"])
        outbox.update(r["outbox"])
    accuracy: dict[str, Any] = next(
        (r["accuracy"] for r in reports if r["accuracy"] is not None), {}
    )
    if messages is None:
        messages = sum(r["published"] for r in reports)
    summary = RunSummary(
        scenario=scenario.name,
        session_id=session_id,
        seed=seed,
        elapsed_s=round(elapsed, 3),
        messages=messages,
        throughput=round(messages / elapsed, 1) if elapsed else 0.0,
        inputs=sum(r["inputs"] for r in reports),
        malformed=sum(r["malformed"] for r in reports),
        hops=hops,
        edges=[e for r in reports for e in r["edges"]],
        dlq=dict(dlq),
        dead_letters=[d for r in reports for d in r["dead_letters"]][:MAX_LISTED_DEAD_LETTERS],
        breaker_trips=trips,
        accuracy=accuracy,
        decisions=dict(decisions),
        outbox=dict(outbox),
        alerts=sum(r["alerts"] for r in reports),
        accounting_ok=all(r["accounting_ok"] for r in reports),
        usage=_merge_usage([r["usage"] for r in reports]),
    )
    summary.expectations = judge(scenario, summary)
    return summary


def _merge_usage(usages: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's usage from its processes': an agent on several nodes adds up."""
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for u in usages:
        for name, part in u.get("by_agent", {}).items():
            by_agent.setdefault(name, []).append(part)
    return {
        **sum_usage(usages),
        "by_agent": {name: sum_usage(parts) for name, parts in by_agent.items()},
    }


def judge(scenario: Scenario, s: RunSummary) -> list[dict[str, Any]]:
    """Each expectation of the scenario with the measured value and whether it held."""
    e = scenario.expect
    out: list[dict[str, Any]] = []

    def check(name: str, passed: bool, want: Any, got: Any) -> None:
        out.append({"name": name, "passed": bool(passed), "expected": want, "actual": got})

    if e.max_p99_ms is not None:
        limits = (
            e.max_p99_ms if isinstance(e.max_p99_ms, dict) else dict.fromkeys(s.hops, e.max_p99_ms)
        )
        for agent, limit in limits.items():
            # p99 of one hop, bounded above by p99(queue wait) + p99(handling).
            subs = [h for n, h in s.hops.items() if n == agent or n.startswith(f"{agent}:")]
            worst = max((h["wait_p99_ms"] + h["handle_p99_ms"] for h in subs), default=0.0)
            check(f"p99 {agent} <= {limit} ms", worst <= limit, limit, round(worst, 3))
    if e.zero_lost:
        check("zero lost", s.accounting_ok, True, s.accounting_ok)
    if e.max_dlq is not None:
        dead = sum(n for reason, n in s.dlq.items() if reason != "shed")
        check(f"dead letters <= {e.max_dlq}", dead <= e.max_dlq, e.max_dlq, dead)
    if e.min_accuracy is not None:
        acc = s.accuracy.get("action_accuracy")
        ok = acc is not None and acc >= e.min_accuracy
        check(f"accuracy >= {e.min_accuracy}", ok, e.min_accuracy, acc)
    if e.max_breaker_trips is not None:
        check(
            f"breaker trips <= {e.max_breaker_trips}",
            s.breaker_trips <= e.max_breaker_trips,
            e.max_breaker_trips,
            s.breaker_trips,
        )
    if e.min_throughput is not None:
        check(
            f"throughput >= {e.min_throughput} msg/s",
            s.throughput >= e.min_throughput,
            e.min_throughput,
            s.throughput,
        )
    return out
