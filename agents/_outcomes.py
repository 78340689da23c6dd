"""What a team decided for each item of its input, in the team's own terms, and how right.

A team exists to decide something per item: an email's action, an alert's disposition, an
invoice's approval. The run summary, ``min_accuracy``, the Learner, ``pantheon diff`` and a
what-if all ask the same two questions of a run, *what did it decide for each item* and
*was that right*, so the answer lives here, once, and is told what an outcome is by the
team (a scenario's ``outcome:`` section) instead of assuming a support desk:

* **declared** (:attr:`OutcomeSpec.topics` set): an item's outcome is the last message on
  one of those topics naming it by :attr:`OutcomeSpec.key`; its decision is the payload's
  :attr:`OutcomeSpec.fields`. A record the input refused (published on the input's malformed
  topic, naming the record by ``key``) is decided :attr:`OutcomeSpec.rejected` in every
  field, which is how labels mark the records a team should refuse.
* **default** (nothing declared): an item is an input message (named by the input's key
  field), its outcome the last message of its causal tree on a *leaf* topic (one no agent
  subscribes to: where the team's work ends), and its decision the fields that outcome's
  payload adds to or changes from the input's. Good enough to diff two runs of an unknown
  team; a team that wants to be scored declares its outcome.

Scoring compares each decision field with the same field of the item's label (a mapping);
a label that is a single value is compared with the first decision field. Values compare
as text (``str``), so a label read from JSON and a payload built in Python agree.

Costs, measured on the support pipeline (600 emails, ~6,000 messages): a declared
:class:`Outcomes` is one cached dict lookup per published message and one small dict per
item; the default keeps, per item, the last payload per topic of its tree (a few refs).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bus import Envelope, matches

__all__ = [
    "DEFAULT_MAX_ITEMS",
    "REFUSED",
    "OutcomeScore",
    "OutcomeSpec",
    "Outcomes",
    "decision_text",
    "label_decision",
    "score_decisions",
]

#: Items an :class:`Outcomes` follows before it stops taking new ones (counted in
#: ``dropped``): a generator input may never end, and a run must not grow without bound.
DEFAULT_MAX_ITEMS = 1_000_000
#: Topics whose kind (outcome, malformed, other) is cached; past it, kinds are recomputed.
_MAX_CACHED_TOPICS = 10_000

Decision = dict[str, str]
#: The one field of a refused record's decision when the team declares no decision fields.
REFUSED = "refused"


def _text(value: Any) -> str:
    """A decision value as text: strings as they are, anything else as compact JSON, so a
    ``True`` and a ``"True"`` stay apart and equal structures compare equal."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        return repr(value)


def decision_text(decision: Mapping[str, str] | None, fields: Iterable[str] = ()) -> str:
    """How a decision reads in a sentence: ``hold`` for one field, ``action=hold, queue=ap``
    for several (in ``fields`` order, then the rest), ``-`` for no decision."""
    if not decision:
        return "-"
    order = [f for f in fields if f in decision] + [f for f in decision if f not in fields]
    if len(order) == 1:
        return decision[order[0]]
    return ", ".join(f"{f}={decision[f]}" for f in order)


@dataclass(frozen=True, slots=True)
class OutcomeSpec:
    """What an item's outcome is for one team (a scenario's ``outcome:`` section).

    ``topics`` empty means the default described in the module docstring. ``key`` names
    the item in an outcome's payload (default: the input's key field, ``input_key``);
    ``fields`` are the decision (empty in a declared spec: the whole payload but the key);
    ``topic`` among them is the outcome message's topic (unless the payload has a field of
    that name), for a team that decides by where it sends an item.
    ``malformed_topic`` is where the input publishes records it refused, each decided
    ``rejected``."""

    topics: tuple[str, ...] = ()
    key: str = "id"
    fields: tuple[str, ...] = ()
    input_key: str = "id"
    malformed_topic: str | None = None
    rejected: str = "reject"

    @property
    def declared(self) -> bool:
        return bool(self.topics)

    @property
    def noun(self) -> str:
        """What an item is called in a sentence: ``invoice`` for ``invoice_id``, ``item``
        for a key that says nothing (``id``, ``key``)."""
        stem = self.key.removesuffix("_id").removesuffix("_key").replace("_", " ")
        return stem if stem and stem not in (self.key, "id", "key") else "item"

    def what_changed(self) -> str:
        """The decision's name in a headline: ``action``, ``action and queue``, ``outcome``."""
        if not self.fields:
            return "outcome"
        if len(self.fields) == 1:
            return self.fields[0]
        return ", ".join(self.fields[:-1]) + " and " + self.fields[-1]


