"""What a recorded session decided, item by item, and how two sessions' decisions differ.

A hop-by-hop diff says where two runs first part ways; after a what-if the question is
rather *which items* ended differently, and whether that was better. The answer is read
from the record through the team's own outcome (:meth:`Scenario.outcome_spec`: its
``outcome:`` section, see :mod:`agents._outcomes`), the same reading a run makes live, so a
run's summary, ``pantheon diff``, a what-if and both dashboards agree on every count.
Accuracy is measured against the labels of the input the recorded scenario names, read
again from its file, so a re-run is scored by the same reading whatever it served.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents import (
    Outcomes,
    OutcomeScore,
    OutcomeSpec,
    decision_text,
    label_decision,
    score_decisions,
)
from pantheon.rerun._engine import cut_inputs, node_cuts
from pantheon.sessions import SessionInfo, SessionStore
from pantheon.sessions.internals import Lineage

__all__ = [
    "OutcomeChange",
    "OutcomeDiff",
    "SessionOutcomes",
    "diff_outcomes",
    "outcome_spec",
    "session_outcomes",
]


@dataclass(frozen=True, slots=True)
class SessionOutcomes:
    """One session's decisions (item -> field -> value, the last outcome of an item decided
    twice), the team's outcome they were read by, and the labels to score them against."""

    session: str
    spec: OutcomeSpec
    decisions: dict[str, dict[str, str]]
    labels: Mapping[str, Any] = field(default_factory=dict)
    #: Outcomes (and refused records) that named no item: unlabelled, as a live run counts
    #: them.
    unnamed: int = 0

    @property
    def score(self) -> OutcomeScore:
        return score_decisions(self.decisions, self.labels, self.spec.fields, unnamed=self.unnamed)

    @property
    def scored(self) -> int:
        return self.score.scored

    @property
    def accuracy(self) -> float | None:
        """The share right of the one decision field when the team declares one, else of
        items right in every field; None without labels."""
        score = self.score
        if len(self.spec.fields) == 1:
            return score.field_accuracy(self.spec.fields[0])
        return score.accuracy

    def without(self, items: Collection[str]) -> SessionOutcomes:
        """The same reading with ``items`` left out: what a diff leaves out of both sides."""
        kept = {k: v for k, v in self.decisions.items() if k not in items}
        return dataclasses.replace(self, decisions=kept)

    def expected(self, item: str) -> dict[str, str] | None:
        """The item's label as a decision (only the fields it scores), or None."""
        wanted = label_decision(
            self.labels.get(item), self.spec.fields, self.decisions.get(item, {})
        )
        return wanted or None


@dataclass(frozen=True, slots=True)
class OutcomeChange:
    """One item decided differently: ``before`` in A, ``after`` in B (``None`` where that
    session did not decide it), ``expected`` its label (or None)."""

    item: str
    before: dict[str, str] | None
    after: dict[str, str] | None
    expected: dict[str, str] | None

    def moved(self) -> tuple[str, ...]:
        """The decision fields whose value changed, in order of appearance."""
        a, b = self.before or {}, self.after or {}
        return tuple(f for f in {**a, **b} if a.get(f) != b.get(f))

    @property
    def fixed(self) -> bool:
        e = self.expected
        return e is not None and all((self.after or {}).get(f) == v for f, v in e.items())

    @property
    def broken(self) -> bool:
        e = self.expected
        return e is not None and all((self.before or {}).get(f) == v for f, v in e.items())


