"""What a live feed publishes: one :class:`Snapshot` of a session, several times a second.

The same value describes a running session (built from the bus's own counters by
:class:`~pantheon.live.LiveFeed`) and a finished one (built from the read model by
:func:`~pantheon.live.snapshot_from_store`), so a viewer draws both with one code path.
Every part is a frozen msgspec Struct of plain values: it crosses the feed's socket as
msgpack without a hand-written codec, and never carries a live object.

Conventions follow :mod:`pantheon.readmodel`: times are offsets from the session's first
envelope (``t_s`` seconds, ``*_ms`` milliseconds) and an *agent* is a subscription name
(but an agent's name where model usage is concerned).

The model usage section, the breaker events, a request's hops and the dead letters are the
read model's own :class:`~pantheon.readmodel.SessionUsage`,
:class:`~pantheon.readmodel.BreakerEvent`, :class:`~pantheon.readmodel.HopBar` and
:class:`~pantheon.readmodel.DeadLetterView` (the breaker event a Struct, the others frozen
dataclasses, which msgspec encodes as it does Structs; the dead letter is the bus's
:class:`~bus.DeadLetterRecord` and the breaker event the bus's :class:`~bus.BreakerChange`,
each with a view's fields) rather than copies of them: one type for both sources, so a live
and a recorded session cannot disagree on what these are.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from agents import BudgetState
from pantheon.readmodel import BreakerEvent, DeadLetterView, HopBar, SessionUsage

__all__ = [
    "MAX_TALLIED",
    "PROTOCOL_VERSION",
    "BreakerEvent",
    "BreakerState",
    "Check",
    "DeadLetterView",
    "Hello",
    "HopBar",
    "HopLatency",
    "NodePart",
    "OutcomeTally",
    "Redrive",
    "RedriveResult",
    "Series",
    "Snapshot",
    "Totals",
    "Trace",
]

#: Bumped on any incompatible change to the structs below or to the framing.
PROTOCOL_VERSION = 1


class Totals(msgspec.Struct, frozen=True, kw_only=True):
    """Whole-session counters. ``queued + in_flight`` is what is still in the mailboxes;
    ``dlq_size`` counts every dead letter of the session (shed ones included)."""

    published: int = 0
    delivered: int = 0
    dead_lettered: int = 0
    shed: int = 0
    rejected: int = 0
    failures: int = 0
    retries: int = 0
    queued: int = 0
    in_flight: int = 0
    dlq_size: int = 0


class Series(msgspec.Struct, frozen=True):
    """Throughput of one topic (envelopes published) or one agent (handlings finished):
    ``counts[i]`` messages in the bucket starting ``start_s + i * bucket_s``."""

    kind: Literal["topic", "agent"]
    key: str
    bucket_s: float
    start_s: float
    counts: tuple[int, ...]
    total: int

    @property
    def rates(self) -> list[float]:
        """Messages per second in each bucket."""
        return [c / self.bucket_s for c in self.counts]


class HopLatency(msgspec.Struct, frozen=True):
    """Queue wait and handling quantiles (ms) of one agent or one edge (``"src -> dst"``).

    A live feed reads the bus's histograms (log-linear, within 12.5 %, sampled after
    warm-up); it has no handling time per edge, so those are None live. A finished session's
    are exact, from every stored delivery."""

    kind: Literal["agent", "edge"]
    name: str
    count: int
    wait_p50_ms: float
    wait_p95_ms: float
    wait_p99_ms: float
    handle_p50_ms: float | None
    handle_p95_ms: float | None
    handle_p99_ms: float | None


class BreakerState(msgspec.Struct, frozen=True):
    """One circuit breaker now. ``next_probe_s``: seconds until an open breaker lets a
    probe through (None unless open and live). ``node``: the process it is in, in a
    multi-process run; an agent on several nodes has a breaker in each, shown as one row
    at the worst state, naming the nodes in that state (``"work1, work2"``)."""

    name: str
    state: str
    trips: int
    next_probe_s: float | None = None
    reason: str | None = None
    node: str | None = None


class Check(msgspec.Struct, frozen=True):
    """One expectation of a finished run, as judged: ``state`` is ``passed``, ``failed``
    or ``inconclusive`` (a timing bound exceeded while the machine kept the process from a
    CPU); ``why`` says what decided a timing check that did not pass. ``expected`` and
    ``actual`` are JSON text."""

    name: str
    state: str
    expected: str
    actual: str
    why: str | None = None


class Trace(msgspec.Struct, frozen=True):
    """One request (an input and all it caused). ``hops`` is its waterfall, or None when
    the snapshot left it out (a finished session's: ask the store for one request's)."""

    correlation_id: int
    topic: str
    label: str
    start_ms: float
    total_ms: float
    hop_count: int
    outcome: str
    hops: tuple[HopBar, ...] | None = None


class OutcomeTally(msgspec.Struct, frozen=True, kw_only=True):
    """What the team has decided so far, in its own words (its ``outcome:``): ``noun`` an
    item (``invoice``), ``counts`` items per decision, most first (at most
    :data:`MAX_TALLIED`), and how many labelled decisions are right. Empty for a team that
    declares no outcome while it runs (its default outcome is read at the end)."""

    noun: str = "item"
    decided: int = 0
    scored: int = 0
    right: int = 0
    counts: tuple[tuple[str, int], ...] = ()

    @property
    def accuracy(self) -> float | None:
        return self.right / self.scored if self.scored else None


#: Decisions a tally names; the rest are counted in ``decided`` only.
MAX_TALLIED = 8


class Snapshot(msgspec.Struct, frozen=True, tag="snapshot", kw_only=True):
    """A session at one instant. ``live`` is True while a feed publishes it; ``status`` is
    the session's (``running`` until the run ends); ``seq`` numbers a feed's snapshots
    (a viewer that skipped some sees the gap); ``t_s`` is the session's age. ``usage``:
    model calls, tokens and cost per agent and in total, without the list of calls (the
    read model has those)."""

    session_id: str
    scenario: str | None
    status: str
    live: bool
    seq: int
    t_s: float
    totals: Totals
    series: tuple[Series, ...] = ()
    hops: tuple[HopLatency, ...] = ()
    breakers: tuple[BreakerState, ...] = ()
    breaker_events: tuple[BreakerEvent, ...] = ()
    dead_letters: tuple[DeadLetterView, ...] = ()
    traces: tuple[Trace, ...] = ()
    usage: SessionUsage = msgspec.field(default_factory=SessionUsage)
    budget: tuple[BudgetState, ...] = ()
    """The scenario's budget scopes: spent, limits, calls refused (none without one)."""
    outcomes: OutcomeTally = msgspec.field(default_factory=OutcomeTally)
    checks: tuple[Check, ...] = ()
    """The run's expectations once it has ended (a live feed has none to give)."""
    unjudged: str | None = None
    """Why the run has no verdict on its expectations (:func:`pantheon.readmodel.unjudged`:
    it stopped before the end of its input), or None; ``checks`` are then of the part that
    ran."""
    nodes: tuple[str, ...] = ()
    """A multi-process session's processes, a line each (its agents, how it ended, where
    its journal ends: :attr:`pantheon.readmodel.NodeView.text`); a live feed's name each
    node and its agents."""


