"""What a team decided, item by item, and how two sessions' decisions differ.

A hop-by-hop diff says where two runs first part ways; after a what-if replay the question
is rather *which items* ended differently, and whether that was better. An item's decision
is the ``action`` of its outcome on ``action.executed`` (what the Actor did), keyed by the
Actor's ``key`` setting (``email_id`` for the support desk); a record the input refused is
decided ``reject`` (as the Learner scores it). Accuracy is measured against the scenario
input's labels, read from the input file the scenario names (the Learner's own measure,
recomputed from the record, so a replay that served the Learner's effects is scored too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pantheon.sessions import SessionInfo, SessionStore

__all__ = ["DecisionChange", "DecisionDiff", "Decisions", "diff_decisions", "session_decisions"]

#: Where the support desk's Actor reports each item it acted on.
OUTCOME_TOPIC = "action.executed"
#: What a refused input record counts as (the Learner's ``reject`` label).
REJECTED = "reject"


@dataclass(frozen=True, slots=True)
class Decisions:
    """One session's decisions: ``actions`` item -> action (the last outcome for an item
    decided twice), ``expected`` item -> labelled action, ``key`` the item field."""

    session: str
    key: str
    actions: dict[str, str]
    expected: dict[str, str]

    @property
    def noun(self) -> str:
        """What an item is called in a sentence: ``email`` for ``email_id``."""
        stem = self.key.removesuffix("_id")
        return stem if stem and stem != self.key else "item"

    @property
    def scored(self) -> int:
        return sum(1 for item in self.actions if item in self.expected)

    @property
    def correct(self) -> int:
        return sum(1 for item, a in self.actions.items() if self.expected.get(item) == a)

    @property
    def accuracy(self) -> float | None:
        """Decisions that match their label, over the labelled items decided; None without
        labels."""
        return self.correct / self.scored if self.scored else None


@dataclass(frozen=True, slots=True)
class DecisionChange:
    """One item decided differently: ``before`` in A, ``after`` in B (``None`` where that
    session did not decide it), ``expected`` its label (or None)."""

    item: str
    before: str | None
    after: str | None
    expected: str | None

    @property
    def fixed(self) -> bool:
        return self.expected is not None and self.after == self.expected

    @property
    def broken(self) -> bool:
        return self.expected is not None and self.before == self.expected

    def to_dict(self) -> dict[str, Any]:
        return {
            "item": self.item,
            "before": self.before,
            "after": self.after,
            "expected": self.expected,
        }


@dataclass(frozen=True, slots=True)
class DecisionDiff:
    """Session B's decisions against A's: every item that changed, grouped by
    ``before→after``, and each session's accuracy."""

    a: Decisions
    b: Decisions
    changes: list[DecisionChange] = field(default_factory=list)

    @property
    def groups(self) -> list[tuple[str, str, list[str]]]:
        """(before, after, items), largest group first; ``-`` for not decided."""
        by: dict[tuple[str, str], list[str]] = {}
        for c in self.changes:
            by.setdefault((c.before or "-", c.after or "-"), []).append(c.item)
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
        """``34 emails changed action: 30 escalate→ticket, 4 reply→escalate``."""
        n = len(self.changes)
        noun = self.a.noun + ("" if n == 1 else "s")
        if not n:
            return f"no {self.a.noun} changed action"
        parts = ", ".join(f"{len(items)} {b}→{a}" for b, a, items in self.groups)
        return f"{n} {noun} changed action: {parts}"

    def accuracy_line(self) -> str:
        """``accuracy 0.650 -> 0.741 (+54 right, -0 wrong)``, or why there is none."""
        acc_a, acc_b = self.a.accuracy, self.b.accuracy
        if acc_a is None and acc_b is None:
            return "accuracy: no labels to score against"
        return (
            f"accuracy {_pct(acc_a)} -> {_pct(acc_b)} "
            f"({len(self.fixed)} fixed, {len(self.broken)} broken)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a.session,
            "b": self.b.session,
            "key": self.a.key,
            "changed": len(self.changes),
            "headline": self.headline(),
            "groups": [{"before": b, "after": a, "items": items} for b, a, items in self.groups],
            "changes": [c.to_dict() for c in self.changes],
            "fixed": self.fixed,
            "broken": self.broken,
            "accuracy_a": self.a.accuracy,
            "accuracy_b": self.b.accuracy,
            "decided_a": len(self.a.actions),
            "decided_b": len(self.b.actions),
        }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _team_shape(info: SessionInfo) -> tuple[str, str | None, dict[str, Any]]:
    """The item key, the malformed-input topic and the labels, from the recorded scenario
    (``email_id``, no topic and no labels when it cannot be read)."""
    from agents import Actor
    from pantheon._inputs import jsonl_labels
    from pantheon.scenario import (
        FileInputConfig,
        JsonlInputConfig,
        ScenarioError,
        parse_scenario,
    )
    from pantheon.scenario._agents import agent_class

    key, malformed = "email_id", None
    labels: dict[str, Any] = {}
    if not info.scenario_text:
        return key, malformed, labels
    base = None if info.scenario_dir is None else Path(info.scenario_dir)
    try:
        scenario = parse_scenario(info.scenario_text, base_dir=base, check_files=False)
    except ScenarioError:
        return key, malformed, labels
    for name, cfg in scenario.agents.items():
        if cfg.enabled and issubclass(agent_class(name, cfg), Actor):
            key = str(cfg.settings.get("key", key))
            break
    inp = scenario.input
    malformed = getattr(inp, "malformed_topic", None)
    if isinstance(inp, JsonlInputConfig | FileInputConfig):
        labels = jsonl_labels(inp)
    return key, malformed, labels


def session_decisions(store: SessionStore, session: str) -> Decisions:
    """Every item ``session`` (an id or unique prefix) decided, and its labels."""
    info = store.session(session)
    key, malformed, labels = _team_shape(info)
    actions: dict[str, str] = {}
    for env in store.envelopes(info.id):
        payload = env.payload
        if not isinstance(payload, Mapping):
            continue
        if env.topic == OUTCOME_TOPIC and key in payload and "action" in payload:
            actions[str(payload[key])] = str(payload["action"])
        elif malformed is not None and env.topic == malformed and payload.get("key") is not None:
            actions[str(payload["key"])] = REJECTED
    expected = {
        str(k): str(v["action"])
        for k, v in labels.items()
        if isinstance(v, Mapping) and v.get("action") is not None
    }
    return Decisions(info.id, key, actions, expected)


def diff_decisions(store: SessionStore, a: str, b: str) -> DecisionDiff:
    """Session ``b``'s decisions against ``a``'s (ids or unique prefixes)."""
    da, db = session_decisions(store, a), session_decisions(store, b)
    expected = da.expected or db.expected
    changes = [
        DecisionChange(item, da.actions.get(item), db.actions.get(item), expected.get(item))
        for item in sorted(set(da.actions) | set(db.actions))
        if da.actions.get(item) != db.actions.get(item)
    ]
    return DecisionDiff(da, db, changes)
