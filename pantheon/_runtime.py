"""Runs a scenario: builds the team, wires it to a bus, feeds the input, judges the outcome."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents import (
    ROLES,
    Actor,
    Agent,
    AgentOptions,
    Fault,
    Guardian,
    Learner,
    LiveEffects,
    ModelProvider,
    Monitor,
    Observer,
    OpenAIProvider,
    Outbox,
    RuleProvider,
    read_emails,
)
from bus import Bus, BusError, Priority
from pantheon.scenario import Scenario

__all__ = [
    "RunSummary",
    "Team",
    "build_team",
    "local_report",
    "run_scenario",
    "summarize",
    "team_setup",
]

Setup = Callable[[Bus], Awaitable[None]]
#: Dead letters listed by name in a summary; the session store has all of them.
MAX_LISTED_DEAD_LETTERS = 100


@dataclass
class Team:
    """The agents of one run, with handles on the ones whose results the summary reads."""

    agents: dict[str, Agent]
    outbox: Outbox
    #: The model provider every agent of the team shares; closed by :meth:`aclose`.
    provider: ModelProvider | None = None

    def of_role(self, cls: type[Agent]) -> list[Any]:
        return [a for a in self.agents.values() if isinstance(a, cls)]

    async def attach(self, bus: Bus) -> None:
        for agent in self.agents.values():
            await agent.attach(bus)

    async def start(self) -> None:
        for agent in self.agents.values():
            await agent.start()

    async def stop(self) -> None:
        for agent in self.agents.values():
            await agent.stop()

    async def aclose(self) -> None:
        """Release the provider's connections: after the last drain, since a message still
        queued for the Reasoner would otherwise find its provider closed."""
        if self.provider is not None:
            await self.provider.aclose()

    def usage(self) -> dict[str, Any]:
        """The team's model calls, tokens and cost, summed over its agents."""
        usages = [a.usage for a in self.agents.values()]
        return {
            "calls": sum(u.calls for u in usages),
            "input_tokens": sum(u.input_tokens for u in usages),
            "output_tokens": sum(u.output_tokens for u in usages),
            "cost_usd": sum(u.cost_usd for u in usages),
            "priced": all(u.priced for u in usages),
        }


def _provider(scenario: Scenario) -> ModelProvider:
    p = scenario.provider
    if p.kind == "openai":
        key = os.environ.get(p.api_key_env) if p.api_key_env else None
        return OpenAIProvider(p.base_url, p.model, key, p.timeout)
    return RuleProvider(p.rules, p.default_intent)


def _labels(path: Path | None) -> dict[str, dict[str, Any]]:
    if path is None or not path.exists():
        return {}
    return {
        str(r["id"]): r["expected"]
        for r in read_emails(path)
        if isinstance(r.get("id"), str) and isinstance(r.get("expected"), dict)
    }


def build_team(
    scenario: Scenario,
    *,
    replay: bool = False,
    outbox_path: Path | None = None,
    seed: int | None = None,
) -> Team:
    """The scenario's agents, configured. ``replay`` leaves out everything that creates
    outside input (the Observer's ingest, the Monitor's sampling): a replay re-publishes
    those from the recording instead."""
    inp = scenario.input
    path = inp.path if inp.kind == "file" else None
    provider = _provider(scenario)
    outbox = Outbox(outbox_path)
    names = list(scenario.agents) + [r for r in ROLES if r not in scenario.agents]
    agents: dict[str, Agent] = {}
    for name in names:
        cfg = scenario.agent(name)
        if not cfg.enabled:
            continue
        role = getattr(cfg, "role", None) or name
        cls = ROLES[role]
        options = AgentOptions(
            concurrency=cfg.concurrency,
            max_queue=cfg.max_queue,
            overflow=cfg.overflow,
            block_timeout=cfg.block_timeout,
            retry=cfg.retry.to_policy(),
            breaker=cfg.breaker.to_policy() if cfg.breaker is not None else None,
        )
        f = scenario.faults.agents.get(name)
        fault = Fault(f.failure_rate, f.latency_ms, f.tool) if f is not None else None
        settings = dict(cfg.settings)
        kwargs: dict[str, Any] = {}
        if cls is Observer and not replay:
            settings.update(path=str(path) if path else None, count=inp.count)
            settings.update(duration=inp.duration, rate=inp.rate)
        elif cls is Guardian:
            settings.update(scenario.policy.model_dump())
        elif cls is Learner:
            kwargs["labels"] = _labels(path)
        elif cls is Actor:
            kwargs["outbox"] = outbox
        elif cls is Monitor:
            kwargs["sample"] = not replay
        agents[name] = cls(
            name,
            settings=settings,
            options=options,
            fault=fault,
            seed=scenario.seed if seed is None else seed,
            provider=provider,
            **kwargs,
        )
    return Team(agents, outbox, provider)


