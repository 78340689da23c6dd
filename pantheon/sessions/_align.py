"""Hop-by-hop alignment of two runs of the same team, shared by replay and diff.

Two runs never share envelope ids, so messages are matched by lineage:

* outside inputs (``causation_id`` and ``source`` both None, topic not ``system.*``) match
  in recorded order per topic: the k-th input on a topic in one run is the k-th on that
  topic in the other (one input stream never pairs with another's: the malformed records,
  a gateway client's messages and a Monitor's sampled alerts interleave with the input
  as timing and placement had it);
* any other message is identified by its parent and the subscriber that emitted it: the
  k-th message that subscriber ``S`` emitted while handling ``X`` in the original matches
  the k-th message ``S`` emitted while handling ``match(X)`` in the other run. Keying by
  emitter as well as parent keeps two subscribers of one message, whose handlers interleave
  by scheduling, from being paired with each other's output.

``system.*`` messages (breaker transitions the bus publishes) are timing-driven, so they
are recorded but neither matched nor compared, and neither is anything they cause (a
Monitor's alert on a breaker event); their effect on deliveries shows up as a delivery
outcome (``circuit_open``), which is compared. A message published twice with the
same id (a dead-letter redrive) is aligned once, at its first publish.

A Monitor's alerts from its samples of the bus (``monitor.alert.*`` that no handling
caused: queue depth, new dead letters) depend on timing and on which process the Monitor
shares a bus with, just as ``system.*`` messages do. A re-run feeds the original's again,
so they align with them; two runs of their own (``pantheon diff``) are compared without
them and what they caused (``Lineage(samples=False)``), counted apart as ``sampled``.

The first divergence is the earliest one in the original's publish order: a difference in
a message (``topic``/``payload``) or a ``missing`` one sorts at that message, an ``effect``
or ``outcome`` difference right after the message whose handling it belongs to, an
``extra`` message right after the last original sibling it would have followed
(an outcome difference sorts before an extra message under the same parent: it is the
cause, the extra message the consequence).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pantheon.sessions._errors import ReplayDivergence
from pantheon.sessions._store import StoredDelivery, StoredEffect, StoredEnvelope

__all__ = [
    "LEFT_OUT",
    "WATCHER_PREFIX",
    "Comparison",
    "FailureMatch",
    "Lineage",
    "Mapper",
    "compare_runs",
    "effect_internal",
    "is_input",
    "is_sample",
    "is_system",
    "item_of",
    "payload_diff",
    "same_payload",
]

SYSTEM_PREFIX = "system."
#: Topics of the built-in Monitor's alerts (``agents.Monitor``): ``monitor.alert.<kind>``.
#: Those no handling caused are its samples of the bus (:func:`is_sample`).
MONITOR_ALERT_PREFIX = "monitor.alert."
#: Subscriptions named with this prefix watch the team from outside (the gateway's
#: WebSocket and SSE clients): what they received is recorded, but it is not the team's
#: behaviour and a replay has no such watchers, so it is never compared.
WATCHER_PREFIX = "watcher."
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def is_system(topic: str) -> bool:
    return topic.startswith(SYSTEM_PREFIX)


def in_system_tree(env: Any, system: set[int]) -> bool:
    """Whether ``env`` is a ``system.*`` message or caused by one, remembering it in
    ``system`` (fed in publish order, so a parent is always seen before its children)."""
    if is_system(env.topic) or (env.causation_id is not None and env.causation_id in system):
        system.add(env.id)
        return True
    return False


def is_input(env: Any) -> bool:
    return env.causation_id is None and env.source is None and not is_system(env.topic)


def is_sample(env: Any) -> bool:
    """Whether ``env`` is a Monitor's alert from a sample of the bus (a ``monitor.alert.*``
    no handling caused): its alerts on ``system.*`` events are caused by them."""
    return (
        env.causation_id is None
        and env.source is None
        and env.topic.startswith(MONITOR_ALERT_PREFIX)
    )


def in_sample_tree(env: Any, sampled: set[int]) -> bool:
    """Whether ``env`` is a Monitor's sampled alert or caused by one, remembering it in
    ``sampled`` (fed in publish order, as :func:`in_system_tree`)."""
    if is_sample(env) or (env.causation_id is not None and env.causation_id in sampled):
        sampled.add(env.id)
        return True
    return False


def effect_internal(envelopes: Iterable[Any], effects: Iterable[StoredEffect]) -> set[int]:
    """Ids of messages published *by an effect* (e.g. a ``bus.request`` made inside
    ``effect(...)``), and everything they caused.

    A replay serves the effect instead of running it, so those messages do not exist there:
    they are left out of the alignment on both sides. A message is the effect's when its
    handler (same causing envelope, same subscriber) published it while the effect ran."""
    windows: dict[tuple[int, str | None], list[tuple[int, int]]] = defaultdict(list)
    for e in effects:
        if e.envelope_id and e.ended_ns > e.started_ns:
            windows[(e.envelope_id, e.subscriber)].append((e.started_ns, e.ended_ns))
    out: set[int] = set()
    if not windows:
        return out
    for env in envelopes:
        parent = env.causation_id
        if parent is None:
            continue
        if parent in out:
            out.add(env.id)
            continue
        spans = windows.get((parent, env.source))
        created = getattr(env, "created_ns", None)
        if created is None:
            created = env.created
        if spans and any(a <= created <= b for a, b in spans):
            out.add(env.id)
    return out


#: Why :class:`Lineage` leaves a recorded message out of an alignment, in words.
LEFT_OUT = {
    # The bus's own messages (a breaker opening: ``system.breaker.<agent>``) and what they
    # caused: they say how a run went, not what the team decided.
    "system": "system.* and what they caused",
    # A Monitor's alerts from its samples of the bus, and what they caused: when a sample
    # fell and what its bus held (its own process's) made them, not the team's decisions.
    "sampled": "sampled Monitor alerts and what they caused",
    # Messages an effect published (a Memory lookup's request): a replay serves the
    # effect's answer and does not publish them again.
    "effect": "published by effects",
    # The same message (same id) published again: only its first publish is aligned.
    "repeated": "repeats",
}


class Lineage:
    """One run's envelopes indexed for alignment: first publishes only, nothing a
    ``system.*`` message is or caused, no messages an effect published (see
    :func:`effect_internal`). ``left_out`` counts the rest by why (:data:`LEFT_OUT`), so
    a reader that says how many messages were compared can say why the others were not.

    ``samples``: whether a Monitor's sampled alerts (:func:`is_sample`) are aligned, as
    inputs; a re-run, which feeds the original's again, aligns them; a comparison of two
    runs of their own leaves them and what they caused out (``sampled``), since when they
    came, and whether, was timing's and placement's."""

    def __init__(
        self,
        envelopes: Iterable[StoredEnvelope],
        effects: Iterable[StoredEffect] = (),
        *,
        samples: bool = True,
    ) -> None:
        self.samples = samples
        envelopes = list(envelopes)
        self.internal = effect_internal(envelopes, effects)
        self.envelopes: list[StoredEnvelope] = []
        self.by_id: dict[int, StoredEnvelope] = {}
        self.inputs: list[StoredEnvelope] = []
        self.children: dict[tuple[int, str | None], list[StoredEnvelope]] = defaultdict(list)
        #: Each message's outside input (None when its chain leaves the session).
        self.root: dict[int, int | None] = {}
        #: Messages not aligned, by why: ``repeated``, ``effect``, ``system`` (LEFT_OUT).
        self.left_out: Counter[str] = Counter()
        system: set[int] = set()
        sampled: set[int] = set()
        for env in envelopes:
            if env.id in self.by_id:
                self.left_out["repeated"] += 1
                continue
            if env.id in self.internal:
                self.left_out["effect"] += 1
                continue
            if in_system_tree(env, system):
                self.left_out["system"] += 1
                continue
            if not samples and in_sample_tree(env, sampled):
                self.left_out["sampled"] += 1
                continue
            self.by_id[env.id] = env
            self.envelopes.append(env)
            if is_input(env):
                self.inputs.append(env)
                self.root[env.id] = env.id
            else:
                assert env.causation_id is not None or env.source is not None
                parent = env.causation_id if env.causation_id is not None else 0
                self.children[(parent, env.source)].append(env)
                self.root[env.id] = self.root.get(parent)


@dataclass(slots=True)
class Mapper:
    """Feeds a second run's envelopes, in publish order, onto an original :class:`Lineage`.

    ``inputs`` are the original inputs the second run re-published, in order (all of them by
    default); the k-th input the second run publishes on a topic matches the k-th of them
    on that topic. ``feed`` returns the matched original envelope, or None for an extra
    message (and for duplicates, ``system.*`` and, when the original's lineage leaves them
    out, a Monitor's sampled alerts, which it ignores)."""

    original: Lineage
    inputs: Sequence[StoredEnvelope] | None = None
    to_original: dict[int, int] = field(default_factory=dict)
    to_new: dict[int, int] = field(default_factory=dict)
    extras: list[tuple[Any, float]] = field(default_factory=list)
    #: Ids of the second run's messages to leave out (its effect-internal ones).
    skip: set[int] = field(default_factory=set)
    _counts: dict[tuple[int, str | None], int] = field(default_factory=dict)
    #: The original inputs per topic, in order, and how many of each the second run fed.
    _by_topic: dict[str, list[StoredEnvelope]] = field(default_factory=dict)
    _n_inputs: dict[str, int] = field(default_factory=dict)
    _extra_inputs: int = 0
    _seen: set[int] = field(default_factory=set)
    _system: set[int] = field(default_factory=set)
    _sampled: set[int] = field(default_factory=set)

    def effect_own(self, env: Any, active: Mapping[tuple[int, str | None], Any]) -> bool:
        """True (and ``env`` left out from now on) when ``env`` was published by a live
        effect (a Memory lookup's request) rather than by a handler: such messages belong to
        the effect, have no original to align with, and neither do the messages they cause.
        ``active`` is the effects runner's map of the (cause, agent) pairs it is running."""
        parent = env.causation_id
        if parent is not None and (parent in self.skip or (parent, env.source) in active):
            self.skip.add(env.id)
            return True
        return False

    def __post_init__(self) -> None:
        if self.inputs is None:
            self.inputs = self.original.inputs
        for inp in self.inputs:
            self._by_topic.setdefault(inp.topic, []).append(inp)

    def feed(self, env: Any) -> StoredEnvelope | None:
        """Align one envelope (anything with id/topic/causation_id/source)."""
        if env.id in self._seen or env.id in self.skip or in_system_tree(env, self._system):
            return None
        if not self.original.samples and in_sample_tree(env, self._sampled):
            return None
        self._seen.add(env.id)
        assert self.inputs is not None
        if is_input(env):
            k = self._n_inputs.get(env.topic, 0)
            self._n_inputs[env.topic] = k + 1
            stream = self._by_topic.get(env.topic, ())
            if k < len(stream):
                return self._match(env, stream[k])
            last = self.inputs[-1].seq if self.inputs else -1
            self.extras.append((env, last + 0.5 + self._extra_inputs * 1e-6))
            self._extra_inputs += 1
            return None
        parent_new = env.causation_id if env.causation_id is not None else 0
        parent = self.to_original.get(parent_new) if parent_new else 0
        if parent is None:
            # Its parent was itself extra: that is the divergence that matters.
            self.extras.append((env, float("inf")))
            return None
        key = (parent_new, env.source)
        k = self._counts.get(key, 0)
        self._counts[key] = k + 1
        siblings = self.original.children.get((parent, env.source), ())
        if k < len(siblings):
            return self._match(env, siblings[k])
        anchor = siblings[-1].seq if siblings else self.original.by_id[parent].seq if parent else -1
        self.extras.append((env, anchor + 0.5 + k * 1e-6))
        return None

    def _match(self, env: Any, orig: StoredEnvelope) -> StoredEnvelope:
        self.to_original[env.id] = orig.id
        self.to_new[orig.id] = env.id
        return orig


def same_payload(a: StoredEnvelope, b: StoredEnvelope) -> bool:
    if a.payload_repr or b.payload_repr:
        # A repr carries object addresses that differ from run to run.
        return (
            a.payload_repr == b.payload_repr
            and isinstance(a.payload, str)
            and isinstance(b.payload, str)
            and _ADDRESS.sub("", a.payload) == _ADDRESS.sub("", b.payload)
        )
    return bool(a.payload == b.payload)


def payload_diff(expected: Any, actual: Any, path: str = "payload", limit: int = 20) -> list[str]:
    """Readable differences between two decoded payloads, one line per differing path."""
    out: list[str] = []
    _diff(expected, actual, path, out, limit)
    return out


def _diff(a: Any, b: Any, path: str, out: list[str], limit: int) -> None:
    if len(out) >= limit:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            sub = (
                f"{path}.{key}"
                if isinstance(key, str) and key.isidentifier()
                else f"{path}[{key!r}]"
            )
            if key not in b:
                out.append(f"{sub}: {_r(a[key])} -> (missing)")
            elif key not in a:
                out.append(f"{sub}: (missing) -> {_r(b[key])}")
            else:
                _diff(a[key], b[key], sub, out, limit)
        return
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            sub = f"{path}[{i}]"
            if i >= len(b):
                out.append(f"{sub}: {_r(a[i])} -> (missing)")
            elif i >= len(a):
                out.append(f"{sub}: (missing) -> {_r(b[i])}")
            else:
                _diff(a[i], b[i], sub, out, limit)
        return
    if a != b or type(a) is not type(b):
        out.append(f"{path}: {_r(a)} -> {_r(b)}")


def _r(v: Any, limit: int = 80) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class FailureMatch:
    """A delivery that failed in the original and failed the same way in the other run."""

    original_id: int
    replay_id: int
    subscriber: str
    outcome: str
    error_type: str | None
    error: str | None
    topic: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "original_id": self.original_id,
            "replay_id": self.replay_id,
            "subscriber": self.subscriber,
            "outcome": self.outcome,
            "error_type": self.error_type,
            "error": self.error,
            "topic": self.topic,
        }