@dataclass(frozen=True, slots=True)
class OutcomeScore:
    """How many decided items had a label, and the share right per decision field.

    ``correct`` counts items right in every field scored; ``by_field`` field -> (right,
    scored)."""

    decided: int
    scored: int
    correct: int
    by_field: dict[str, tuple[int, int]] = field(default_factory=dict)
    unnamed: int = 0
    """Outcomes that named no item (a refused record with no key): never scored."""

    @property
    def unlabelled(self) -> int:
        """Outcomes with nothing to score them against: no label, or no item named."""
        return self.decided - self.scored + self.unnamed

    @property
    def accuracy(self) -> float | None:
        """Items right in every field, over the labelled items decided; None without labels."""
        return self.correct / self.scored if self.scored else None

    def field_accuracy(self, name: str) -> float | None:
        right, scored = self.by_field.get(name, (0, 0))
        return right / scored if scored else None

    def as_report(self) -> dict[str, Any]:
        """The run summary's ``accuracy`` block: ``scored``, ``unlabelled``, ``accuracy``
        and one ``<field>_accuracy`` per decision field (``action_accuracy`` for a team
        deciding an ``action``, which is what ``min_accuracy`` judges)."""
        out: dict[str, Any] = {
            "scored": self.scored,
            "unlabelled": self.unlabelled,
            "accuracy": self.accuracy,
        }
        for name in self.by_field:
            out[f"{name}_accuracy"] = self.field_accuracy(name)
        return out


def _wanted(label: Any, fields: tuple[str, ...], decision: Mapping[str, str]) -> dict[str, str]:
    """What an item's label says each scored field should be (empty: nothing to score): the
    declared fields, or every field of the label when none is declared (a decision missing
    one is wrong, not unscored)."""
    if label is None:
        return {}
    if isinstance(label, Mapping):
        return {f: _text(label[f]) for f in (fields or label) if label.get(f) is not None}
    first = fields[0] if fields else next(iter(decision), None)
    return {} if first is None else {first: _text(label)}


def label_decision(
    label: Any, fields: tuple[str, ...] = (), decision: Mapping[str, str] | None = None
) -> dict[str, str]:
    """An item's label as the decision it expects, field by field, in the text decisions are
    compared in (what a diff shows as an item's expected outcome)."""
    return _wanted(label, fields, decision or {})


def _rights(decision: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, bool]:
    """Each wanted field: right or not. A refused record with no declared fields
    (``{REFUSED: rejected}``) answers every field with its refusal."""
    refused = decision.get(REFUSED) if len(decision) == 1 else None
    return {f: decision.get(f, refused) == want for f, want in wanted.items()}


def score_decisions(
    decisions: Mapping[str, Mapping[str, str]],
    labels: Mapping[str, Any],
    fields: Iterable[str] = (),
    *,
    unnamed: int = 0,
) -> OutcomeScore:
    """Score ``decisions`` (item -> field -> value) against ``labels`` (item -> label).

    A label that is a mapping scores each decision field it has; any other label scores
    the first of ``fields`` (or of the decision's own fields). An item whose label scores
    no field counts as unlabelled."""
    order = tuple(fields)
    by_field: dict[str, list[int]] = {f: [0, 0] for f in order}
    scored = correct = 0
    for item, decision in decisions.items():
        wanted = _wanted(labels.get(item), order, decision)
        if not wanted:
            continue
        scored += 1
        ok = True
        for name, right in _rights(decision, wanted).items():
            counts = by_field.setdefault(name, [0, 0])
            counts[0] += right
            counts[1] += 1
            ok = ok and right
        correct += ok
    return OutcomeScore(
        decided=len(decisions),
        scored=scored,
        correct=correct,
        by_field={f: (c[0], c[1]) for f, c in by_field.items() if c[1]},
        unnamed=unnamed,
    )


