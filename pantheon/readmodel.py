"""The read model both dashboards draw: plain frozen values computed from a session store.

The Streamlit dashboard and the Textual TUI show the same numbers because they call these
functions, not SQL: every function takes a :class:`~pantheon.sessions.SessionStore` and a
session id (or unique prefix; an unknown one raises
:class:`~pantheon.sessions.SessionNotFound`) and reads through the store's methods, which
also see what a live run has committed but not yet moved out of its journal.

Conventions, everywhere in this module:

* **Times are offsets from the session's first envelope**: ``t_s`` in seconds, ``*_ms`` in
  milliseconds. Envelopes and deliveries carry monotonic nanoseconds (``created_ns``,
  ``started_ns``...), dead letters and breaker transitions carry wall-clock seconds; each is
  measured against the first envelope's value on its own clock, so the two line up.
* **Latencies are milliseconds and exact**: quantiles are nearest-rank over every stored
  delivery (the bus's own histograms are sampled after warm-up; these are not), the same
  definition :func:`pantheon.sessions.diff_sessions` uses.
* **Queue wait** is publish to handler start (``started_ns - enqueued_ns``), **handling** is
  handler start to end, retries included.
* An **agent** is a subscription name as the bus reports it: ``reasoner``, or
  ``memory:action.executed`` for an agent's second subscription. An **edge** is
  ``"source -> subscriber"``, the source being the subscription that published the envelope
  or ``<outside>`` for an input.
* A **node** is the process that did something in a multi-process session (a name of the
  scenario's ``transport.nodes``, or ``driver`` for the process that ran the scenario); the
  hops, dead letters and breaker changes of a single-process session have none (``None``),
  so a view shows a node column only when a session has nodes.
* **Model usage** is counted from the session's recorded ``model.<provider>.chat`` effects
  (what :meth:`agents.Agent.chat` records) and priced from the ``prices`` of the session's
  stored scenario; its *agent* is the agent's name (the subscription name up to the first
  ``:``), since tokens are spent by an agent, not by one of its subscriptions.
"""

from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from agents import (
    RUN_SCOPE,
    AgentUsage,
    BudgetExceeded,
    BudgetState,
    Prices,
    Usage,
    UsageMeter,
    total_usage,
)
from bus import BreakerChange, DeadLetterRecord, matches, validate_pattern
from pantheon.sessions import (
    DRIVER_NODE,
    NodeJournal,
    SessionInfo,
    SessionStore,
    StoredDelivery,
    StoredEffect,
    StoredEnvelope,
)
from pantheon.sessions.internals import DOWNSTREAM

__all__ = [
    "BreakerEvent",
    "DeadLetterView",
    "GuardianDecision",
    "HopBar",
    "HopLatency",
    "ModelCall",
    "NodeView",
    "Outcomes",
    "RequestRow",
    "SessionRow",
    "SessionUsage",
    "ThroughputPoint",
    "breaker_timeline",
    "budget",
    "dead_letters",
    "hop_latency",
    "nodes",
    "outcomes",
    "placement",
    "quantile",
    "redrive_outcome",
    "requests",
    "session_row",
    "session_rows",
    "throughput",
    "unjudged",
    "usage",
    "usd",
    "waterfall",
]

#: The source name of an envelope nobody in the team published (an input).
OUTSIDE = "<outside>"
#: The recorded effects that are model calls (a SQLite GLOB): what ``Agent.chat`` records.
MODEL_CALLS = "model.*.chat"
RequestOutcome = Literal["ok", "dead_letter", "failed", "pending"]
#: The process that ran the scenario in a multi-process session (its records carry no node:
#: the store keeps ``None`` for the recording process).
DRIVER = DRIVER_NODE


# -- values ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionRow:
    """One line of the sessions list.

    ``started`` is wall-clock seconds; ``duration_s`` is None while the session runs.
    ``passed`` is the run's verdict on its expectations, or for a replay whether it matched
    its original; None when the session never got that far (running, aborted, crashed):
    an ``aborted`` run's summary may hold checks judged on the part that ran, which say
    nothing of the whole (:func:`unjudged`); ``failed_expectations`` still names those
    that failed there.
    ``note`` says why a session ended badly: the run's error, the abort reason, or the
    replay's divergence. ``usage``: its model calls, tokens and cost so far."""

    id: str
    kind: str
    status: str
    scenario: str | None
    started: float
    duration_s: float | None
    messages: int
    dead_letters: int
    failed_expectations: tuple[str, ...]
    passed: bool | None
    replay_of: str | None
    note: str | None = None
    usage: AgentUsage = field(default_factory=AgentUsage)
    """The session's model calls, tokens and cost (:func:`usage`'s total)."""


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    """Messages in one time bucket starting ``t_s`` after the first envelope.

    ``kind="topic"``: envelopes published on topic ``key``; ``kind="agent"``: deliveries
    subscription ``key`` finished. Every key has a point in every bucket from the first to
    the last, zeros included, so a line chart does not interpolate across silence."""

    t_s: float
    kind: Literal["topic", "agent"]
    key: str
    count: int
    rate: float