@dataclass(frozen=True, slots=True)
class OutcomeDiff:
    """Session B's decisions against A's: every item that changed, grouped by
    ``before→after``, and each session's accuracy, worded in the team's own terms."""

    a: SessionOutcomes
    b: SessionOutcomes
    changes: list[OutcomeChange] = field(default_factory=list)

    @property
    def spec(self) -> OutcomeSpec:
        return self.a.spec

    def _label(self, change: OutcomeChange) -> tuple[str, str]:
        """``(before, after)`` as a group shows them: the whole decision for a team with one
        decision field, else only the fields that moved, each named."""
        fields = self.spec.fields
        if len(fields) == 1 or change.before is None or change.after is None:
            return decision_text(change.before, fields), decision_text(change.after, fields)
        moved = change.moved()
        pick = {f: (change.before.get(f, "-"), change.after.get(f, "-")) for f in moved}
        return (
            ", ".join(f"{f}={b}" for f, (b, _) in pick.items()),
            ", ".join(f"{f}={a}" for f, (_, a) in pick.items()),
        )

    @property
    def groups(self) -> list[tuple[str, str, list[str]]]:
        """(before, after, items), largest group first; ``-`` for not decided."""
        by: dict[tuple[str, str], list[str]] = {}
        for c in self.changes:
            by.setdefault(self._label(c), []).append(c.item)
        return sorted(((b, a, items) for (b, a), items in by.items()), key=lambda g: -len(g[2]))

    @property
    def fixed(self) -> list[str]:
        """Items wrong in A and right in B."""
        return [c.item for c in self.changes if c.fixed]

    @property
    def broken(self) -> list[str]:
        """Items right in A and wrong in B."""
        return [c.item for c in self.changes if c.broken]

    def headline(self) -> str:
        """``22 invoices changed decision: 22 approve→hold``, in the team's words (its
        item key and decision fields)."""
        n = len(self.changes)
        spec = self.spec
        what = spec.what_changed()
        if not n:
            return f"no {spec.noun} changed {what}"
        noun = spec.noun + ("" if n == 1 else "s")
        parts = ", ".join(f"{len(items)} {b}→{a}" for b, a, items in self.groups)
        return f"{n} {noun} changed {what}: {parts}"

    def accuracy_line(self) -> str:
        """``accuracy 0.774 -> 0.816 (27 fixed, 2 broken)``, or why there is none."""
        acc_a, acc_b = self.a.accuracy, self.b.accuracy
        if acc_a is None and acc_b is None:
            return "accuracy: no labels to score against"
        return (
            f"accuracy {_pct(acc_a)} -> {_pct(acc_b)} "
            f"({len(self.fixed)} fixed, {len(self.broken)} broken)"
        )

    def to_dict(self) -> dict[str, Any]:
        fields = self.spec.fields
        return {
            "a": self.a.session,
            "b": self.b.session,
            "key": self.spec.key,
            "noun": self.spec.noun,
            "fields": list(fields),
            "changed": len(self.changes),
            "headline": self.headline(),
            "groups": [{"before": b, "after": a, "items": items} for b, a, items in self.groups],
            "changes": [
                {
                    "item": c.item,
                    "before": decision_text(c.before, fields) if c.before else None,
                    "after": decision_text(c.after, fields) if c.after else None,
                    "expected": decision_text(c.expected, fields) if c.expected else None,
                    "fields": list(c.moved()),
                }
                for c in self.changes
            ],
            "fixed": self.fixed,
            "broken": self.broken,
            "accuracy_a": self.a.accuracy,
            "accuracy_b": self.b.accuracy,
            "decided_a": len(self.a.decisions),
            "decided_b": len(self.b.decisions),
        }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def outcome_spec(info: SessionInfo) -> OutcomeSpec:
    """The recorded team's outcome (the default when its scenario cannot be read)."""
    return _team(info, labels=False)[0]


def _team(info: SessionInfo, *, labels: bool = True) -> tuple[OutcomeSpec, dict[str, Any]]:
    """The recorded team's outcome and its input's labels (the default outcome and no
    labels when the recorded scenario cannot be read any more)."""
    from pantheon.runner import jsonl_labels
    from pantheon.scenario import FileInputConfig, JsonlInputConfig, recorded_scenario

    scenario = recorded_scenario(info.scenario_text, info.scenario_dir)
    if scenario is None:
        return OutcomeSpec(), {}
    inp = scenario.input
    if not labels or not isinstance(inp, JsonlInputConfig | FileInputConfig):
        return scenario.outcome_spec(), {}
    return scenario.outcome_spec(), jsonl_labels(inp)


def session_outcomes(
    store: SessionStore, session: str, *, like: SessionOutcomes | None = None
) -> SessionOutcomes:
    """Every item ``session`` (an id or unique prefix) decided, read by its team's outcome,
    with the labels to score them by; or read by ``like``'s outcome and labels, so that two
    sessions compare in the same terms (a what-if that removed the Learner, or changed the
    outcome section, is still judged as the original was)."""
    info = store.session(session)
    spec, labels = (like.spec, like.labels) if like is not None else _team(info)
    outcomes = Outcomes(spec, labels)
    envelopes = store.envelopes(info.id)
    for env in envelopes:
        outcomes.see(env.topic, env.payload, env.id, env.causation_id, env.correlation_id)
    if spec.declared:
        return SessionOutcomes(info.id, spec, outcomes.decisions(), labels, outcomes.unnamed)
    # Where the team's work ends: topics whose messages no subscriber ever handled.
    topic_of = {env.id: env.topic for env in envelopes}
    handled = {topic_of.get(d.envelope_id) for d in store.deliveries(info.id)}

    def leaf(topic: str) -> bool:
        return topic not in handled

    return SessionOutcomes(info.id, spec, outcomes.decisions(leaf), labels, outcomes.unnamed)