class Outcomes:
    """Follows a run's messages and keeps each item's decision (see the module docstring).

    A bus observer (``bus.observe(outcomes)``: :meth:`on_publish` sees every message as it
    is published) in a live run; fed stored envelopes in publish order (:meth:`see`) for a
    recorded one, so a run and its record are read the same way. Bounded by ``max_items``.
    """

    __slots__ = (
        "_inputs",
        "_kinds",
        "_last",
        "_right",
        "_trail",
        "dropped",
        "labels",
        "max_items",
        "right",
        "spec",
        "tally",
        "unnamed",
    )

    def __init__(
        self,
        spec: OutcomeSpec,
        labels: Mapping[str, Any] | None = None,
        *,
        max_items: int = DEFAULT_MAX_ITEMS,
    ) -> None:
        self.spec = spec
        self.labels: Mapping[str, Any] = labels if labels is not None else {}
        self.max_items = max_items
        #: Items dropped once ``max_items`` were followed.
        self.dropped = 0
        #: Outcomes (and refused records) that named no item.
        self.unnamed = 0
        #: Declared: items per decision (as :func:`decision_text` words it), kept as
        #: outcomes arrive, for a live view that must not rescan every item each time.
        self.tally: Counter[str] = Counter()
        #: Declared: labelled item -> whether its decision is right, and how many are.
        self._right: dict[str, bool] = {}
        self.right = 0
        self._kinds: dict[str, int] = {}
        #: Declared: item -> its decision so far.
        self._last: dict[str, Decision] = {}
        #: Default: root envelope id -> (item, input payload); item -> topic -> payload.
        self._inputs: dict[int, tuple[str, Mapping[str, Any]]] = {}
        self._trail: dict[str, dict[str, Any]] = {}

    # kinds of topic: 0 other, 1 outcome, 2 malformed
    def _kind(self, topic: str) -> int:
        kind = self._kinds.get(topic)
        if kind is None:
            spec = self.spec
            if topic == spec.malformed_topic:
                kind = 2
            elif any(matches(p, topic) for p in spec.topics):
                kind = 1
            else:
                kind = 0
            if len(self._kinds) < _MAX_CACHED_TOPICS:
                self._kinds[topic] = kind
        return kind

    def on_publish(self, env: Envelope) -> None:
        # A declared outcome ignores most of a run's messages: one dict lookup says so.
        if self._kinds.get(env.topic) == 0 and self.spec.declared:
            return
        self.see(env.topic, env.payload, env.id, env.causation_id, env.correlation_id)

    def see(
        self,
        topic: str,
        payload: Any,
        env_id: int,
        causation_id: int | None,
        correlation_id: int | None,
    ) -> None:
        """One published message, in publish order."""
        if not isinstance(payload, Mapping):
            return
        kind = self._kind(topic)
        spec = self.spec
        if kind == 2:
            key = payload.get("key")
            if key is None:
                self.unnamed += 1
            else:
                self._decide(str(key), None)
            return
        if spec.declared:
            if kind == 1:
                key = payload.get(spec.key)
                if key is None:
                    self.unnamed += 1
                else:
                    self._decide(str(key), payload, topic)
            return
        if causation_id is None:
            key = payload.get(spec.input_key)
            if key is None:
                return
            if len(self._inputs) < self.max_items:
                self._inputs[env_id] = (str(key), payload)
            else:
                self.dropped += 1
            return
        root = self._inputs.get(correlation_id) if correlation_id is not None else None
        if root is not None:
            trail = self._trail.setdefault(root[0], {})
            trail.pop(topic, None)  # re-insert: the dict's order is the order of last publish
            trail[topic] = payload

    def _decide(self, item: str, payload: Mapping[str, Any] | None, topic: str = "") -> None:
        last = self._last
        before = last.get(item)
        if before is None and len(last) >= self.max_items:
            self.dropped += 1
            return
        spec = self.spec
        if payload is None:
            decision = dict.fromkeys(spec.fields or (REFUSED,), spec.rejected)
        elif spec.fields:
            # ``topic`` is the outcome's own topic unless the payload has such a field: a
            # team that decides by where it sends an item (ticket.urgent, ticket.normal).
            decision = {
                f: _text(payload[f]) if f in payload else topic
                for f in spec.fields
                if f in payload or f == "topic"
            }
        else:
            decision = {f: _text(v) for f, v in payload.items() if f != spec.key}
        last[item] = decision
        if not spec.declared:
            return
        tally = self.tally
        if before is not None:
            old = decision_text(before, spec.fields)
            tally[old] -= 1
            if not tally[old]:
                del tally[old]
        tally[decision_text(decision, spec.fields)] += 1
        wanted = _wanted(self.labels.get(item), spec.fields, decision)
        if wanted:
            ok = all(_rights(decision, wanted).values())
            self.right += ok - self._right.get(item, False)
            self._right[item] = ok

    def live(self) -> tuple[int, int, int]:
        """(decided, labelled, right) so far, without rescanning: a declared outcome's
        running count for a live view (the default outcome is known only at the end)."""
        return len(self._last), len(self._right), self.right

    def decisions(self, leaf: Callable[[str], bool] | None = None) -> dict[str, Decision]:
        """Item -> decision. ``leaf(topic)`` says where a team's work ends, for the default
        (see the module docstring); without it every topic counts."""
        if self.spec.declared:
            return dict(self._last)
        out: dict[str, Decision] = dict(self._last)  # refused records
        roots = {item: payload for item, payload in self._inputs.values()}
        for item, trail in self._trail.items():
            topics = [t for t in trail if leaf is None or leaf(t)]
            if not topics:
                continue
            payload = trail[topics[-1]]
            given = roots.get(item, {})
            out[item] = {
                f: _text(v)
                for f, v in payload.items()
                if f != self.spec.input_key and (f not in given or given[f] != v)
            }
        return out

    def score(self, leaf: Callable[[str], bool] | None = None) -> OutcomeScore:
        """This run's decisions against its labels."""
        return score_decisions(
            self.decisions(leaf), self.labels, self.spec.fields, unnamed=self.unnamed
        )
