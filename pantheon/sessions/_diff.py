"""Comparing two recorded sessions: where they first part ways, and how their hops' latency
moved."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from pantheon.sessions._align import LEFT_OUT, Lineage, compare_runs, item_of
from pantheon.sessions._errors import ReplayDivergence
from pantheon.sessions._store import (
    DRIVER_NODE,
    SessionInfo,
    SessionStore,
    StoredDelivery,
    StoredEffect,
    StoredEnvelope,
)

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
    diff), ``hops_compared`` the aligned message pairs, ``latency`` per-hop p50/p99 of both.

    ``messages_a``/``messages_b`` count every recorded message of each session: the figure
    the run's summary, ``sessions show`` and ``export`` give. Not all are compared:
    ``not_compared_a``/``_b`` count those left out, by why (:data:`LEFT_OUT`: the bus's
    ``system.*`` messages and what they caused, a Monitor's sampled alerts and what they
    caused, messages an effect published, repeats), so
    ``compared_a`` is ``messages_a`` less those; :meth:`counts` says it in words.

    ``timing_effects`` names the effects that answered differently wherever the runs differ,
    when *every* difference is explained by one (``timing_only``): the difference came in
    through what an effect answered (a Memory lookup while an earlier email of the sender
    was still in flight, a threshold the Learner had or had not moved yet), which depends
    on timing; the team's own logic took the same path. Empty when some difference is not
    explained that way (or there is none)."""

    a: str
    b: str
    hops_compared: int
    messages_a: int
    messages_b: int
    divergence: ReplayDivergence | None
    latency: list[LatencyDelta] = field(default_factory=list)
    differences: int = 0
    timing_effects: tuple[str, ...] = ()
    node_a: str | None = None
    """The process of ``a`` where the divergence's hop ran (its agent handled the message,
    or handled the one that caused it): a node of a multi-process session, ``driver`` for
    the process that ran its scenario; None for a single-process session (or no hop)."""
    node_b: str | None = None
    """The same in ``b``."""
    left_out: int = 0
    """Inputs of ``a`` whose trees were not compared: ``b`` (a replay or what-if of ``a``)
    did not re-run them, since a node of ``a`` died in the middle of them."""
    left_out_b: int = 0
    """The same for ``b``'s inputs, when ``a`` is the re-run of ``b``."""
    not_compared_a: dict[str, int] = field(default_factory=dict)
    """Messages of ``a`` left out of the alignment, by why (keys of :data:`LEFT_OUT`)."""
    not_compared_b: dict[str, int] = field(default_factory=dict)
    """The same for ``b``."""

    @property
    def compared_a(self) -> int:
        """The messages of ``a`` the alignment walked (``hops_compared`` of them paired)."""
        return self.messages_a - sum(self.not_compared_a.values())

    @property
    def compared_b(self) -> int:
        return self.messages_b - sum(self.not_compared_b.values())

    def counts(self) -> str:
        """The messages of both runs in words, and those not compared and why:
        ``42 vs 46 messages; not compared: 2 vs 0 system.* and what they caused``."""
        text = f"{self.messages_a} vs {self.messages_b} messages"
        why = [
            f"{self.not_compared_a.get(key, 0)} vs {self.not_compared_b.get(key, 0)} {words}"
            for key, words in LEFT_OUT.items()
            if self.not_compared_a.get(key) or self.not_compared_b.get(key)
        ]
        return text + (f"; not compared: {', '.join(why)}" if why else "")

    @property
    def identical(self) -> bool:
        return self.divergence is None

    @property
    def timing_only(self) -> bool:
        """The runs differ, but only where effects answered differently."""
        return self.divergence is not None and bool(self.timing_effects)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "identical": self.identical,
            "timing_only": self.timing_only,
            "timing_effects": list(self.timing_effects),
            "differences": self.differences,
            "hops_compared": self.hops_compared,
            "messages_a": self.messages_a,
            "messages_b": self.messages_b,
            "compared_a": self.compared_a,
            "compared_b": self.compared_b,
            "not_compared_a": dict(self.not_compared_a),
            "not_compared_b": dict(self.not_compared_b),
            "left_out": self.left_out,
            "left_out_b": self.left_out_b,
            "divergence": None if self.divergence is None else self._divergence(),
            "latency": [d.to_dict() for d in self.latency],
        }

    def describe(self, a: str = "A", b: str = "B") -> str:
        """The first difference in words, the runs named ``a`` and ``b``, saying on which
        node its hop ran where either run is multi-process: ``... from agent 'reasoner'
        (node cognition in B): ...``."""
        if self.divergence is None:
            return "no difference"
        text = self.divergence.describe(a, b)
        where = [f"node {n} in {side}" for n, side in ((self.node_a, a), (self.node_b, b)) if n]
        if self.node_a is not None and self.node_a == self.node_b:
            where = [f"node {self.node_a} in {a} and {b}"]
        if not where:
            return text
        agent = f"from agent {self.divergence.agent!r}"
        note = f"({', '.join(where)})"
        if agent in text:
            return text.replace(agent, f"{agent} {note}", 1)
        head, sep, rest = text.partition("\n")
        return f"{head} {note}{sep}{rest}"

    def _divergence(self) -> dict[str, Any]:
        assert self.divergence is not None
        # Neither run is a replay: the message names them A and B.
        message = self.describe("A", "B").split("\n", 1)[0]
        return self.divergence.to_dict() | {
            "message": message,
            "node_a": self.node_a,
            "node_b": self.node_b,
        }