class NodePart(msgspec.Struct, frozen=True, tag="node_part", kw_only=True):
    """What one node of a multi-process run adds to its driver's live feed, a few times a
    second over the node's control channel (``pantheon.runner``): its own bus seen as a
    feed sees it. ``totals.published`` and ``topics`` count only what the node published
    itself (a message that crossed to it is its publisher's); ``agents`` counts what each
    of its subscriptions handled. Times (``t_s``, ``*_ms``) are from ``origin_wall``, the
    wall time of the node feed's origin, which the driver puts on its own. Dead letters
    keep the node's own entry ids: the driver numbers them as the session store does."""

    node: str
    origin_wall: float
    totals: Totals
    topics: dict[str, int]
    agents: dict[str, int]
    hops: tuple[HopLatency, ...] = ()
    breakers: tuple[BreakerState, ...] = ()
    breaker_events: tuple[BreakerEvent, ...] = ()
    dead_letters: tuple[DeadLetterView, ...] = ()
    traces: tuple[Trace, ...] = ()
    usage: SessionUsage = msgspec.field(default_factory=SessionUsage)
    outcomes: OutcomeTally = msgspec.field(default_factory=OutcomeTally)


# -- the socket protocol ---------------------------------------------------------------------


class Hello(msgspec.Struct, frozen=True, tag="hello"):
    """First frame a feed sends a client: which session this socket serves."""

    session_id: str
    scenario: str | None
    version: int = PROTOCOL_VERSION


class Redrive(msgspec.Struct, frozen=True, tag="redrive"):
    """Client to feed: re-publish dead letter ``entry_id`` in the running process.
    ``request`` is echoed in the :class:`RedriveResult`."""

    request: int
    entry_id: int


class RedriveResult(msgspec.Struct, frozen=True, tag="redrive_result"):
    """``ok``: the entry's subscription took it back; else ``detail`` says why not."""

    request: int
    entry_id: int
    ok: bool
    detail: str


ServerFrame = Hello | Snapshot | RedriveResult
ClientFrame = Redrive
