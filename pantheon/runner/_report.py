"""The run report: what one bus contributes, the merged summary, and the verdict on the
scenario's expectations."""

from __future__ import annotations

import math
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents import Guardian, Learner, Monitor, Observer, OutcomeScore
from bus import Bus, DeadLetterRecord, Envelope, Receipt, SchedulingStats, matches
from pantheon._imports import ImportProblem, import_path
from pantheon.runner._build import Team, sum_usage
from pantheon.scenario import Scenario

__all__ = [
    "MAX_LISTED_DEAD_LETTERS",
    "MAX_TOPICS",
    "STARVED_SHARE",
    "RunSummary",
    "accuracy_bounds",
    "count_own_topics",
    "expectation_state",
    "judge",
    "local_report",
    "score_from_record",
    "summarize",
]

#: Dead letters listed by name in a summary; the session store has all of them.
MAX_LISTED_DEAD_LETTERS = 100
#: Distinct topics counted by :func:`count_own_topics`; later topics are summed under
#: ``<other>``, as the bus's own per-topic counts are.
MAX_TOPICS = 10_000
#: A timing check whose bound was exceeded is inconclusive rather than failed when the loop
#: thread waited at least this share of its busy time for a CPU (and the handlers' own time,
#: less their waits for a CPU, stayed within the bound): work then took at least 4/3 of what
#: it would on a free CPU. On a 2-core machine (benchmarks/RESULTS.md) other sessions' test
#: runs made it 30-50%, three busy loops beside them 80-92%; a machine running nothing else is
#: near 0.
STARVED_SHARE = 0.25


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
    """Dead letters per reason, every one each process's queue took (evicted or not, shed
    included). A process that ended without its report (:attr:`unverified`) counts what
    its journal had shipped, in a recorded run (:func:`score_from_record`)."""
    dead_letters: list[dict[str, Any]]
    """The first :data:`MAX_LISTED_DEAD_LETTERS` dead letters other than shed: the reporting
    processes' from their queues, then, in a recorded run, those a process that ended
    without its report had shipped."""
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
    budget: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per budget scope (``run``, ``agent:<name>``): tokens and cost spent, the limits,
    calls ``refused`` and whether the budget ``stopped`` calls; of a multi-process run, the
    driver's ledgers (the nodes' agents are charged to them, see ``pantheon.runner._budget_relay``).
    Empty without a ``budget:`` section."""
    rate_limit: dict[str, Any] = field(default_factory=dict)
    """The provider's rate limit (``requests_per_minute``, ``tokens_per_minute``,
    ``window_s``) and the team's model calls it ``admitted``, of which ``waited`` had to wait
    their turn; one limiter for the whole team, the driver's in a multi-process run. Empty
    without ``provider.rate_limit``."""
    topics: dict[str, int] = field(default_factory=dict)
    """Messages published per topic, each counted once however many processes it crossed.
    Of a recorded multi-process run, read from its session record (as ``messages``, their
    sum): what a killed node published and shipped before it died counts, as ``sessions
    show`` and ``export`` count it (:func:`score_from_record`)."""
    input_errors: list[str] = field(default_factory=list)
    """Why an Observer's input stopped early (a generator that raised); empty when every
    input ran to its end."""
    malformed_topic: str | None = None
    """Where the input's malformed records were published (``malformed`` counts them)."""
    dlq_evicted: int = 0
    """Dead letters counted in ``dlq`` but no longer in the buses' in-memory queues, which
    keep the newest 10,000 each by default (a recorded session has every one). A process
    that ended without its report took its queue with it: its dead letters counted from
    the record count here too."""
    unverified: dict[str, int | None] = field(default_factory=dict)
    """Per process that ended without its report (a node the scenario killed, or one that
    died by itself), how many messages it had settled for the others (None where the
    transport does not count it): it handled them, and whatever they caused inside it (a
    chain of agents on that node) died with its accounting, as did what it published
    itself (``topics``, ``messages`` and ``dlq`` still count what its journal had shipped,
    in a recorded run). ``accounting_ok`` covers the processes that reported; ``zero_lost``
    fails while this is not empty."""
    stream: dict[str, Any] = field(default_factory=dict)
    """Of a NATS run in which a node died (``killed``: the scenario's ``kill_node`` or not,
    the OOM killer, a SIGKILL from outside): which of its agents a live process took
    over (``taken_over``: agent -> processes), which had no live member
    (``no_live_member``), the items whose messages wait in the stream for those
    (``waiting``: agent -> item keys; ``items``; ``messages``), whether that list is whole
    (``complete``), items the killed node had handed to such an agent in its own memory
    (``handed_over``, a lower bound: see ``pantheon.runner._takeover``) and when the run went quiet
    (``quiet_at_s``). Items listed here are what ``pantheon resume`` of the session finishes
    (``pantheon.rerun.resume.left_in_stream``), unless the run's server was a throwaway one
    (``throwaway``: ``server: auto``), which took what the resume needs with it.
    Empty otherwise."""
    leftovers: dict[str, int] = field(default_factory=dict)
    """Of a NATS run: other sessions of the team whose consumer groups held unacknowledged
    messages, with nobody pulling, when this run started (session -> messages; an earlier
    run whose processes died). This run never saw them: each session's consumers filter its
    own subjects (``bus.backends.nats._subjects``); they stay for ``pantheon resume``.
    Empty when there were none."""
    scheduling: dict[str, Any] = field(default_factory=dict)
    """How long the event loop's thread waited for a CPU while it had work (``source``,
    ``wall_s``, ``cpu_s``, ``wait_s``, ``share``; see ``bus._sched``): of a multi-process
    run, the process that waited the largest share. Empty when nothing measured it."""
    interrupted: str | None = None
    """The signal (``SIGINT``, ``SIGTERM``) that stopped the input before its end: the
    run finished what was in flight, and its session is recorded ``aborted``, so
    ``pantheon resume`` finishes it. None for a run that read its input to the end."""

    @property
    def passed(self) -> bool:
        return all(e["passed"] for e in self.expectations)