def _agent(name: str | None) -> str:
    return (name or "").partition(":")[0]


#: (envelope id, agent) -> that handling's effects in order: (name, request digest, flag,
#: result).
_Answers = dict[tuple[int, str], list[tuple[str, bytes | None, int, bytes | None]]]


def _answers(effects: Iterable[StoredEffect]) -> _Answers:
    out: dict[tuple[int, str], list[StoredEffect]] = defaultdict(list)
    for e in effects:
        if e.envelope_id:
            out[(e.envelope_id, _agent(e.subscriber))].append(e)
    return {
        k: [(e.name, e.digest, e.flag, e.result) for e in sorted(v, key=lambda e: e.ordinal)]
        for k, v in out.items()
    }


class _Explainer:
    """Tells whether a difference between two runs came in through an effect's answer:
    the handling that produced (or handled) the message, or one upstream of it, ran the
    same effects in both runs and one of them answered differently."""

    def __init__(
        self,
        env_a: Iterable[StoredEnvelope],
        env_b: Iterable[StoredEnvelope],
        eff_a: Iterable[StoredEffect],
        eff_b: Iterable[StoredEffect],
        to_new: dict[int, int],
        to_original: dict[int, int],
        changed: Collection[str] | None,
    ) -> None:
        self.changed = changed
        self.by_a = {e.id: e for e in env_a}
        self.by_b = {e.id: e for e in env_b}
        self.ans_a, self.ans_b = _answers(eff_a), _answers(eff_b)
        self.to_new, self.to_original = to_new, to_original

    def _differ(self, a_id: int, b_id: int, agent: str) -> list[str]:
        """Effects of one handling that answered differently before the two parted ways:
        a call of another name is where they parted, and so is the same call asked
        something else (its request digests differ) by an agent configured otherwise (a
        changed prompt, other settings): what it was answered says nothing of timing. An
        agent configured the same that asks otherwise asks with other state (thresholds
        the Learner had moved by then), or because an earlier effect answered otherwise,
        which is named already."""
        names = []
        a = self.ans_a.get((a_id, agent), [])
        b = self.ans_b.get((b_id, agent), [])
        reconfigured = self.changed is None or agent in self.changed
        for (name_a, digest_a, *answer_a), (name_b, digest_b, *answer_b) in zip(a, b, strict=False):
            if name_a != name_b:
                break
            # An agent configured otherwise asked something else, or may have: a call with
            # no digest (a closure, the agent's own method) cannot show it asked the same.
            if reconfigured and (not digest_a or not digest_b or digest_a != digest_b):
                break
            if answer_a != answer_b:
                names.append(name_a)
        return names

    def _upstream(self, start: int | None, in_a: bool) -> list[str]:
        """Walk ``start``'s causes (in run A or B) up to its input."""
        by_id = self.by_a if in_a else self.by_b
        other = self.to_new if in_a else self.to_original
        seen: set[int] = set()
        env = by_id.get(start) if start is not None else None
        while env is not None and env.id not in seen:
            seen.add(env.id)
            parent = env.causation_id
            if parent is None:
                return []
            mapped = other.get(parent)
            if mapped is not None:
                a_id, b_id = (parent, mapped) if in_a else (mapped, parent)
                names = self._differ(a_id, b_id, _agent(env.source))
                if names:
                    return names
            env = by_id.get(parent)
        return []

    def explain(self, div: ReplayDivergence) -> list[str]:
        """The effects whose answers explain ``div``; empty if none does."""
        if (
            div.field in ("effect", "outcome")
            and div.original_id is not None
            and div.replay_id is not None
        ):
            names = self._differ(div.original_id, div.replay_id, _agent(div.agent))
            if names:
                return names
        if div.replay_id is not None:
            return self._upstream(div.replay_id, in_a=False)
        return self._upstream(div.original_id, in_a=True)


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


