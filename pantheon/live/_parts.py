"""A multi-process run's live feed, whole: the driver's snapshot with every node's part.

Each process of a ZeroMQ or NATS run has its own bus, and the feed a watcher attaches to
runs in the driver, whose bus sees only its own subscriptions' work and what crosses to it:
on the support desk's three nodes, the Learner's hops and nothing of the Sensor, the
Reasoner, the Guardian or the Actor. So every node runs a feed of its own bus without a
socket and sends its :class:`NodePart` to the driver four times a second over the node's
control channel (:class:`NodeParts` sends; the driver's :class:`PartsBoard` keeps the
newest of each node), and the driver's feed adds them to its own snapshot
(:func:`merge_parts`).

What adds up and how:

* Counters add (each message counted once, by the process that published it; each handling
  by the process that handled it): totals, and the per-topic and per-agent series, which the
  driver samples from the sums at its own ticks.
* Hops and edges are per subscription: one in several processes (competing consumers)
  adds its counts and keeps the worst of its quantiles, as the run summary does.
* Breakers, breaker events, dead letters and traces are listed together, each node's times
  moved onto the driver's origin by the two feeds' wall-clock origins (exact on one machine,
  as good as the hosts' clock sync across machines). Dead letters get the session store's
  ids (``own id * processes + index``, the driver's index 0), so a watcher redriving one
  names the same letter as ``pantheon dlq``; the driver hands a node's back to that node.
* A trace is one request's hops: the hops each process saw of it join under its
  correlation id.
* Model usage adds up per agent; the outcome tally adds each process's own decisions.

A node's part is as old as its last tick (at most a quarter of a second): a watcher sees
the team a tick behind where the driver is, never a count that goes back. Nodes build and
send parts only while someone watches the driver's feed (the driver tells them, ``watch``),
and once more when they leave, so the final snapshot is whole: a part costs a node hosting
the whole support pipeline ~15 ms (its traces half of it) and ~150 KB of base64, which an
unwatched run should not pay four times a second.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec

from agents import total_usage
from pantheon import readmodel
from pantheon.live._snapshot import (
    MAX_TALLIED,
    BreakerEvent,
    BreakerState,
    DeadLetterView,
    HopBar,
    HopLatency,
    NodePart,
    OutcomeTally,
    Snapshot,
    Totals,
    Trace,
)

__all__ = [
    "PartsBoard",
    "decode_part",
    "encode_part",
    "merge_breakers",
    "merge_parts",
    "store_entry_id",
    "summed",
]

#: A dead letter's payload is the raw one, which msgpack may not encode (the very payload of
#: an ``encode_error``): it goes as its repr, as on the feed's socket.
_encoder = msgspec.msgpack.Encoder(enc_hook=repr)
_decoder = msgspec.msgpack.Decoder(NodePart)


def encode_part(part: NodePart) -> str:
    """A part as the text of a control line (msgpack, base64)."""
    return base64.b64encode(_encoder.encode(part)).decode("ascii")


def decode_part(data: object) -> NodePart:
    """The inverse of :func:`encode_part`; ``ValueError`` naming what is wrong."""
    if not isinstance(data, str):
        raise ValueError(f"a live part is base64 text, not {type(data).__name__}")
    try:
        return _decoder.decode(base64.b64decode(data, validate=True))
    except (binascii.Error, msgspec.DecodeError) as exc:
        raise ValueError(f"undecodable live part: {exc}") from None


#: A node's parts are a tick apart while watched: a longer gap is a silence.
_SILENCE_S = 1.0


def store_entry_id(own: int, index: int, processes: int) -> int:
    """A dead letter's id in the session store, from its process's own id: the recorder's
    numbering (``pantheon.sessions``), so live and recorded views name letters alike."""
    return own * processes + index


class PartsBoard:
    """The newest part of each node, as the driver received them. ``nodes`` lists the
    run's nodes in placement order (their index in the store's dead-letter ids is their
    position + 1)."""

    def __init__(self, nodes: Iterable[str]) -> None:
        self.index = {name: i + 1 for i, name in enumerate(nodes)}
        self.processes = len(self.index) + 1
        self._parts: dict[str, NodePart] = {}
        self._taken_at: dict[str, float] = {}
        #: Parts that could not be decoded, or came from a node the run does not place.
        self.dropped = 0
        #: Counters a node's part brought at once after a silence (nodes send only while
        #: someone watches): the driver's feed spreads them over the samples it already
        #: has instead of showing their whole history as one tick's throughput.
        self.jumps: tuple[dict[str, int], dict[str, int]] = ({}, {})
        #: ``redrive(node, own entry id)`` -> (taken, what happened): asks a node to redrive
        #: one of its dead letters (the driver of the run sets it; None: nobody to ask).
        self.redrive: Callable[[str, int], Awaitable[tuple[bool, str]]] | None = None
        #: Whether anyone watches the driver's feed: the nodes send parts only then.
        self.watched = False
        #: Told each time :attr:`watched` changes (the driver tells its nodes).
        self.on_watch: Callable[[bool], None] | None = None

    def watch(self, watched: bool) -> None:
        """The driver's feed has watchers (True) or none any more."""
        if watched != self.watched:
            self.watched = watched
            if self.on_watch is not None:
                self.on_watch(watched)

    def take(self, node: str, data: object) -> None:
        """A node's ``live`` control line: keep its part (counted and dropped if bad)."""
        try:
            part = decode_part(data)
        except ValueError:
            self.dropped += 1
            return
        if node not in self.index or part.node != node:
            self.dropped += 1
            return
        now = time.monotonic()
        if now - self._taken_at.get(node, float("-inf")) > _SILENCE_S:
            before = self._parts.get(node)
            for jump, new, old in zip(
                self.jumps,
                (part.topics, part.agents),
                ({}, {}) if before is None else (before.topics, before.agents),
                strict=True,
            ):
                for key, n in new.items():
                    jump[key] = jump.get(key, 0) + n - old.get(key, 0)
        self._taken_at[node] = now
        self._parts[node] = part

    def parts(self) -> list[NodePart]:
        return list(self._parts.values())

    def node_of(self, entry_id: int) -> tuple[str | None, int]:
        """Which process holds the dead letter with store id ``entry_id`` (None: the
        driver), and its own id there."""
        own, index = divmod(entry_id, self.processes)
        if index == 0:
            return None, own
        for name, i in self.index.items():
            if i == index:
                return name, own
        return "", own  # no such node: the caller says so