@dataclass(frozen=True, slots=True)
class HopLatency:
    """Queue wait and handling quantiles of one agent or one edge, over ``count`` deliveries."""

    kind: Literal["agent", "edge"]
    name: str
    count: int
    wait_p50_ms: float
    wait_p95_ms: float
    wait_p99_ms: float
    handle_p50_ms: float
    handle_p95_ms: float
    handle_p99_ms: float


class BreakerEvent(BreakerChange, frozen=True):
    """A circuit breaker changed state (``closed``/``open``/``half_open``): the bus's change,
    ``t_s`` seconds from the session's start, in process ``node`` (multi-process sessions
    only; ``None``: the recording process). A finished session's (:func:`breaker_timeline`)
    and a live feed's (``pantheon.live``) breaker events are both this."""

    t_s: float
    node: str | None = None

    @property
    def name(self) -> str:
        """The breaker's name (what the dashboards' columns call it)."""
        return self.breaker

    @classmethod
    def of(cls, change: BreakerChange, *, t_s: float, node: str | None) -> BreakerEvent:
        """``change`` (the bus's event, or a recorded transition) at ``t_s`` in ``node``."""
        return cls(
            change.time, change.breaker, change.old, change.new, change.reason, t_s=t_s, node=node
        )


@dataclass(frozen=True, slots=True)
class DeadLetterView(DeadLetterRecord):
    """A dead letter with the payload that failed (None when that envelope is not in the
    store) and the request it belongs to, so a view can open its waterfall; ``t_s`` is when,
    in seconds from the session's start. A finished session's (:func:`dead_letters`) and a
    live feed's (``pantheon.live``) dead letters are both this. ``redriven`` says it was
    taken back (live: re-published; finished: delivered by a redrive session)."""

    t_s: float
    redriven: bool
    payload: Any
    correlation_id: int | None = None
    redriven_by: str | None = None
    node: str | None = None
    """The process whose queue dead-lettered it: a node of a multi-process session (``driver``
    for the one that ran the scenario); None in a single-process one."""


@dataclass(frozen=True, slots=True)
class GuardianDecision:
    """One ``guardian.decision`` message: what the Guardian allowed, and every reason."""

    envelope_id: int
    correlation_id: int | None
    item: str | None
    """The item decided on, by the team's outcome key (``email_id``, ``invoice_id``)."""
    verdict: str
    action: str
    reasons: tuple[str, ...]
    intent: str | None = None
    confidence: float | None = None