def _hop_node(
    store: SessionStore,
    info: SessionInfo,
    envelopes: Iterable[StoredEnvelope],
    deliveries: Iterable[StoredDelivery],
    div: ReplayDivergence,
    envelope_id: int | None,
) -> str | None:
    """Where ``div``'s hop ran in one session: the node of its agent's handling of the
    message (an effect or an outcome) or of the message that caused it (a message the
    agent published); else the node the session's summary places the agent on. None for a
    single-process session."""
    placed = info.summary.get("nodes")
    if not placed and not store.node_journals(info.id):
        return None
    agent = _agent(div.agent)
    by_id = {e.id: e for e in envelopes}
    env = by_id.get(envelope_id) if envelope_id is not None else None
    handled = envelope_id if div.field in ("effect", "outcome") else None
    if handled is None and env is not None:
        handled = env.causation_id
    for d in deliveries:
        if d.envelope_id == handled and _agent(d.subscriber) == agent:
            return d.node or DRIVER_NODE
    hosts = [
        str(name)
        for name, node in (placed.items() if isinstance(placed, dict) else ())
        if isinstance(node, dict) and agent in (node.get("agents") or ())
    ]
    if len(hosts) == 1:
        return hosts[0]
    return None


def diff_sessions(
    store: SessionStore,
    a: str,
    b: str,
    *,
    left_out: Collection[int] = frozenset(),
    left_out_b: Collection[int] = frozenset(),
    changed: Collection[str] | None = None,
    input_key: str | None = None,
) -> SessionDiff:
    """Compare session ``b`` with session ``a`` (ids or unique prefixes).

    ``left_out``: input ids of ``a`` whose trees ``b`` did not re-run
    (``pantheon.rerun.left_out_inputs``, when ``b`` re-ran ``a`` and a node of ``a`` died in
    the middle of them): ``b``'s inputs are aligned with the rest of ``a``'s, and the trees
    left out are not missing. ``left_out_b``: the same the other way round, input ids of
    ``b`` whose trees ``a`` (the re-run of ``b``) did not re-run: their trees in ``b`` are
    not extra. A user diffs a session and its replay in either order.

    ``changed``: the agents configured otherwise in ``b``'s team than in ``a``'s
    (``pantheon.rerun.changed_agents``; None: not known, taken as all). Where one of them
    asked an effect something else, the team asked otherwise: a difference from there is
    not timing's, as it is where an agent configured the same asks with other state.
    ``input_key``: the inputs' field that names an item; the first difference then says
    whose tree it is in."""
    sa, sb = store.session(a), store.session(b)
    env_a, env_b = store.envelopes(sa.id), store.envelopes(sb.id)
    del_a, del_b = store.deliveries(sa.id), store.deliveries(sb.id)
    eff_a, eff_b = store.effects(sa.id), store.effects(sb.id)
    # Two runs of their own: a Monitor's sampled alerts came when timing and placement had
    # them (or not at all), and pair with nothing of the other run's.
    lineage = Lineage(env_a, eff_a, samples=False)
    lineage_b = Lineage(env_b, eff_b, samples=False)
    cmp_env_b, cmp_del_b, cmp_eff_b = env_b, del_b, eff_b
    if left_out_b:
        # B's unfinished trees are compared with nothing: A never re-ran them. Nor are the
        # messages whose chain leaves B's record (another node went on with what the dead
        # one had forwarded before its journal stopped): A's such messages are never
        # missing either way round.
        dropped: set[int | None] = {None, *left_out_b}
        cmp_env_b = [
            e
            for e in env_b
            if e.id not in lineage_b.by_id or lineage_b.root.get(e.id) not in dropped
        ]
        kept = {e.id for e in cmp_env_b}
        cmp_del_b = [d for d in del_b if d.envelope_id in kept]
        cmp_eff_b = [f for f in eff_b if f.envelope_id in kept]
    comparison = compare_runs(
        lineage,
        cmp_env_b,
        original_deliveries=del_a,
        new_deliveries=cmp_del_b,
        original_effects=eff_a,
        new_effects=cmp_eff_b,
        # B re-published A's inputs but those: align its k-th input to the k-th of the rest.
        inputs=[e for e in lineage.inputs if e.id not in left_out] if left_out else None,
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
    divergences = comparison.divergences
    explainer = _Explainer(
        env_a,
        env_b,
        eff_a,
        eff_b,
        comparison.mapper.to_new,
        comparison.mapper.to_original,
        changed,
    )
    causes: set[str] = set()
    # A re-run's effects are the record's answers where nothing changed, and live only where
    # its change (a what-if's overlay) reached: every difference between a session and its
    # re-run is the change's doing, never what got there first.
    rerun = any(
        y.kind in ("replay", "whatif")
        and x.id in (y.replay_of, y.forked_from)
        # A --live-effects replay called everything for real: its answers are timing's.
        and not (y.summary.get("replay") or {}).get("live_effects")
        for x, y in ((sa, sb), (sb, sa))
    )
    for div in [] if rerun else divergences:
        names = explainer.explain(div)
        if not names:
            causes.clear()
            break
        causes.update(names)
    first = divergences[0] if divergences else None
    if first is not None and input_key is not None:
        first.name_item(
            item_of(env_a, first.original_id, input_key)
            or item_of(env_b, first.replay_id, input_key)
        )
    nodes: tuple[str | None, str | None] = (None, None)
    if first is not None:
        nodes = (
            _hop_node(store, sa, env_a, del_a, first, first.original_id),
            _hop_node(store, sb, env_b, del_b, first, first.replay_id),
        )
    return SessionDiff(
        a=sa.id,
        b=sb.id,
        hops_compared=len(comparison.pairs),
        # Every recorded message, as the summary and export count them; those the
        # alignment leaves out are counted apart, by why.
        messages_a=len(env_a),
        messages_b=len(env_b),
        divergence=first,
        latency=latency,
        differences=len(divergences),
        timing_effects=tuple(sorted(causes)),
        node_a=nodes[0],
        node_b=nodes[1],
        left_out=len(left_out),
        left_out_b=len(left_out_b),
        not_compared_a=dict(lineage.left_out),
        not_compared_b=dict(lineage_b.left_out),
    )