class _OwnTopics:
    """A publish listener counting, per topic, the messages its bus publishes itself.

    A bus of a ZeroMQ run also counts every message it receives from another process, so
    summing the buses' own per-topic figures would count a message once per process it
    reached. An envelope from another bus carries the transport's :class:`Receipt` in
    ``reply`` by the time listeners see it; everything else was published here.
    """

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def on_publish(self, env: Envelope) -> None:
        if isinstance(env.reply, Receipt):
            return
        counts = self.counts
        topic = env.topic
        if topic in counts:
            counts[topic] += 1
        elif len(counts) < MAX_TOPICS:
            counts[topic] = 1
        else:
            counts["<other>"] = counts.get("<other>", 0) + 1


_own_topics: weakref.WeakKeyDictionary[Bus, _OwnTopics] = weakref.WeakKeyDictionary()


def count_own_topics(bus: Bus) -> dict[str, int]:
    """Count what ``bus`` publishes itself per topic, for :func:`local_report` and the live
    feed; returns the counts (kept up to date).

    Needed on every bus of a multi-process run, before anything is published; a bus alone
    in its process need not (its own per-topic counts are exact and free). Idempotent.
    """
    counter = _own_topics.get(bus)
    if counter is None:
        counter = _own_topics[bus] = _OwnTopics()
        bus.observe(counter)
    return counter.counts


def local_report(bus: Bus, team: Team) -> dict[str, Any]:
    """What one bus and the agents on it contribute to a run summary, as plain JSON data.

    An in-process run has one; a ZeroMQ run has one per process, which each node sends to
    the driver when it leaves (see :func:`summarize`)."""
    stats = bus.stats()
    subscribers = {}
    accounting_ok = bus.outstanding == 0
    for name, s in stats.subscribers.items():
        row = subscribers[name] = {
            "handled": s.delivered + s.dead_lettered,
            "wait_p50_ms": s.queue_wait.p50_us / 1000,
            "wait_p95_ms": s.queue_wait.p95_us / 1000,
            "wait_p99_ms": s.queue_wait.p99_us / 1000,
            "handle_p50_ms": s.handling.p50_us / 1000,
            "handle_p95_ms": s.handling.p95_us / 1000,
            "handle_p99_ms": s.handling.p99_us / 1000,
            "cpu_p99_ms": s.handling_cpu.p99_us / 1000,
            "breaker_trips": s.breaker_trips,
        }
        # Sampled with the CPU time wherever the kernel gives run-queue waits (Linux); a
        # subscription that handled nothing has none of either, and a figure of 0.
        if s.handling_own.count == s.handling_cpu.count:
            row["own_p99_ms"] = s.handling_own.p99_us / 1000
        if s.published != s.delivered + s.dead_lettered + s.shed + s.released or s.rejected:
            accounting_ok = False
    entries = bus.dlq.entries()
    learners = team.of_role(Learner)
    decisions: Counter[str] = Counter()
    for g in team.of_role(Guardian):
        decisions.update(g.decisions)
    observers: list[Observer] = team.of_role(Observer)
    own = _own_topics.get(bus)
    topics = (
        dict(own.counts) if own is not None else {t: n.published for t, n in stats.topics.items()}
    )
    return {
        "published": stats.published,
        "topics": topics,
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
        # Every dead letter, by reason: the in-memory queue keeps only the newest entries.
        "dlq": dict(bus.dlq.totals),
        "dlq_evicted": bus.dlq.evicted,
        "dead_letters": [_listed(e) for e in entries if e.reason != "shed"][
            :MAX_LISTED_DEAD_LETTERS
        ],
        "accounting_ok": accounting_ok,
        "inputs": sum(o.emitted for o in observers),
        "malformed": sum(o.malformed for o in observers),
        "input_errors": [f"{o.name}: {o.error}" for o in observers if o.error is not None],
        "accuracy": _accuracy(bus, team, learners),
        # A multi-process run's: what this process decided itself, summed with the others'
        # (each message is one process's); None in one process, or without a declared outcome.
        "tally": None if team.tally is None else _score_counts(team.tally.score()),
        "decisions": dict(decisions),
        "outbox": dict(team.outbox.counts),
        "alerts": sum(len(m.alerts) for m in team.of_role(Monitor)),
        "usage": team.usage(),
        "budget": team.budget(),
        "rate_limit": team.rate_limit(),
        "scheduling": _scheduling(stats.scheduling),
    }