@dataclass(slots=True)
class Comparison:
    """``divergence`` is the first of ``divergences`` (every one found, in the original's
    order)."""

    pairs: list[tuple[StoredEnvelope, StoredEnvelope]]
    divergence: ReplayDivergence | None
    failures: list[FailureMatch]
    mapper: Mapper
    divergences: list[ReplayDivergence] = field(default_factory=list)


def _outcomes(
    deliveries: Iterable[StoredDelivery],
) -> dict[int, dict[str, list[tuple[str, str | None, str | None]]]]:
    out: dict[int, dict[str, list[tuple[str, str | None, str | None]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for d in deliveries:
        if not d.subscriber.startswith(WATCHER_PREFIX):
            out[d.envelope_id][d.subscriber].append((d.outcome, d.error_type, d.error))
    return out


def _effect_names(effects: Iterable[StoredEffect]) -> dict[int, dict[str | None, list[str]]]:
    """Effect names per envelope and subscriber, in ordinal order (outside-handler effects,
    envelope 0, are not compared)."""
    out: dict[int, dict[str | None, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
    for e in effects:
        if e.envelope_id:
            out[e.envelope_id][e.subscriber].append((e.ordinal, e.name))
    return {
        env: {sub: [name for _, name in sorted(v)] for sub, v in subs.items()}
        for env, subs in out.items()
    }


def compare_runs(
    original: Lineage,
    new_envelopes: Iterable[StoredEnvelope],
    *,
    original_deliveries: Iterable[StoredDelivery],
    new_deliveries: Iterable[StoredDelivery],
    original_effects: Iterable[StoredEffect],
    new_effects: Iterable[StoredEffect],
    inputs: Sequence[StoredEnvelope] | None = None,
    roots: set[int] | None = None,
) -> Comparison:
    """Align ``new_envelopes`` onto ``original`` and find the first divergence.

    ``inputs``: the original inputs the new run re-published, in order (default all);
    ``roots``: only messages descending from these original inputs can be ``missing``
    (default: every input in ``inputs``)."""
    new_envelopes = list(new_envelopes)
    new_effects = list(new_effects)
    mapper = Mapper(original, inputs, skip=effect_internal(new_envelopes, new_effects))
    pairs: list[tuple[StoredEnvelope, StoredEnvelope]] = []
    for env in new_envelopes:
        orig = mapper.feed(env)
        if orig is not None:
            pairs.append((orig, env))
    if roots is None:
        roots = {e.id for e in (mapper.inputs or ())}
    candidates: list[tuple[float, int, ReplayDivergence]] = []

    def add(key: float, div: ReplayDivergence) -> None:
        candidates.append((key, len(candidates), div))

    for orig, new in pairs:
        if orig.topic != new.topic:
            add(
                orig.seq,
                ReplayDivergence(
                    "topic", original_id=orig.id, replay_id=new.id, agent=orig.source,
                    expected=orig.topic, actual=new.topic, topic=orig.topic,
                ),
            )  # fmt: skip
        elif not same_payload(orig, new):
            detail = None
            if orig.payload_repr and not new.payload_repr:
                detail = "the original payload could not be stored (kept as its repr)"
            add(
                orig.seq,
                ReplayDivergence(
                    "payload", original_id=orig.id, replay_id=new.id, agent=orig.source,
                    expected=orig.payload, actual=new.payload, topic=orig.topic,
                    diff=payload_diff(orig.payload, new.payload), detail=detail,
                ),
            )  # fmt: skip
    for env, key in mapper.extras:
        add(
            key,
            ReplayDivergence(
                "extra", original_id=None, replay_id=env.id, agent=env.source,
                expected=None, actual={"topic": env.topic, "payload": env.payload},
                topic=env.topic,
            ),
        )  # fmt: skip
    for orig in original.envelopes:
        if orig.id not in mapper.to_new and original.root.get(orig.id) in roots:
            add(
                orig.seq,
                ReplayDivergence(
                    "missing", original_id=orig.id, replay_id=None, agent=orig.source,
                    expected={"topic": orig.topic, "payload": orig.payload}, actual=None,
                    topic=orig.topic,
                ),
            )  # fmt: skip

    o_eff = _effect_names(original_effects)
    n_eff = _effect_names(new_effects)
    o_out = _outcomes(original_deliveries)
    n_out = _outcomes(new_deliveries)
    failures: list[FailureMatch] = []
    for orig, new in pairs:
        a_eff = o_eff.get(orig.id, {})
        b_eff = n_eff.get(new.id, {})
        for sub in sorted(set(a_eff) | set(b_eff), key=str):
            a = a_eff.get(sub, [])
            b = b_eff.get(sub, [])
            if a != b:
                i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
                i = min(len(a), len(b)) if i is None else i
                add(
                    orig.seq + 0.2,
                    ReplayDivergence(
                        "effect", original_id=orig.id, replay_id=new.id, agent=sub,
                        expected=a[i] if i < len(a) else None,
                        actual=b[i] if i < len(b) else None, topic=orig.topic,
                        detail=f"effect #{i} while handling this message",
                    ),
                )  # fmt: skip
        a_subs = o_out.get(orig.id, {})
        b_subs = n_out.get(new.id, {})
        for sub in sorted(set(a_subs) | set(b_subs)):
            a_list = a_subs.get(sub, [])
            b_list = b_subs.get(sub, [])
            a_key = [(o, t) for o, t, _ in a_list]
            b_key = [(o, t) for o, t, _ in b_list]
            if a_key != b_key:
                add(
                    orig.seq + 0.3,
                    ReplayDivergence(
                        "outcome", original_id=orig.id, replay_id=new.id, agent=sub,
                        expected=_describe(a_list), actual=_describe(b_list),
                        topic=orig.topic,
                        detail=f"delivery of this message to {sub!r}",
                    ),
                )  # fmt: skip
                continue
            for outcome, etype, err in a_list:
                if outcome != "delivered":
                    failures.append(
                        FailureMatch(orig.id, new.id, sub, outcome, etype, err, orig.topic)
                    )
    candidates.sort(key=lambda c: (c[0], c[1]))
    first = candidates[0][2] if candidates else None
    return Comparison(pairs, first, failures, mapper, [c[2] for c in candidates])


def _describe(outcomes: list[tuple[str, str | None, str | None]]) -> str:
    if not outcomes:
        return "not delivered"
    return ", ".join(o if t is None else f"{o} ({t}: {e})" for o, t, e in outcomes)


def item_of(
    envelopes: Iterable[StoredEnvelope], envelope_id: int | None, key: str | None
) -> str | None:
    """The ``key`` field of the input whose tree holds ``envelope_id`` (None when there is
    no such message, its chain leaves the record, or its input has no such field)."""
    if envelope_id is None or key is None:
        return None
    by_id = {e.id: e for e in envelopes}
    env = by_id.get(envelope_id)
    seen: set[int] = set()
    while env is not None and env.causation_id is not None and env.id not in seen:
        seen.add(env.id)
        env = by_id.get(env.causation_id)
    if env is None or not isinstance(env.payload, Mapping):
        return None
    value = env.payload.get(key)
    return None if value is None else str(value)