@dataclass(frozen=True, slots=True)
class Outcomes:
    """What the team achieved. ``accuracy`` and ``expectations`` come from the run's
    summary (empty until the run ends, and for replays); ``decisions`` counts verdicts and
    ``guardian`` lists decisions as recorded, so both are there while a run is live."""

    accuracy: dict[str, Any]
    expectations: tuple[dict[str, Any], ...]
    decisions: dict[str, int]
    guardian: tuple[GuardianDecision, ...]
    noun: str = "item"
    """What the team calls an item (``email``, ``invoice``), from its outcome key."""


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One request: an input and every message it caused (one correlation id).

    ``start_ms`` is when its first envelope was published, ``total_ms`` from then to the end
    of its last handling (or its last publish, if later); ``hops`` counts its deliveries.
    ``outcome``: ``dead_letter`` when any of its messages is in the DLQ, ``failed`` when a
    handling failed without one, ``pending`` while the session runs and a message of it that
    a subscription will handle has not been handled yet (a topic counts once a message on it
    was handled, or when it matches a subscription in the latest metrics snapshot; messages
    a subscription's filter refuses stay pending until the run ends), else ``ok``."""

    correlation_id: int
    topic: str
    label: str
    start_ms: float
    total_ms: float
    hops: int
    outcome: RequestOutcome


@dataclass(frozen=True, slots=True)
class HopBar:
    """One delivery of a request, for a waterfall: published at ``enqueued_ms``, picked up
    at ``start_ms``, done at ``end_ms`` (session offsets). ``depth`` is the envelope's hop
    count (0 for the input); ``error`` is ``"Type: message"`` when the handling failed."""

    envelope_id: int
    causation_id: int | None
    topic: str
    agent: str
    depth: int
    enqueued_ms: float
    start_ms: float
    end_ms: float
    queue_wait_ms: float
    handling_ms: float
    outcome: str
    error: str | None
    node: str | None = None
    """The process that handled it (multi-process sessions only)."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """One process of a multi-process session: its agents, how it ended and how far its
    journal reached the store.

    ``status`` is the run summary's (``ok``, ``killed``, ``died``), None while the run goes
    on; ``killed_at_s`` is when the scenario killed it (seconds into the run). The journal
    counts (``shipments``, ``records``, ``ended``: its end mark came, so nothing it did is
    missing) are None for the driver, which records the session itself. :attr:`text` is
    the line ``pantheon sessions show`` prints and both dashboards show."""

    name: str
    agents: tuple[str, ...]
    status: str | None
    killed_at_s: float | None = None
    exit_code: int | None = None
    shipments: int | None = None
    records: int | None = None
    ended: bool | None = None

    @property
    def how(self) -> str:
        """How the process ended, in words: ``ok``, ``killed at 0.15 s``, ``died (exit
        code 1)``, ``running``."""
        if self.status is None:
            return "running"
        if self.killed_at_s is not None:
            return f"killed at {self.killed_at_s:.2f} s"
        if self.status != "ok" and self.exit_code not in (None, 0):
            return f"{self.status} (exit code {self.exit_code})"
        return self.status

    @property
    def journal(self) -> str:
        """Where its records end: complete, cut short (and where), or never shipped."""
        if self.name == DRIVER and self.shipments is None:
            return "records the session itself"
        shipments, records = self.shipments or 0, self.records or 0
        counted = f"{_plural(records, 'record')} in {_plural(shipments, 'shipment')}"
        if not shipments:
            if self.status is None:
                return "no records shipped yet"
            return "shipped no records" + ("" if self.status == "ok" else " (they died with it)")
        if self.ended:
            return (
                f"{_plural(shipments, 'shipment')}, {_plural(records, 'record')}, journal complete"
            )
        if self.status is None:
            return f"{counted} so far"
        if self.status == "ok":
            return f"journal ends after {counted} (its end mark never came)"
        return f"journal ends after {counted} (its last records died with it)"

    @property
    def text(self) -> str:
        """``node cognition: reasoner, memory, planner; ok; 13 shipments, 6,144 records,
        journal complete``."""
        agents = ", ".join(self.agents) or "(no agents)"
        return f"node {self.name}: {agents}; {self.how}; {self.journal}"


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One recorded model call: who made it, which model answered, the tokens it used and
    what they cost (None when the model has no price in the scenario), when it started
    (``start_ms``, a session offset) and how long it took (``latency_ms``; 0 for a call a
    replay served from the record)."""

    seq: int
    agent: str
    subscriber: str | None
    envelope_id: int
    effect: str
    model: str
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    start_ms: float
    latency_ms: float

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class SessionUsage:
    """A session's model usage: ``total``, ``by_agent`` (each agent that called a model,
    by name) and the ``calls`` themselves, in the order they were recorded.

    The live feed's snapshots carry this type too, without ``calls``: a running process
    knows each agent's totals for free, while listing calls means reading the store.
    :meth:`as_dict` has the shape of a run summary's ``usage``, and equals it for the
    session that summary describes."""

    total: AgentUsage = field(default_factory=AgentUsage)
    by_agent: dict[str, AgentUsage] = field(default_factory=dict)
    calls: tuple[ModelCall, ...] = ()

    @classmethod
    def of(
        cls, by_agent: Mapping[str, AgentUsage], calls: tuple[ModelCall, ...] = ()
    ) -> SessionUsage:
        """The usage of agents (by name); the total is their :func:`agents.total_usage`."""
        return cls(total_usage(by_agent.values()), dict(by_agent), calls)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SessionUsage:
        """The inverse of :meth:`as_dict` (a run summary's ``usage``), without calls."""
        by_agent = data.get("by_agent")
        return cls(
            AgentUsage.from_dict(data),
            {
                str(name): AgentUsage.from_dict(part)
                for name, part in (by_agent.items() if isinstance(by_agent, Mapping) else ())
            },
        )

    def as_dict(self) -> dict[str, Any]:
        """``{calls, input_tokens, output_tokens, cost_usd, priced, by_agent: {...}}``."""
        return {
            **self.total.as_dict(),
            "by_agent": {name: u.as_dict() for name, u in self.by_agent.items()},
        }


# -- helpers -------------------------------------------------------------------------------


def quantile(sorted_values: list[float] | list[int], q: float) -> float:
    """Nearest-rank quantile ``q`` (0 < q <= 1) of already sorted values; 0.0 when empty.

    Nearest rank returns an observed value (the p99 of 50 deliveries is the slowest one),
    never an interpolation between two."""
    if not sorted_values:
        return 0.0
    rank = math.ceil(q * len(sorted_values))
    return float(sorted_values[min(max(rank, 1), len(sorted_values)) - 1])


class _Origin:
    """The session's first envelope, on both clocks, and conversions to offsets."""

    __slots__ = ("mono_ns", "wall")

    def __init__(self, info: SessionInfo, envelopes: list[StoredEnvelope]) -> None:
        if envelopes:
            first = min(envelopes, key=lambda e: e.created_ns)
            self.mono_ns, self.wall = first.created_ns, first.wall
        else:
            # Nothing published yet: wall times count from the session's start.
            self.mono_ns, self.wall = 0, info.started

    def ms(self, ns: int) -> float:
        return (ns - self.mono_ns) / 1e6

    def wall_s(self, wall: float) -> float:
        return wall - self.wall


def _load(store: SessionStore, ref: str) -> tuple[SessionInfo, list[StoredEnvelope], _Origin]:
    info = store.session(ref)
    envelopes = store.envelopes(info.id)
    return info, envelopes, _Origin(info, envelopes)


def _request_of(e: StoredEnvelope) -> int:
    """The request an envelope belongs to: its correlation id, or itself for an input."""
    return e.correlation_id if e.correlation_id is not None else e.id


def _edge(envelope: StoredEnvelope | None, subscriber: str) -> str:
    source = envelope.source if envelope is not None else None
    return f"{source or OUTSIDE} -> {subscriber}"


def _multi_process(store: SessionStore, info: SessionInfo) -> bool:
    """The session ran on several processes: its summary lists them, or (while it runs)
    a node has shipped records. A replay of one runs in one process, and has neither."""
    return bool(info.summary.get("nodes")) or bool(store.node_journals(info.id))


def _node_of(store: SessionStore, info: SessionInfo) -> Callable[[str | None], str | None]:
    """What a record's ``node`` reads as: ``driver`` for the recording process (``None``
    in the store) of a multi-process session; ``None`` throughout a single-process one."""
    if not _multi_process(store, info):
        return lambda node: None
    return lambda node: node or DRIVER


def _error(d: StoredDelivery) -> str | None:
    if d.error_type and d.error:
        return f"{d.error_type}: {d.error}"
    return d.error_type or d.error or None


# -- the read model --------------------------------------------------------------------------


def session_rows(store: SessionStore) -> list[SessionRow]:
    """Every session, newest first, with what the sessions list shows."""
    counts = store.envelope_counts()
    return [_row(store, info, counts.get(info.id, 0)) for info in store.sessions()]


def session_row(store: SessionStore, sid: str) -> SessionRow:
    """One session's line of the list (its page header), without reading the others."""
    info = store.session(sid)
    return _row(store, info, store.envelope_counts().get(info.id, 0))


def _row(store: SessionStore, info: SessionInfo, messages: int) -> SessionRow:
    summary = info.summary
    replay = summary.get("replay") if isinstance(summary.get("replay"), Mapping) else None
    expectations = summary.get("expectations") or []
    failed = tuple(
        str(e.get("name")) for e in expectations if isinstance(e, Mapping) and not e.get("passed")
    )
    redriven = summary.get("redrive") if isinstance(summary.get("redrive"), Mapping) else None
    if replay is not None:
        passed: bool | None = bool(replay.get("matched"))
        divergence = replay.get("divergence")
        note = None if divergence is None else _divergence_text(divergence)
    elif redriven is not None:
        outcomes = redriven.get("outcomes") or {}
        passed = all(v == "delivered" for v in outcomes.values())
        note = redrive_outcome(redriven)
    else:
        raw = summary.get("passed")
        passed = raw if isinstance(raw, bool) and unjudged(info) is None else None
        note = summary.get("error") or summary.get("aborted")
    return SessionRow(
        id=info.id,
        kind=info.kind,
        status=info.status,
        scenario=info.scenario,
        started=info.started,
        duration_s=info.duration,
        messages=messages,
        dead_letters=len(store.dead_letters(info.id)),
        failed_expectations=failed,
        passed=passed,
        replay_of=info.replay_of,
        note=None if note is None else str(note),
        usage=usage(store, info.id, calls=False).total,
    )


def unjudged(info: SessionInfo) -> str | None:
    """Why session ``info``'s expectations say nothing of its run, or None when they do.

    Expectations judge a whole run: an ``aborted`` one stopped before the end of its input,
    so it has no verdict, whatever its summary holds. One a signal stopped (Ctrl-C, its
    summary's ``interrupted``) finished what was in flight and judged that part, which its
    summary keeps (a count that is fine on 14 inputs may not be on 600); one that died
    judged nothing. ``pantheon resume`` judges the whole input. The reason reads after
    "not judged, ": ``interrupted by SIGINT after 14 inputs``."""
    if info.status != "aborted":
        return None
    summary = info.summary
    signal = summary.get("interrupted")
    if signal:
        n = _count(summary.get("inputs")) + _count(summary.get("malformed"))
        return f"interrupted by {signal} after {n} input{'s' if n != 1 else ''}"
    if str(summary.get("error", "")).startswith("interrupted ("):
        return "interrupted at once (a second Ctrl-C)"
    return "its process died before the run ended"


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def redrive_outcome(report: Mapping[str, Any]) -> str:
    """A redrive's outcome in words, from its report (``pantheon dlq redrive --json``, or a
    redrive session's summary): "17 of 17 redriven", "14 of 17 redriven, 3 failed again",
    "14 of 17 redriven, 3 failed again (2 downstream)" when the redelivery of some went
    through and what it caused did not (the fix to look for is elsewhere in the team).
    Counted from the outcomes, so reports from before the counts were recorded read too."""
    outcomes = [str(v) for v in (report.get("outcomes") or {}).values()]
    ok = sum(v == "delivered" for v in outcomes)
    skipped = sum(v.startswith("skipped:") for v in outcomes)
    downstream = sum(v.startswith(DOWNSTREAM) for v in outcomes)
    failed = len(outcomes) - ok - skipped
    text = f"{ok} of {len(outcomes)} redriven"
    if failed:
        text += f", {failed} failed again"
    if downstream:
        text += f" ({downstream} downstream)"
    if skipped:
        text += f", {skipped} skipped"
    return text


def _divergence_text(divergence: Any) -> str:
    if isinstance(divergence, Mapping) and divergence.get("message"):
        return str(divergence["message"])
    return str(divergence)


def throughput(store: SessionStore, sid: str, *, bucket_s: float = 0.1) -> list[ThroughputPoint]:
    """Messages per topic (published) and per agent (handled) in ``bucket_s`` buckets,
    ordered by kind, key, then time."""
    if not bucket_s > 0:
        raise ValueError(f"bucket_s must be a positive number of seconds, got {bucket_s!r}")
    info, envelopes, origin = _load(store, sid)
    deliveries = store.deliveries(info.id)
    bucket_ns = bucket_s * 1e9
    counts: dict[tuple[str, str], Counter[int]] = defaultdict(Counter)
    for e in envelopes:
        counts[("topic", e.topic)][int((e.created_ns - origin.mono_ns) // bucket_ns)] += 1
    for d in deliveries:
        counts[("agent", d.subscriber)][int((d.ended_ns - origin.mono_ns) // bucket_ns)] += 1
    if not counts:
        return []
    first = min(min(c) for c in counts.values())
    last = max(max(c) for c in counts.values())
    points = []
    for kind, key in sorted(counts):
        per_bucket = counts[(kind, key)]
        for b in range(first, last + 1):
            n = per_bucket.get(b, 0)
            points.append(
                ThroughputPoint(round(b * bucket_s, 9), kind, key, n, n / bucket_s)  # type: ignore[arg-type]
            )
    return points


def hop_latency(store: SessionStore, sid: str) -> list[HopLatency]:
    """Exact p50/p95/p99 of queue wait and handling, per agent then per edge, by name."""
    info = store.session(sid)
    source = {e.id: e for e in store.envelopes(info.id)}
    waits: dict[tuple[str, str], list[int]] = defaultdict(list)
    handles: dict[tuple[str, str], list[int]] = defaultdict(list)
    for d in store.deliveries(info.id):
        for key in (
            ("agent", d.subscriber),
            ("edge", _edge(source.get(d.envelope_id), d.subscriber)),
        ):
            waits[key].append(d.queue_wait_ns)
            handles[key].append(d.handling_ns)
    out = []
    kinds: tuple[Literal["agent", "edge"], ...] = ("agent", "edge")
    for kind in kinds:
        for key in sorted(k for k in waits if k[0] == kind):
            w, h = sorted(waits[key]), sorted(handles[key])
            out.append(
                HopLatency(
                    kind,
                    key[1],
                    len(w),
                    *(quantile(w, q) / 1e6 for q in (0.50, 0.95, 0.99)),
                    *(quantile(h, q) / 1e6 for q in (0.50, 0.95, 0.99)),
                )
            )
    return out


def breaker_timeline(store: SessionStore, sid: str) -> list[BreakerEvent]:
    """Every breaker state change, in the order they happened."""
    info, _, origin = _load(store, sid)
    node = _node_of(store, info)
    return [
        BreakerEvent.of(t, t_s=origin.wall_s(t.time), node=node(t.node))
        for t in store.breaker_transitions(info.id)
    ]


def dead_letters(store: SessionStore, sid: str) -> list[DeadLetterView]:
    """The session's dead letters by entry id, each with its failing payload."""
    info, envelopes, origin = _load(store, sid)
    by_id = {e.id: e for e in envelopes}
    node = _node_of(store, info)
    out = []
    for d in store.dead_letters(info.id):
        env = by_id.get(d.envelope_id)
        out.append(
            DeadLetterView.of(
                d,
                t_s=origin.wall_s(d.time),
                redriven=d.redriven,
                payload=None if env is None else env.payload,
                correlation_id=None if env is None else env.correlation_id,
                redriven_by=d.redriven_by,
                node=node(d.node),
            )
        )
    return out


def outcomes(store: SessionStore, sid: str) -> Outcomes:
    """Accuracy and expectations from the run's summary; Guardian decisions as recorded,
    each naming its item by the team's outcome key."""
    from pantheon.rerun import outcome_spec

    info = store.session(sid)
    spec = outcome_spec(info)
    guardian = []
    for e in store.envelopes(info.id):
        p = e.payload
        if e.topic != "guardian.decision" or not isinstance(p, Mapping) or "verdict" not in p:
            continue
        confidence = p.get("confidence")
        guardian.append(
            GuardianDecision(
                envelope_id=e.id,
                correlation_id=e.correlation_id,
                item=_item(p, spec.key, spec.input_key),
                verdict=str(p["verdict"]),
                action=str(p.get("action", "")),
                reasons=tuple(str(r) for r in p.get("reasons") or ()),
                intent=None if p.get("intent") is None else str(p["intent"]),
                confidence=float(confidence) if isinstance(confidence, int | float) else None,
            )
        )
    accuracy = info.summary.get("accuracy")
    expectations = info.summary.get("expectations") or ()
    return Outcomes(
        accuracy=dict(accuracy) if isinstance(accuracy, Mapping) else {},
        expectations=tuple(dict(e) for e in expectations if isinstance(e, Mapping)),
        decisions=dict(Counter(g.verdict for g in guardian)),
        guardian=tuple(guardian),
        noun=spec.noun,
    )


def _item(payload: Mapping[str, Any], *keys: str) -> str | None:
    """The item a payload names: by the outcome's keys, else by its first ``*_id`` field (a
    session whose scenario cannot be read any more still shows its items)."""
    for k in (*keys, *(f for f in payload if isinstance(f, str) and f.endswith("_id"))):
        if payload.get(k) is not None:
            return str(payload[k])
    return None


def _label(payload: Any) -> str:
    if not isinstance(payload, Mapping):
        return ""
    ident = payload.get("id") or payload.get("email_id")
    text = payload.get("subject") or payload.get("message") or payload.get("error")
    parts = [str(x) for x in (ident, text) if x]
    return ": ".join(parts)[:120]


def _by_request(
    envelopes: Iterable[StoredEnvelope], deliveries: Iterable[StoredDelivery]
) -> tuple[dict[int, list[StoredEnvelope]], dict[int, list[StoredDelivery]]]:
    envs: dict[int, list[StoredEnvelope]] = defaultdict(list)
    corr: dict[int, int] = {}
    for e in envelopes:
        cid = _request_of(e)
        envs[cid].append(e)
        corr[e.id] = cid
    dels: dict[int, list[StoredDelivery]] = defaultdict(list)
    for d in deliveries:
        request = corr.get(d.envelope_id)
        if request is not None:
            dels[request].append(d)
    return envs, dels


def _awaited_topics(
    store: SessionStore, sid: str, envelopes: list[StoredEnvelope], handled: set[int]
) -> set[str]:
    """Topics some subscription will handle: seen handled, or matching a subscription
    pattern in the latest metrics snapshot (the recorder takes one a second)."""
    topics = {e.topic for e in envelopes if e.id in handled}
    snapshots = store.metrics(sid)
    if snapshots:
        subscribers = snapshots[-1].stats.get("subscribers") or {}
        patterns = [
            p
            for s in subscribers.values()
            if isinstance(s, Mapping) and isinstance(p := s.get("pattern"), str) and _valid(p)
        ]
        topics.update(e.topic for e in envelopes if any(matches(p, e.topic) for p in patterns))
    return topics


def _valid(pattern: str) -> bool:
    # A session recorded before token topics may hold an old glob (``email*``) that the bus
    # now refuses: no subscription of today's bus has it, so it awaits nothing.
    try:
        validate_pattern(pattern)
    except ValueError:
        return False
    return True


def requests(store: SessionStore, sid: str, *, limit: int | None = None) -> list[RequestRow]:
    """The session's requests in the order they started (``limit``: the first that many)."""
    info, envelopes, origin = _load(store, sid)
    deliveries = store.deliveries(info.id)
    envs, dels = _by_request(envelopes, deliveries)
    dead = {d.envelope_id for d in store.dead_letters(info.id)}
    handled = {d.envelope_id for d in deliveries}
    running = info.status == "running"
    awaited = _awaited_topics(store, info.id, envelopes, handled) if running else set()
    rows = []
    for cid, group in envs.items():
        root = next((e for e in group if e.id == cid), group[0])
        ds = dels.get(cid, [])
        start_ns = root.created_ns
        end_ns = max([e.created_ns for e in group] + [d.ended_ns for d in ds])
        outcome: RequestOutcome = "ok"
        if any(e.id in dead for e in group):
            outcome = "dead_letter"
        elif any(d.outcome != "delivered" for d in ds):
            outcome = "failed"
        elif any(e.id not in handled and e.topic in awaited for e in group):
            outcome = "pending"
        rows.append(
            RequestRow(
                correlation_id=cid,
                topic=root.topic,
                label=_label(root.payload),
                start_ms=origin.ms(start_ns),
                total_ms=(end_ns - start_ns) / 1e6,
                hops=len(ds),
                outcome=outcome,
            )
        )
    rows.sort(key=lambda r: (r.start_ms, r.correlation_id))
    return rows if limit is None else rows[: max(limit, 0)]


def waterfall(store: SessionStore, sid: str, correlation_id: int) -> list[HopBar]:
    """Every delivery of one request, in the order they started.

    Raises :class:`LookupError` naming the session when it has no such request."""
    info, envelopes, origin = _load(store, sid)
    group = [e for e in envelopes if _request_of(e) == correlation_id]
    if not group:
        raise LookupError(f"session {info.id} has no request with correlation id {correlation_id}")
    by_id = {e.id: e for e in group}
    node = _node_of(store, info)
    bars = []
    for d in store.deliveries(info.id):
        env = by_id.get(d.envelope_id)
        if env is None:
            continue
        bars.append(
            HopBar(
                envelope_id=env.id,
                causation_id=env.causation_id,
                topic=env.topic,
                agent=d.subscriber,
                depth=env.hops,
                enqueued_ms=origin.ms(d.enqueued_ns),
                start_ms=origin.ms(d.started_ns),
                end_ms=origin.ms(d.ended_ns),
                queue_wait_ms=d.queue_wait_ns / 1e6,
                handling_ms=d.handling_ns / 1e6,
                outcome=d.outcome,
                error=_error(d),
                node=node(d.node),
            )
        )
    bars.sort(key=lambda b: (b.start_ms, b.depth, b.agent))
    return bars


# -- processes -----------------------------------------------------------------------------


def nodes(store: SessionStore, sid: str) -> tuple[NodeView, ...]:
    """The processes of a multi-process session, the driver first, each with its agents,
    how it ended and how far its journal reached; empty for a single-process session.

    A finished session's come from its summary's ``nodes`` section and the store's journal
    of each node (:meth:`~pantheon.sessions.SessionStore.node_journals`); while it runs, the
    scenario's placement names them and says whose agents they run."""
    info = store.session(sid)
    journals: dict[str, NodeJournal] = store.node_journals(info.id)
    listed = info.summary.get("nodes")
    described: dict[str, Mapping[str, Any]] = {}
    if isinstance(listed, Mapping):
        described = {str(k): v for k, v in listed.items() if isinstance(v, Mapping)}
    elif info.status == "running" and journals:
        hosts: dict[str, list[str]] = {DRIVER: []}
        for agent, host in placement(info.scenario_text).items():
            hosts.setdefault(host, []).append(agent)
        described = {h: {"agents": a} for h, a in hosts.items()}
    if not described:
        return ()
    # The driver, then the nodes as the scenario lists them (a stored summary's keys are
    # sorted), then any other that shipped records.
    placed = list(dict.fromkeys(placement(info.scenario_text).values()))
    known = set(described) | set(journals)
    names = [DRIVER, *placed, *sorted(known - {DRIVER, *placed})]
    names = [n for n in dict.fromkeys(names) if n in known]
    out = []
    for name in names:
        d = described.get(name, {})
        j = journals.get(name)
        killed = d.get("killed_at_s")
        code = d.get("exit_code")
        out.append(
            NodeView(
                name=name,
                agents=tuple(str(a) for a in d.get("agents") or ()),
                status=None if info.status == "running" else str(d.get("status") or "ok"),
                killed_at_s=float(killed) if isinstance(killed, int | float) else None,
                exit_code=code if isinstance(code, int) else None,
                shipments=j.shipments if j is not None else None if name == DRIVER else 0,
                records=j.records if j is not None else None if name == DRIVER else 0,
                ended=j.ended if j is not None else None if name == DRIVER else False,
            )
        )
    return tuple(out)


def placement(scenario_text: str | None) -> dict[str, str]:
    """Agent name -> the node of the scenario's ``transport.nodes`` that runs it (empty
    for a single-process scenario). An agent no node names runs on the driver, and is not
    listed; one several nodes run (a group) maps to the first of them.

    Read as plain YAML, as :func:`_pricing` reads prices: a viewer never imports a
    recorded team's code."""
    try:
        data = yaml.safe_load(scenario_text or "")
    except yaml.YAMLError:
        return {}
    transport = data.get("transport") if isinstance(data, Mapping) else None
    hosts = transport.get("nodes") if isinstance(transport, Mapping) else None
    out: dict[str, str] = {}
    for node, agents in hosts.items() if isinstance(hosts, Mapping) else ():
        for agent in agents if isinstance(agents, list) else ():
            out.setdefault(str(agent), str(node))
    return out


# -- model usage -----------------------------------------------------------------------------


def usage(store: SessionStore, sid: str, *, calls: bool = True) -> SessionUsage:
    """The session's model calls, tokens and cost: per call, per agent and in total.

    Counted from the recorded ``model.*.chat`` effects that returned (a call that raised
    used nothing the session knows of), through the same :class:`agents.UsageMeter` per
    agent that :meth:`agents.Agent.chat` counts with, and priced from the ``prices`` of the
    stored scenario: so a finished run's usage is exactly its summary's, a running one's is
    the calls committed so far, and a replay's (which serves the recorded results) is the
    original's. A call made outside any handler (an agent's ``start``) has no subscriber
    on record and is counted under ``<outside>``; the summary names its agent. A ZeroMQ
    run records what its driver's bus saw, so calls made on other nodes are not here.

    ``calls=False`` leaves out the list of calls and the read of the envelopes their
    start times are measured from (the sessions list needs only the totals)."""
    info = store.session(sid)
    effects = store.effects(info.id, name=MODEL_CALLS)
    prices, asked = _pricing(info.scenario_text) if effects else ({}, "")
    origin_ns = _Origin(info, store.envelopes(info.id)).mono_ns if calls and effects else 0
    meters: dict[str, UsageMeter] = {}
    listed: list[ModelCall] = []
    for e in effects:
        answer = _chat_result(e)
        if answer is None:
            continue
        model, tokens = answer
        agent = OUTSIDE if e.subscriber is None else e.subscriber.partition(":")[0]
        meter = meters.get(agent)
        if meter is None:
            meter = meters[agent] = UsageMeter()
        cost = meter.add(model, tokens, asked, prices)
        if calls:
            listed.append(
                ModelCall(
                    seq=e.seq,
                    agent=agent,
                    subscriber=e.subscriber,
                    envelope_id=e.envelope_id,
                    effect=e.name,
                    model=model or asked,
                    input_tokens=tokens.input_tokens,
                    output_tokens=tokens.output_tokens,
                    cost_usd=cost,
                    start_ms=(e.started_ns - origin_ns) / 1e6 if e.started_ns else 0.0,
                    latency_ms=max(0, e.ended_ns - e.started_ns) / 1e6,
                )
            )
    by_agent = {name: meters[name].snapshot(prices) for name in sorted(meters)}
    return SessionUsage.of(by_agent, tuple(listed))


def budget(
    store: SessionStore, sid: str, spent: SessionUsage | None = None
) -> tuple[BudgetState, ...]:
    """The session's budget scopes (its scenario's ``budget:``, ``run`` first, then each
    agent's as ``agent:<name>``): what each spent, its limits and the calls it refused.

    Spent is the session's recorded usage (``spent``, when the caller has read it
    already); refused are its dead letters with reason ``budget``, each charged to the
    scope its error names. So a finished run's budget is its summary's, and a running
    one's is what it has committed so far. Read as plain YAML, as :func:`_pricing` is."""
    info = store.session(sid)
    limits = _budget_limits(info.scenario_text)
    if not limits:
        return ()
    used = usage(store, sid, calls=False) if spent is None else spent
    refused: dict[str, int] = {}
    for d in store.dead_letters(info.id):
        if d.reason == BudgetExceeded.dead_letter_reason:
            scope = BudgetExceeded(d.error or "").scope
            refused[scope] = refused.get(scope, 0) + 1
    out = []
    for scope, tokens, cost in limits:
        agent = None if scope == RUN_SCOPE else scope.removeprefix("agent:")
        u = used.total if agent is None else used.by_agent.get(agent, AgentUsage())
        out.append(
            BudgetState(scope, u.total_tokens, u.cost_usd, tokens, cost, refused.get(scope, 0))
        )
    return tuple(out)


def _budget_limits(
    scenario_text: str | None,
) -> list[tuple[str, int | None, float | None]]:
    """(scope, token limit, cost limit) of a stored scenario's ``budget:``; a limit that is
    not a number is left out (the scenario was validated when it ran)."""
    try:
        data = yaml.safe_load(scenario_text or "")
    except yaml.YAMLError:
        return []
    section = data.get("budget") if isinstance(data, Mapping) else None
    if not isinstance(section, Mapping):
        return []

    def limit(scope: str, raw: Any) -> tuple[str, int | None, float | None] | None:
        if not isinstance(raw, Mapping):
            return None
        tokens, cost = raw.get("tokens"), raw.get("cost_usd")
        return (
            scope,
            tokens if isinstance(tokens, int) else None,
            float(cost) if isinstance(cost, int | float) else None,
        )

    out = [limit(RUN_SCOPE, section.get("run"))]
    agents = section.get("agents")
    for name, raw in agents.items() if isinstance(agents, Mapping) else ():
        out.append(limit(f"agent:{name}", raw))
    return [x for x in out if x is not None]


def usd(cost: float) -> str:
    """A cost in US dollars as every view writes it: cents from a dollar up, four decimals
    from a cent, six below (where one model call usually is), ``$0`` for nothing."""
    if cost == 0:
        return "$0"
    if abs(cost) >= 1:
        return f"${cost:,.2f}"
    if abs(cost) >= 0.01:
        return f"${cost:.4f}"
    return f"${cost:.6f}"


def _chat_result(e: StoredEffect) -> tuple[str, Usage] | None:
    """The answering model and the tokens of a recorded chat result, read as
    :meth:`agents.ChatResult.from_dict` reads them; None for a call that did not return a
    result (it raised, or a replay diverged there)."""
    if not e.returned:
        return None
    value = e.value
    if not isinstance(value, Mapping):
        return None
    raw = value.get("usage")
    return str(value.get("model") or ""), Usage.from_dict(raw if isinstance(raw, Mapping) else {})


@functools.lru_cache(maxsize=64)
def _pricing(scenario_text: str | None) -> tuple[Prices, str]:
    """The stored scenario's ``prices`` and the model its provider asks for (what a price
    is looked up by when the answering model has none).

    Read as plain YAML, never parsed as a :class:`~pantheon.scenario.Scenario`: that would
    import the team's own modules, and a dashboard must not run a recorded team's code. A
    price that is not two numbers is left out, as an unknown model would be. Cached by
    text (a few ms each, and the sessions list reads every session's once a second while
    one runs); the result is shared, so callers only read it."""
    try:
        data = yaml.safe_load(scenario_text or "")
    except yaml.YAMLError:
        return {}, ""
    if not isinstance(data, Mapping):
        return {}, ""
    prices: dict[str, tuple[float, float]] = {}
    table = data.get("prices")
    for model, price in table.items() if isinstance(table, Mapping) else ():
        if not isinstance(price, Mapping):
            continue
        try:
            prices[str(model)] = (float(price["input"]), float(price["output"]))
        except (KeyError, TypeError, ValueError):
            continue
    provider = data.get("provider")
    if not isinstance(provider, Mapping):
        return prices, ""
    # An OpenAI provider names its model; a custom one (kind: custom) is built from its
    # settings, whose ``model``, when it has one, is taken as the model it asks for.
    settings = provider.get("settings")
    asked = provider.get("model")
    if asked is None and isinstance(settings, Mapping):
        asked = settings.get("model")
    return prices, "" if asked is None else str(asked)