def _listed(d: DeadLetterRecord) -> dict[str, Any]:
    """One of :attr:`RunSummary.dead_letters`: a bus's dead letter or a recorded one."""
    # A line names its message by envelope id (what `pantheon dlq` and the store key on),
    # never by a field of one team's payloads; the error carries its type, since a bare
    # KeyError's message is only the missing key.
    return {
        "subscriber": d.subscriber,
        "topic": d.topic,
        "envelope_id": d.envelope_id,
        "reason": d.reason,
        "error": f"{d.error_type}: {d.error}" if d.error_type else d.error,
    }


def _score_counts(score: OutcomeScore) -> dict[str, Any]:
    """An :class:`agents.OutcomeScore` as plain JSON data: counts, which add up."""
    return {
        "decided": score.decided,
        "scored": score.scored,
        "correct": score.correct,
        "unnamed": score.unnamed,
        "by_field": {f: list(counts) for f, counts in score.by_field.items()},
    }


def _summed_score(tallies: list[Mapping[str, Any]]) -> OutcomeScore:
    """The processes' tallies added up: each item was decided by the process that published
    its outcome, so the counts add (an item re-decided by another process would count
    twice: the record, which the summary prefers, has no such seam)."""
    by_field: dict[str, tuple[int, int]] = {}
    for t in tallies:
        for name, (right, total) in t["by_field"].items():
            r0, t0 = by_field.get(name, (0, 0))
            by_field[name] = (r0 + right, t0 + total)
    return OutcomeScore(
        decided=sum(t["decided"] for t in tallies),
        scored=sum(t["scored"] for t in tallies),
        correct=sum(t["correct"] for t in tallies),
        by_field=by_field,
        unnamed=sum(t["unnamed"] for t in tallies),
    )