def left_out_inputs(store: SessionStore, a: str, b: str) -> frozenset[int]:
    """The input ids of session ``a`` whose trees ``b``, an exact replay or a what-if of
    ``a``, did not re-run: the ones a node of ``a`` died in the middle of
    (:func:`~pantheon.rerun._engine.cut_inputs`). ``pantheon diff`` and the dashboard leave
    them out of the hop comparison (``diff_sessions(left_out=...)``) as the replay did.
    :func:`left_out_both` is the same either way round."""
    found = _cut_trees(store, store.session(a), store.session(b))
    return frozenset() if found is None else frozenset(found[1])


def left_out_both(store: SessionStore, a: str, b: str) -> tuple[frozenset[int], frozenset[int]]:
    """:func:`left_out_inputs` of ``a`` (``b`` re-ran it) and of ``b`` (``a`` re-ran it):
    ``pantheon diff`` takes a session and its re-run in either order
    (``diff_sessions(left_out=..., left_out_b=...)``)."""
    return left_out_inputs(store, a, b), left_out_inputs(store, b, a)


def changed_agents(store: SessionStore, a: str, b: str) -> frozenset[str] | None:
    """The agents configured otherwise in ``b``'s recorded scenario than in ``a``'s (their
    :func:`~pantheon.rerun._overlay.agent_fingerprints` differ, or one team has the agent
    and the other not); None when either scenario cannot be read back (an older record).

    ``pantheon diff`` of two runs of their own: where an agent configured the same asked an
    effect something else, its state did (a threshold the Learner had moved by then: the
    Reasoner asks with the thresholds it holds), which is timing's; where its
    configuration changed, the team asked otherwise."""
    from pantheon.rerun._overlay import agent_fingerprints
    from pantheon.scenario import recorded_scenario

    sa, sb = store.session(a), store.session(b)
    x = recorded_scenario(sa.scenario_text, sa.scenario_dir)
    y = recorded_scenario(sb.scenario_text, sb.scenario_dir)
    if x is None or y is None:
        return None
    fx = agent_fingerprints(x, import_classes=False)
    fy = agent_fingerprints(y, import_classes=False)
    return frozenset(name for name in fx.keys() | fy.keys() if fx.get(name) != fy.get(name))


def _cut_trees(
    store: SessionStore, a: SessionInfo, b: SessionInfo
) -> tuple[Lineage, set[int]] | None:
    """``a``'s lineage and the inputs its cut left unfinished, when ``b`` re-ran ``a``
    without them (None otherwise: nothing to leave out)."""
    if b.kind not in ("replay", "whatif") or a.id not in (b.replay_of, b.forked_from):
        return None
    cuts = node_cuts(store, a)
    if not cuts:
        return None
    effects = store.effects(a.id)
    lineage = Lineage(store.envelopes(a.id), effects)
    return lineage, cut_inputs(store, a, cuts, lineage, effects)


def _not_rerun(store: SessionStore, a: SessionInfo, b: SessionInfo, spec: OutcomeSpec) -> set[str]:
    """The items of ``a``'s inputs that ``b`` did not re-run (:func:`_cut_trees`). Their
    trees in ``a`` are unfinished and ``b`` has none, so telling them apart says nothing of
    either team: named by their inputs' keys and by the outcomes those trees reached."""
    found = _cut_trees(store, a, b)
    if found is None:
        return set()
    lineage, roots = found
    reached = Outcomes(spec)
    items: set[str] = set()
    for env in lineage.envelopes:
        if lineage.root.get(env.id) not in roots:
            continue
        reached.see(env.topic, env.payload, env.id, env.causation_id, env.correlation_id)
        if env.id in roots and isinstance(env.payload, Mapping):
            key = env.payload.get(spec.input_key)
            if key is not None:
                items.add(str(key))
    return items | set(reached.decisions())


def diff_outcomes(store: SessionStore, a: str, b: str) -> OutcomeDiff:
    """Session ``b``'s decisions against ``a``'s (ids or unique prefixes), in A's terms.

    When one re-ran the other (an exact replay or a what-if of it) and a node of the
    original died mid-run, the items it left unfinished are left out of both sides, as the
    re-run left them out (see :func:`_not_rerun`)."""
    da = session_outcomes(store, a)
    db = session_outcomes(store, b, like=da)
    sa, sb = store.session(da.session), store.session(db.session)
    # Either way round: ``pantheon diff`` takes a session and its re-run in any order.
    left_out = _not_rerun(store, sa, sb, da.spec) | _not_rerun(store, sb, sa, da.spec)
    if left_out:
        da, db = da.without(left_out), db.without(left_out)
    scorer = da
    changes = [
        OutcomeChange(
            item,
            da.decisions.get(item),
            db.decisions.get(item),
            scorer.expected(item) if item in scorer.labels else None,
        )
        for item in sorted(set(da.decisions) | set(db.decisions))
        if da.decisions.get(item) != db.decisions.get(item)
    ]
    return OutcomeDiff(da, db, changes)