def _add_hop(into: dict[tuple[str, str], HopLatency], hop: HopLatency) -> None:
    seen = into.get((hop.kind, hop.name))
    if seen is None:
        into[(hop.kind, hop.name)] = hop
        return

    def worst(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else max(a, b)

    into[(hop.kind, hop.name)] = HopLatency(
        hop.kind,
        hop.name,
        seen.count + hop.count,
        max(seen.wait_p50_ms, hop.wait_p50_ms),
        max(seen.wait_p95_ms, hop.wait_p95_ms),
        max(seen.wait_p99_ms, hop.wait_p99_ms),
        worst(seen.handle_p50_ms, hop.handle_p50_ms),
        worst(seen.handle_p95_ms, hop.handle_p95_ms),
        worst(seen.handle_p99_ms, hop.handle_p99_ms),
    )


#: A breaker in several processes shows its worst state.
_BREAKER_RANK = {"closed": 0, "half_open": 1, "open": 2}


def merge_breakers(breakers: Iterable[BreakerState]) -> tuple[BreakerState, ...]:
    """One row per breaker: an agent on several nodes (competing consumers) has a breaker in
    each, shown as one, as its hop is: the worst state (with its reason and next probe),
    trips added, and the nodes in that state. A viewer keys its rows by name."""
    by_name: dict[str, BreakerState] = {}
    for b in breakers:
        seen = by_name.get(b.name)
        if seen is None:
            by_name[b.name] = b
            continue
        rank_seen, rank = _BREAKER_RANK.get(seen.state, 1), _BREAKER_RANK.get(b.state, 1)
        worst = b if rank > rank_seen else seen
        node = worst.node
        if rank == rank_seen and seen.node and b.node:
            node = ", ".join(sorted({*seen.node.split(", "), b.node}))
        by_name[b.name] = msgspec.structs.replace(worst, trips=seen.trips + b.trips, node=node)
    return tuple(by_name[name] for name in sorted(by_name))


def _totals(parts: Sequence[Totals]) -> Totals:
    fields = Totals.__struct_fields__
    return Totals(**{f: sum(getattr(t, f) for t in parts) for f in fields})


def _tally(tallies: Sequence[OutcomeTally]) -> OutcomeTally:
    counts: Counter[str] = Counter()
    for t in tallies:
        counts.update(dict(t.counts))
    noun = next((t.noun for t in tallies if t.decided), tallies[0].noun)
    return OutcomeTally(
        noun=noun,
        decided=sum(t.decided for t in tallies),
        scored=sum(t.scored for t in tallies),
        right=sum(t.right for t in tallies),
        counts=tuple(counts.most_common(MAX_TALLIED)),
    )


def _usage(usages: Sequence[readmodel.SessionUsage]) -> readmodel.SessionUsage:
    by_agent: dict[str, list[Any]] = {}
    for u in usages:
        for name, part in u.by_agent.items():
            by_agent.setdefault(name, []).append(part)
    return readmodel.SessionUsage.of({n: total_usage(p) for n, p in by_agent.items()})


def _traces(traces: Iterable[Trace], limit: int) -> tuple[Trace, ...]:
    """Traces of one request from several processes joined: hops together, the earliest
    part's topic and label (its root's), outcome the worst; a request whose first hop has
    not arrived yet is left for the next snapshot."""
    by_request: dict[int, list[Trace]] = {}
    for t in traces:
        by_request.setdefault(t.correlation_id, []).append(t)
    rank = {"ok": 0, "failed": 1, "dead_letter": 2}
    out = []
    for cid, parts in by_request.items():
        # A request whose first hop is in a part not come yet (each process sends on its own
        # tick) waits for it: shown now, the newest requests would read as starting midway.
        if not any(h.depth == 0 for t in parts for h in t.hops or ()):
            continue
        if len(parts) == 1:
            out.append(parts[0])
            continue
        first = min(parts, key=lambda t: t.start_ms)
        hops = sorted(
            (h for t in parts for h in t.hops or ()),
            key=lambda h: (h.start_ms, h.depth, h.agent),
        )
        start = min(t.start_ms for t in parts)
        end = max(t.start_ms + t.total_ms for t in parts)
        out.append(
            Trace(
                correlation_id=cid,
                topic=first.topic,
                label=first.label,
                start_ms=start,
                total_ms=end - start,
                hop_count=len(hops),
                outcome=max((t.outcome for t in parts), key=lambda o: rank.get(o, 1)),
                hops=tuple(hops),
            )
        )
    out.sort(key=lambda t: t.start_ms + t.total_ms)
    return tuple(out[-limit:]) if limit else ()


def _shift_hop(h: HopBar, ms: float) -> HopBar:
    return dataclasses.replace(
        h, enqueued_ms=h.enqueued_ms + ms, start_ms=h.start_ms + ms, end_ms=h.end_ms + ms
    )


def merge_parts(
    snap: Snapshot,
    parts: Sequence[NodePart],
    *,
    origin_wall: float,
    board: PartsBoard,
    max_traces: int,
    max_dead_letters: int,
) -> Snapshot:
    """The driver's ``snap`` with every node's part added (see the module docstring).
    ``snap``'s own dead letters carry the driver's own entry ids; its series already count
    the parts (the driver samples their sums)."""
    processes = board.processes
    dead: list[DeadLetterView] = [
        dataclasses.replace(d, entry_id=store_entry_id(d.entry_id, 0, processes))
        for d in snap.dead_letters
    ]
    hops: dict[tuple[str, str], HopLatency] = {}
    for h in snap.hops:
        _add_hop(hops, h)
    events: list[BreakerEvent] = list(snap.breaker_events)
    traces: list[Trace] = list(snap.traces)
    for part in parts:
        shift = part.origin_wall - origin_wall if origin_wall and part.origin_wall else 0.0
        index = board.index.get(part.node, 0)
        for h in part.hops:
            _add_hop(hops, h)
        events.extend(msgspec.structs.replace(e, t_s=e.t_s + shift) for e in part.breaker_events)
        dead.extend(
            dataclasses.replace(
                d, entry_id=store_entry_id(d.entry_id, index, processes), t_s=d.t_s + shift
            )
            for d in part.dead_letters
        )
        ms = shift * 1000
        traces.extend(
            msgspec.structs.replace(
                t,
                start_ms=t.start_ms + ms,
                hops=tuple(_shift_hop(h, ms) for h in t.hops or ()),
            )
            for t in part.traces
        )
    events.sort(key=lambda e: e.t_s)
    dead.sort(key=lambda d: d.t_s)
    return msgspec.structs.replace(
        snap,
        totals=_totals([snap.totals, *(p.totals for p in parts)]),
        hops=tuple(sorted(hops.values(), key=lambda h: (h.kind != "agent", h.name))),
        breakers=merge_breakers(itertools.chain(snap.breakers, *(p.breakers for p in parts))),
        breaker_events=tuple(events),
        dead_letters=tuple(dead[-max_dead_letters:]) if max_dead_letters else (),
        traces=_traces(traces, max_traces),
        usage=_usage([snap.usage, *(p.usage for p in parts)]),
        outcomes=_tally([snap.outcomes, *(p.outcomes for p in parts)]),
    )


def summed(
    own: Mapping[str, int],
    parts: Sequence[NodePart],
    field: Callable[[NodePart], Mapping[str, int]],
) -> dict[str, int]:
    """Counters by key: the driver's own with every part's added."""
    out = dict(own)
    for part in parts:
        for key, n in field(part).items():
            out[key] = out.get(key, 0) + n
    return out