def _first_wins(reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The reports merged, the first to name a key keeping it."""
    merged: dict[str, Any] = {}
    for report in reports:
        for key, value in report.items():
            merged.setdefault(key, value)
    return merged


def _accuracy(bus: Bus, team: Team, learners: list[Learner]) -> dict[str, Any] | None:
    """The run's decisions scored against the input's labels (``agents.Outcomes``), with
    whatever else the team's Learners report (the support desk's intent accuracy, the
    on-call scorer's grouping and pages); None when none has anything to say.

    Every Learner's report counts, in the team's order, the first to name a key keeping
    it: a team that added the built-in Learner beside its own scorer lost the scorer's
    report when only the first was read, and its custom checks found no pages."""
    extra = _first_wins(learner.report() for learner in learners)
    if team.outcomes is None:
        return extra or None
    # The team's own subscriptions: a gateway client or a test watching `#` on the same bus
    # must not make every topic look handled.
    patterns = [
        sub.pattern
        for name, sub in bus.subscriptions().items()
        if name.partition(":")[0] in team.agents
    ]

    def leaf(topic: str) -> bool:
        return not any(matches(p, topic) for p in patterns)

    score = team.outcomes.score(leaf)
    if not score.decided and not extra:
        return None
    # The team's decision fields first: that is the order the summary prints them in.
    report = score.as_report()
    return report | {k: v for k, v in extra.items() if k not in report}


def summarize(
    scenario: Scenario,
    reports: list[dict[str, Any]],
    *,
    seed: int,
    elapsed: float,
    session_id: str | None,
    messages: int | None = None,
    unverified: Mapping[str, int | None] | None = None,
    stream: Mapping[str, Any] | None = None,
) -> RunSummary:
    """Merge the :func:`local_report` of every process of a run and judge the result.

    A subscription present in several reports (competing consumers on several nodes) adds
    its counts; its latency quantiles are the worst of its members', an upper bound (the
    reports carry quantiles, not histograms). ``messages`` defaults to the sum of the
    reports' publish counts, right for one bus; a multi-process run passes its own count,
    since a message that crossed to another bus is counted by both. ``unverified`` names the
    processes whose report is missing (see :attr:`RunSummary.unverified`)."""
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
                # A figure one member did not measure (own time off Linux) is not known.
                for k in [k for k in seen if k not in row]:
                    del seen[k]
                for k in seen:
                    v = row[k]
                    seen[k] = seen[k] + v if k == "handled" else max(seen[k], v)
    dlq: Counter[str] = Counter()
    decisions: Counter[str] = Counter()
    outbox: Counter[str] = Counter()
    topics: Counter[str] = Counter()
    for r in reports:
        dlq.update(r["dlq"])
        decisions.update(r["decisions"])
        outbox.update(r["outbox"])
        topics.update(r.get("topics", {}))
    # The process that saw the most outcomes scored them (the one with the Learner, or the
    # one its outcome topics reached); the others saw a part, or none. What only another
    # process's Learners report (a scorer on a node, the built-in Learner on the driver)
    # is kept beside it.
    accuracy = _first_wins(
        sorted(
            (r["accuracy"] for r in reports if r["accuracy"] is not None),
            key=lambda a: a.get("scored") or 0,
            reverse=True,  # stable: of equals, the first process's first
        )
    )
    # A multi-process run with a declared outcome: every process tallied what it decided
    # itself, so the sum is the team's (a recorded run is scored again from its record).
    tallies = [r["tally"] for r in reports if r.get("tally") is not None]
    if tallies and scenario.scored:
        summed = _summed_score(tallies)
        # Only labels read ahead reach every process: with a generator's, the nodes' tallies
        # score nothing and a Learner beside the Observer scored more.
        if summed.decided and summed.scored >= (accuracy.get("scored") or 0):
            report = summed.as_report()
            accuracy = report | {k: v for k, v in accuracy.items() if k not in report}
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
        budget=_merge_budget([r.get("budget", {}) for r in reports]),
        # One limiter for the team, the driver's (its report is the first): the nodes'
        # agents take their turns there (pantheon.runner._budget_relay).
        rate_limit=next((r["rate_limit"] for r in reports if r.get("rate_limit")), {}),
        topics=dict(sorted(topics.items())),
        input_errors=[e for r in reports for e in r.get("input_errors", ())],
        dlq_evicted=sum(r.get("dlq_evicted", 0) for r in reports),
        malformed_topic=getattr(scenario.input, "malformed_topic", None),
        unverified=dict(unverified or {}),
        stream=dict(stream or {}),
        scheduling=_most_starved(reports),
    )
    summary.expectations = judge(scenario, summary)
    return summary


def score_from_record(
    scenario: Scenario,
    s: RunSummary,
    score: OutcomeScore,
    *,
    topics: Mapping[str, int] | None = None,
    dlq: Mapping[str, int] | None = None,
    dead_letters: Sequence[DeadLetterRecord] = (),
) -> None:
    """Put a multi-process run's accuracy, message counts and the dead letters of its
    processes that ended without their report, read from its whole session record, in
    ``s``, and judge its expectations again on them.

    Each process sees only the messages published on its own bus and those that crossed to
    it: an outcome published on a node that no agent on the driver subscribes to reaches no
    process holding the item's other messages, and a team whose decisions are spread over
    nodes (competing consumers) has each process hold a part. The record holds every node's
    messages, so it is scored as one process would score them (and as ``pantheon diff`` and
    a what-if read the same session). What only the processes' Learners report (the support
    desk's intent accuracy and thresholds) is kept beside it.

    ``topics``: the record's messages per topic (``SessionStore.topic_counts``). They
    replace the processes' own counts, and their sum ``messages``: a node the scenario
    killed took its counters with it, while what it published and shipped before is in the
    record, which ``sessions show`` and ``export`` count. A ``topics:`` bound or a custom
    check reading ``summary.topics`` then judges what the team did, not what the survivors
    counted.

    ``dlq``: the dead letters per reason the record holds from the processes of
    ``s.unverified`` (``SessionStore.dead_letter_counts`` of those nodes), and
    ``dead_letters`` the first of them other than shed (``SessionStore.dead_letters``).
    They are added to what the processes that reported counted and listed, so
    ``max_dlq`` and ``dlq:`` bounds judge every process's dead letters, a killed node's
    included; see the comment below for why only those come from the record.

    Every expectation :func:`judge` makes is judged again when something changed (a custom
    check may read any figure); the ones the run added after summarizing (a multi-process
    run's "every node ran to the end") stand."""
    changed = False
    if topics is not None:
        counted = _capped(topics)
        messages = sum(topics.values())
        if counted != s.topics or messages != s.messages:
            s.topics = counted
            s.messages = messages
            s.throughput = round(messages / s.elapsed_s, 1) if s.elapsed_s else 0.0
            changed = True
    # Dead letters. Each is recorded once, by the process whose queue took it (the row's
    # ``node``), so the record splits exactly by process, and adding one process's rows to
    # the others' reports counts nothing twice: a survivor's ``node_lost`` for what the
    # dead node held is the survivor's own row. (A message the dead node dead-lettered
    # just before it died, whose settling never reached its publisher, can be both its
    # row and the publisher's ``node_lost``: two rows in the record, counted as two here
    # as ``sessions show`` counts them.)
    # A process that reported keeps its bus's counts: ``dlq.totals`` counts every dead
    # letter its queue took, exactly and for free, those evicted past its bound and the
    # sheds of a flood it never listed (one in SHED_SAMPLE past SHED_LIST_ALL) included;
    # the record can only match it. A process that died took its counts with it: what it
    # shipped before is all anyone can still say, so only its part comes from the record.
    # Its sheds there are no sample (its recorder listens to its queue, and a queue with a
    # listener lists every shed), but like the rest of its journal they stop at its last
    # shipment: what it dead-lettered in the commit interval before the kill is nowhere,
    # so its counts are a floor, the same one ``sessions show`` and ``dlq list`` read.
    if dlq:
        s.dlq = dict(Counter(s.dlq) + Counter(dlq))
        # ``dlq_evicted`` counts what ``dlq`` counts and no bus's queue holds (the summary
        # prints ``dlq - dlq_evicted`` as kept in memory): a dead process's queue died with
        # it, so all of its dead letters are in the store only.
        s.dlq_evicted += sum(dlq.values())
        changed = True
    if dead_letters:
        listed = [*s.dead_letters, *map(_listed, dead_letters)]
        s.dead_letters = listed[:MAX_LISTED_DEAD_LETTERS]
    # A record without labels to score by (a generator's or stdin's live only in the
    # Observer's process) leaves the processes' own score as it is.
    if scenario.scored and score.scored:
        report = score.as_report()
        s.accuracy = report | {k: v for k, v in s.accuracy.items() if k not in report}
        changed = True
    if changed:
        fresh = {e["name"]: e for e in judge(scenario, s)}
        s.expectations = [fresh.get(e["name"], e) for e in s.expectations]


def _capped(topics: Mapping[str, int]) -> dict[str, int]:
    """Per-topic counts as a summary keeps them: sorted, at most :data:`MAX_TOPICS` topics,
    the rest summed under ``<other>`` (as :class:`_OwnTopics` and the bus count them)."""
    names = sorted(topics)
    kept = {t: topics[t] for t in names[:MAX_TOPICS]}
    rest = sum(topics[t] for t in names[MAX_TOPICS:])
    if rest:
        kept["<other>"] = kept.get("<other>", 0) + rest
    return kept


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


def _merge_budget(budgets: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One run's budget scopes from its processes' reports, spend and refusals added up (the
    limits are the scenario's, the same in each). Under ``pantheon run`` only the driver's
    report carries ledgers: the nodes' agents are charged to the driver's."""
    out: dict[str, dict[str, Any]] = {}
    for part in budgets:
        for scope, state in part.items():
            into = out.get(scope)
            if into is None:
                out[scope] = dict(state)
                continue
            into["tokens"] += state["tokens"]
            into["cost_usd"] = math.fsum((into["cost_usd"], state["cost_usd"]))
            into["refused"] += state["refused"]
            into["stopped"] = into["refused"] > 0
    return out


def judge(
    scenario: Scenario, s: RunSummary, *, fields: tuple[str, ...] | None = None
) -> list[dict[str, Any]]:
    """Each expectation of the scenario as a named check: expected, actual, passed, and a
    ``state``: ``passed``, ``failed`` or ``inconclusive``. ``fields``: the decision fields
    ``min_accuracy`` judges, when the summary was scored by another outcome than the
    scenario's (a what-if is scored as its original).

    Latency checks other than the historical ``max_p99_ms`` are named ``timing: ...``: they
    measure the machine as much as the team, and a reader of a failed CI run should see
    at once which failures are about speed. Every latency check and ``min_throughput``
    is judged by :func:`_timing`: exceeded while the machine kept the process from a CPU,
    with the handlers' own time within the bound, it is inconclusive (``passed`` stays
    true unless ``expect.strict_timing``), and ``why`` says how long the process waited.
    A handler's own time is its wall time less the loop thread's run-queue wait during it
    (``own_p99_ms``): the starvation the machine caused, measured per handling, is all it
    excuses, so a handler that blocks or awaits past the bound fails at any load."""
    e = scenario.expect
    out: list[dict[str, Any]] = []

    def check(name: str, passed: bool, want: Any, got: Any) -> None:
        state = "passed" if passed else "failed"
        out.append(
            {"name": name, "passed": bool(passed), "expected": want, "actual": got, "state": state}
        )

    def timing(name: str, ok: bool, want: Any, got: Any, own: tuple[bool, str] | None) -> None:
        """``own``: whether the team's own time meets the bound, and the figure that says
        so; ``None`` when it was not measured (the check cannot be excused)."""
        if ok:
            check(name, True, want, got)
            return
        state, why = _timing(s.scheduling, own, e.strict_timing)
        out.append(
            {
                "name": name,
                "passed": state == "inconclusive",
                "expected": want,
                "actual": got,
                "state": state,
                "why": why,
            }
        )

    def own_within(subs: list[dict[str, float]], limit: float) -> tuple[bool, str] | None:
        """The handlers' time less their waits for a CPU (``own_p99_ms``), where every
        subscription has it; else their CPU time, which cannot see a handler that blocks."""
        for key, what in (
            ("own_p99_ms", "the handlers' own time p99 (less their waits for a CPU)"),
            ("cpu_p99_ms", "the handlers' own CPU time p99"),
        ):
            figures = [h[key] for h in subs if key in h]
            if figures and len(figures) == len(subs):
                own = max(figures)
                within = "within" if own <= limit else "over"
                return own <= limit, f"{what} is {own:.3f} ms, {within} the bound"
        return None

    every_hop = list(s.hops.values())

    if s.input_errors:
        check("input ran to its end", False, "no error", "; ".join(s.input_errors))
    if e.max_p99_ms is not None:
        limits = (
            e.max_p99_ms if isinstance(e.max_p99_ms, dict) else dict.fromkeys(s.hops, e.max_p99_ms)
        )
        for agent, limit in limits.items():
            # p99 of one hop, bounded above by p99(queue wait) + p99(handling).
            subs = _hops_of(s, agent)
            worst = max((h["wait_p99_ms"] + h["handle_p99_ms"] for h in subs), default=0.0)
            # Any handler holding the loop delays every mailbox: the worst one's CPU counts.
            own = own_within(every_hop, limit)
            timing(f"p99 {agent} <= {limit} ms", worst <= limit, limit, round(worst, 3), own)
    for bound, what, key in (
        (e.p99_handling_ms, "handling", "handle_p99_ms"),
        (e.p99_queue_wait_ms, "queue wait", "wait_p99_ms"),
    ):
        if bound is None:
            continue
        agents = {n.split(":", 1)[0]: None for n in s.hops}
        limits = bound if isinstance(bound, dict) else dict.fromkeys(agents, bound)
        for agent, limit in limits.items():
            subs = _hops_of(s, agent)
            worst = max((h[key] for h in subs), default=0.0)
            own = own_within(subs if key == "handle_p99_ms" else every_hop, limit)
            name = f"timing: p99 {what} {agent} <= {limit} ms"
            timing(name, worst <= limit, limit, round(worst, 3), own)
    if e.zero_lost:
        # Only what was counted: a process that died with its books is not "nothing lost".
        # Even one that settled nothing: what it published itself is in nobody's books.
        # Unless the stream vouches for it (NATS): every agent it hosted was taken over and
        # nothing waits (see pantheon.runner._takeover).
        taken_over = _taken_over(s.stream)
        if s.unverified and (s.stream.get("items") or s.stream.get("handed_over")):
            check("zero lost", False, True, _stream_lost(s.stream))
        elif s.unverified and taken_over:
            check("zero lost", s.accounting_ok, True, s.accounting_ok)
        elif s.unverified:
            got: Any = "unknown: " + "; ".join(
                f"node {node!r} ended without its accounting"
                + ("" if n is None else f" after settling {n:,} messages")
                for node, n in s.unverified.items()
            )
            check("zero lost", False, True, got)
        else:
            check("zero lost", s.accounting_ok, True, s.accounting_ok)
    if e.max_dlq is not None:
        dead = sum(n for reason, n in s.dlq.items() if reason != "shed")
        # Named for what it counts: the summary's dead-letter total includes the shed ones.
        check(f"dead letters other than shed <= {e.max_dlq}", dead <= e.max_dlq, e.max_dlq, dead)
    for reason, count in e.dlq.items():
        n = s.dlq.get(reason, 0)
        check(f"dead letters {reason} {count}", count.admits(n), _bound(count), n)
    for pattern, count in e.topics.items():
        n = sum(c for topic, c in s.topics.items() if matches(pattern, topic))
        check(f"messages on {pattern} {count}", count.admits(n), _bound(count), n)
    if e.min_accuracy is not None:
        for name, field_, bound in accuracy_bounds(scenario, fields):
            acc = s.accuracy.get(field_)
            ok = acc is not None and acc >= bound
            check(name, ok, bound, acc)
            if (
                acc is None
                and scenario.outcome is None
                and scenario.transport.kind != "inprocess"
                and s.session_id is None
            ):
                out[-1]["why"] = (
                    "the team declares no outcome: section, and a multi-process run's "
                    "default outcome is read from its session record, which --no-record "
                    "left out"
                )
            elif acc is None:
                out[-1]["why"] = _unscored(scenario, s, field_)
    if e.max_breaker_trips is not None:
        check(
            f"breaker trips <= {e.max_breaker_trips}",
            s.breaker_trips <= e.max_breaker_trips,
            e.max_breaker_trips,
            s.breaker_trips,
        )
    if e.min_throughput is not None:
        # Had the loop never waited for a CPU, the run would have taken at most its wait
        # less: a rate short of the bound even then is the team's, whatever the load.
        wait = float(s.scheduling.get("wait_s") or 0.0)
        rate: tuple[bool, str] | None = None
        if s.scheduling.get("share") is not None and s.elapsed_s > wait:
            free = s.messages / (s.elapsed_s - wait)
            enough = free >= e.min_throughput
            rate = (
                enough,
                f"without its waits it would reach {free:.1f} msg/s"
                + (", within the bound" if enough else ", short of the bound"),
            )
        timing(
            f"throughput >= {e.min_throughput} msg/s",
            s.throughput >= e.min_throughput,
            e.min_throughput,
            s.throughput,
            rate,
        )
    usage: Mapping[str, Any] = getattr(s, "usage", None) or {}
    if e.max_tokens is not None:
        tokens = int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
        check(f"tokens <= {e.max_tokens}", tokens <= e.max_tokens, e.max_tokens, tokens)
    if e.max_cost_usd is not None:
        cost = round(float(usage.get("cost_usd") or 0.0), 6)
        if usage.get("priced") is False:
            # Calls to a model with no price: the cost is a floor, and no bound holds on it.
            check(f"cost <= ${e.max_cost_usd}", False, e.max_cost_usd, f"{cost} + unpriced calls")
        else:
            check(f"cost <= ${e.max_cost_usd}", cost <= e.max_cost_usd, e.max_cost_usd, cost)
    for spec in e.custom:
        passed, message = _custom(spec, scenario, s)
        check(f"custom: {spec}", passed, "pass", message)
    return out


def _unscored(scenario: Scenario, s: RunSummary, key: str) -> str:
    """Why ``min_accuracy`` had no accuracy ``key`` to judge: no outcome had a label."""
    scored = int(s.accuracy.get("scored") or 0)
    if scored:  # labelled outcomes, none of them with this field
        field_ = key.removesuffix("_accuracy")
        return f"no labelled outcome (of {scored:,}) has a label for {field_!r} to score"
    why = "there were no labelled outcomes to score"
    if s.inputs + s.malformed == 0:
        return f"{why}: the input gave no records"
    if scenario.input.label is None:
        return f"{why}: the input names no label field (input.label)"
    unlabelled = int(s.accuracy.get("unlabelled") or 0)
    n = s.inputs + s.malformed
    records = f"{n:,} input record{'' if n == 1 else 's'}"
    label = scenario.input.label
    if unlabelled:
        return f"{why}: {unlabelled:,} outcomes of {records} had no label ({label!r})"
    return f"{why}: no outcome of {records} had a label ({label!r})"


def _stream_lost(stream: Mapping[str, Any]) -> str:
    """What a killed node left in the stream, for the failed ``zero lost`` check: the items
    waiting for its agents that no live process hosts, and those it had served in memory."""

    def listed(items: list[str]) -> str:
        more = len(items) - MAX_LISTED_DEAD_LETTERS
        return ", ".join(items[:MAX_LISTED_DEAD_LETTERS]) + (
            f" and {more:,} more" if more > 0 else ""
        )

    parts = []
    items = stream.get("items") or []
    if items:
        parts.append(
            ("" if stream.get("complete") else "at least ")
            + f"{len(items):,} items wait in the stream for {', '.join(stream['waiting'])} "
            f"(no live member): {listed(items)}"
        )
    handed = sorted({k for ks in (stream.get("handed_over") or {}).values() for k in ks})
    if handed:
        parts.append(
            f"at least {len(handed):,} items were handed to "
            f"{', '.join(stream['handed_over'])} in the memory of a killed node, handled or "
            f"not: {listed(handed)}"
        )
    return "; ".join(parts)


def _taken_over(stream: Mapping[str, Any]) -> bool:
    """Whether the stream vouches for the killed nodes: each of their agents had a live
    member to take what they left, that member finished it, and the list is whole."""
    return (
        bool(stream.get("killed"))
        and not stream.get("no_live_member")
        and bool(stream.get("complete"))
        and not stream.get("messages")
    )


def accuracy_bounds(
    scenario: Scenario, fields: tuple[str, ...] | None = None
) -> list[tuple[str, str, float]]:
    """``min_accuracy`` as checks: (name, key of the summary's ``accuracy`` block, bound).

    One bound and one decision field (or none declared): ``accuracy >= 0.8`` on that field
    (on every field at once without one); one bound and several fields, or a bound per
    field: ``action accuracy >= 0.8`` per field. ``fields`` overrides the scenario's decision
    fields (a what-if scores by the original's)."""
    bound = scenario.expect.min_accuracy
    if bound is None:
        return []
    if fields is None:
        fields = scenario.outcome_spec().fields
    if isinstance(bound, Mapping):
        return [(f"{f} accuracy >= {b}", f"{f}_accuracy", b) for f, b in bound.items()]
    if not fields:
        return [(f"accuracy >= {bound}", "accuracy", bound)]
    if len(fields) == 1:
        return [(f"accuracy >= {bound}", f"{fields[0]}_accuracy", bound)]
    return [(f"{f} accuracy >= {bound}", f"{f}_accuracy", bound) for f in fields]


def _timing(
    scheduling: Mapping[str, Any], own: tuple[bool, str] | None, strict: bool
) -> tuple[str, str]:
    """The state of a timing check whose bound was exceeded, and why.

    Failed when the team's own time exceeds the bound (slow at any load), when nothing
    measured that time or the machine's share, or when the process hardly waited for a
    CPU; otherwise inconclusive: the machine, not the code, may have made it late
    (failed all the same under ``strict``)."""
    share = scheduling.get("share")
    if own is not None and not own[0]:
        return "failed", f"{own[1]}: slow at any load"
    if share is None:
        return "failed", "no measure of how long the process waited for a CPU"
    waited = _waited(scheduling)
    if share < STARVED_SHARE:
        return "failed", f"{waited}: too little to excuse it"
    if own is None:
        return "failed", f"{waited}, but the team's own time was not measured"
    why = f"{waited}; {own[1]}"
    if strict:
        return "failed", f"inconclusive ({why}), and timing is strict"
    return "inconclusive", why


def _waited(scheduling: Mapping[str, Any]) -> str:
    """The figure a reader sees ('the process waited 41% of its busy time for a CPU'),
    and how it was measured when not exactly."""
    text = f"the process waited {scheduling['share']:.0%} of its busy time for a CPU"
    if scheduling.get("source") == "loadavg":
        text += " (estimated from the load average)"
    return text


def _scheduling(stats: SchedulingStats | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {
        "source": stats.source,
        "wall_s": round(stats.wall_s, 3),
        "cpu_s": round(stats.cpu_s, 3),
        "wait_s": round(stats.wait_s, 3),
        "share": None if stats.share is None else round(stats.share, 4),
    }


def _most_starved(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The scheduling figure of the process that waited the largest share for a CPU.

    Per-agent figures are merged across processes without saying which process they
    came from, so the worst process speaks for the run: a lenient choice, and the reason
    ``strict_timing`` exists."""
    measured = [r["scheduling"] for r in reports if r.get("scheduling")]
    known = [m for m in measured if m.get("share") is not None]
    if known:
        return dict(max(known, key=lambda m: m["share"]))
    return dict(measured[0]) if measured else {}


def expectation_state(expectation: Mapping[str, Any]) -> str:
    """``passed``, ``failed`` or ``inconclusive``; for a check recorded before timing
    checks had states, read from its ``passed``."""
    state = expectation.get("state")
    if state in ("passed", "failed", "inconclusive"):
        return str(state)
    return "passed" if expectation.get("passed") else "failed"


def _hops_of(s: RunSummary, agent: str) -> list[dict[str, float]]:
    """The agent's subscriptions: ``agent`` itself and its ``agent:<pattern>`` extras."""
    return [h for n, h in s.hops.items() if n == agent or n.startswith(f"{agent}:")]


def _bound(count: Any) -> dict[str, int]:
    return {k: v for k, v in (("min", count.min), ("max", count.max)) if v is not None}


def _custom(spec: str, scenario: Scenario, s: RunSummary) -> tuple[bool, str]:
    """Run one ``expect.custom`` check: (passed, what it said)."""
    try:
        check = import_path(spec, scenario.base_dir)
        result = check(s)
    except ImportProblem as exc:
        return False, str(exc)
    except Exception as exc:
        return False, f"raised {type(exc).__name__}: {exc}"
    if result is None or result is True:
        return True, "passed"
    if result is False:
        return False, "failed"
    if isinstance(result, str):
        return False, result
    if (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], bool)
        and isinstance(result[1], str)
    ):
        return result[0], result[1] or ("passed" if result[0] else "failed")
    return False, f"returned {result!r}: want a bool, a message, None or (bool, message)"