def team_setup(scenario_text: str, *, base_dir: Path | None = None, replay: bool = True) -> Setup:
    """A ``setup(bus)`` that attaches and starts the team of a recorded scenario, for replay
    and redrive (``pantheon.sessions`` calls it with a fresh bus). The input file need not
    exist any more: a replay takes its inputs from the recording."""
    from pantheon.scenario import parse_scenario

    scenario = parse_scenario(scenario_text, base_dir=base_dir, check_files=False)

    async def setup(bus: Bus) -> None:
        team = build_team(scenario, replay=replay)
        await team.attach(bus)
        await team.start()

    return setup


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
    priced, summed over the team (see :class:`agents.AgentUsage`)."""

    @property
    def passed(self) -> bool:
        return all(e["passed"] for e in self.expectations)


async def _flood(bus: Bus, topic: str, rate: float, count: int, priority: int) -> int:
    """A runaway publisher: ``count`` copies of one message at ``rate``/s, ignoring refusals
    (a flooding agent does not care; the bus must)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    payload = {"id": "flood", "from": "flood@runaway.example", "subject": "flood", "body": "x"}
    sent = 0
    for n in range(count):
        delay = started + n / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            bus.emit_nowait(topic, dict(payload, id=f"flood-{n}"), priority)
            sent += 1
        except BusError:
            pass  # refusals are the point of a flood; the bus counted them
        if n % 256 == 0:
            await asyncio.sleep(0)
    return sent


async def run_scenario(
    scenario: Scenario,
    *,
    seed: int | None = None,
    outbox_dir: Path | None = None,
    on_progress: Callable[[int, int | None], None] | None = None,
    bus: Bus | None = None,
    attach: Callable[[Bus], Awaitable[Any]] | None = None,
    drain_timeout: float = 60.0,
) -> RunSummary:
    """Run the scenario to completion and judge its expectations.

    ``attach(bus)`` runs after the team is wired and before input flows (the session
    recorder hooks in there); ``on_progress(done, total)`` is called as inputs go out.

    A scenario with ``transport.kind: zmq`` runs as a broker and node processes
    (:func:`pantheon._cluster.run_cluster`); ``bus``, if given, must then be on its broker.
    """
    if scenario.transport.kind == "zmq":
        from pantheon._cluster import run_cluster

        return await run_cluster(
            scenario,
            seed=seed,
            outbox_dir=outbox_dir,
            on_progress=on_progress,
            bus=bus,
            attach=attach,
            drain_timeout=drain_timeout,
        )
    seed = scenario.seed if seed is None else seed
    bus = bus or Bus()
    if bus.context is None:
        bus.context = LiveEffects(seed)
    team = build_team(
        scenario,
        seed=seed,
        outbox_path=(outbox_dir / f"{bus.session_id or 'run'}.jsonl") if outbox_dir else None,
    )
    observers: list[Observer] = team.of_role(Observer)
    total = _count_inputs(scenario)
    started = time.perf_counter()
    async with contextlib.AsyncExitStack() as closing:
        closing.push_async_callback(team.aclose)  # last, once the bus is closed and quiet
        await closing.enter_async_context(bus)
        await team.attach(bus)
        if attach is not None:
            await attach(bus)
        await team.start()
        flood = scenario.faults.flood
        flood_task = None
        if flood is not None:
            flood_task = asyncio.get_running_loop().create_task(
                _flood(bus, flood.topic, flood.rate, flood.count, Priority[flood.priority.upper()])
            )
        while not all(o.done.is_set() for o in observers):
            if on_progress is not None:
                on_progress(sum(o.emitted + o.malformed for o in observers), total)
            await asyncio.sleep(0.05)
        if flood_task is not None:
            await flood_task
        await bus.drain(timeout=drain_timeout)
        await team.stop()
        await bus.drain(timeout=drain_timeout)
        elapsed = time.perf_counter() - started
        if on_progress is not None:
            on_progress(sum(o.emitted + o.malformed for o in observers), total)
        summary = summarize(
            scenario,
            [local_report(bus, team)],
            seed=seed,
            elapsed=elapsed,
            session_id=bus.session_id,
        )
    return summary


def _count_inputs(scenario: Scenario) -> int | None:
    inp = scenario.input
    if inp.kind != "file" or inp.path is None:
        return inp.count
    with Path(inp.path).open(encoding="utf-8", errors="replace") as f:
        n = sum(1 for line in f if line.strip())
    return min(n, inp.count) if inp.count else n


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
        usage={
            "calls": sum(r["usage"]["calls"] for r in reports),
            "input_tokens": sum(r["usage"]["input_tokens"] for r in reports),
            "output_tokens": sum(r["usage"]["output_tokens"] for r in reports),
            "cost_usd": sum(r["usage"]["cost_usd"] for r in reports),
            "priced": all(r["usage"]["priced"] for r in reports),
        },
    )
    summary.expectations = judge(scenario, summary)
    return summary


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
