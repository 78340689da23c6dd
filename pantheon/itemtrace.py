"""The story of one item of a recorded session: what the team did with it, call by call.

An item is what the team decides on (an email, an alert, an invoice), named by its key as
the team's outcome names it (:class:`agents.OutcomeSpec`: the input's ``input_key`` field on
the input message, the outcome's ``key`` field on an outcome message). Its story is every
message of its causal tree, in the order the tree grew (each message, then who handled it,
then what those handlings published), and under each handling the effect calls it made
in ordinal order: a model's answer (its text and the tool calls it asked for, with their
arguments), each tool's result, an approval's decision (who, and their note), what
raised, and the dead letters; then the item's outcome. ``pantheon trace`` prints it and the
web dashboard's Trace tab draws it, both from :func:`item_trace`; :func:`item_list` is the
list a user picks an item from.

Everything is read from the record as it is: an effect's answer is its recorded result
(the request itself is stored only as a digest, so a tool's arguments are the ones the
model's answer asked it with, paired in order with the ``tool.<name>`` calls that follow
it); times are offsets in milliseconds from the item's input, on the monotonic clock the
record keeps (shared by the processes of a run on one machine). Nothing imports a recorded
team's code: the outcome is read through :func:`pantheon.rerun.session_outcomes`, the one
reading every view of outcomes shares.
"""

from __future__ import annotations

import difflib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from agents import APPROVAL_EFFECT, ChatResult, OutcomeSpec, decision_text
from bus import matches
from pantheon.readmodel import DRIVER
from pantheon.sessions import (
    SessionError,
    SessionInfo,
    SessionStore,
    StoredDeadLetter,
    StoredDelivery,
    StoredEffect,
    StoredEnvelope,
)
from pantheon.sessions.internals import EFFECT_DIVERGED, EFFECT_ERROR, EFFECT_OK, origin_of

__all__ = [
    "EXCERPT",
    "DeadLetterStep",
    "EffectStep",
    "Handling",
    "ItemList",
    "ItemNotFound",
    "ItemRow",
    "ItemTrace",
    "Message",
    "ToolAsk",
    "compact",
    "item_list",
    "item_trace",
    "short",
    "trace_lines",
]

#: Characters of an answer, a payload or a model's text a line shows (``--full``: all).
EXCERPT = 160
#: How many close keys an unknown item's error suggests.
HINTS = 5


class ItemNotFound(SessionError, KeyError):
    """A session has no item by that key (nor a message by that id). ``closest`` are the
    keys most like it (or its first ones), for the error's hint."""

    def __init__(self, session: str, ref: str, noun: str, closest: list[str]) -> None:
        self.session, self.ref, self.noun, self.closest = session, ref, noun, closest
        hint = f" (closest: {', '.join(closest)})" if closest else f" (it has no {noun}s)"
        super().__init__(f"session {session} has no {noun} {ref!r}{hint}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


# -- values ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolAsk:
    """A tool call a model's answer asked for, with its arguments."""

    name: str
    arguments: Any
    id: str = ""

    @property
    def text(self) -> str:
        """``disk_usage(host="web1")``."""
        return call_text(self.name, self.arguments)


@dataclass(frozen=True, slots=True)
class EffectStep:
    """One effect call of a handling, its answer decoded.

    ``kind`` is ``model`` (``model.<provider>.chat``), ``tool`` (``tool.<name>``),
    ``tools`` (``tools.list``), ``approval`` (``human.approval``) or ``effect`` (anything
    else: a clock, a fault draw, an agent's own). ``status``: ``ok`` (``result`` is what it
    returned), ``raised`` (``error_type``/``error``), ``unencodable`` (``result`` is its
    repr) or ``diverged`` (a replay left the recorded path here). ``start_ms`` is from the
    item's input (None when the record has no time for it)."""

    ordinal: int
    name: str
    kind: str
    status: str
    start_ms: float | None
    duration_ms: float
    result: Any = None
    error_type: str | None = None
    error: str | None = None
    node: str | None = None
    arguments: Any = None
    """A tool's: the arguments the model's answer asked it with (None when no model asked)."""
    text: str | None = None
    """A model's: what it said (its content)."""
    asks: tuple[ToolAsk, ...] = ()
    """A model's: the tool calls it asked for."""
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    approved: bool | None = None
    by: str | None = None
    note: str | None = None
    approval: int | None = None
    """An approval's number in its session (``pantheon approvals``)."""
    asked: str | None = None
    """An approval's request, as the person read it (its summary), when the store has it."""

    @property
    def headline(self) -> str:
        """``tool.disk_usage(host="web1")``, ``model.openai.chat``, ``human.approval``."""
        if self.kind == "tool" and self.arguments is not None:
            return call_text(self.name, self.arguments)
        return self.name

    def details(self, limit: int | None = EXCERPT) -> list[str]:
        """What the call answered, a line each: a model's tokens, text and asks; a tool's
        result; an approval's decision; the error it raised. ``limit`` cuts each value
        (None: whole)."""
        if self.status == "raised":
            return [f"raised {self.error_type or 'Error'}: {short(self.error or '', limit)}"]
        if self.status == "diverged":
            return ["diverged: the re-run left the recorded path here (nothing recorded)"]
        if self.status == "unencodable":
            return [f"returned (not storable, its repr) {short(str(self.result), limit)}"]
        if self.kind == "model":
            lines = []
            tokens = ""
            if self.input_tokens is not None:
                tokens = f"{self.input_tokens} tokens in, {self.output_tokens} out"
            lines.append(", ".join(x for x in (self.model, tokens) if x) or "answered")
            if self.text:
                lines.append(f"said {short(self.text, limit)}")
            lines.extend(f"asks {short(a.text, limit)}" for a in self.asks)
            return lines
        if self.kind == "approval" and self.approved is not None:
            verdict = "approved" if self.approved else "rejected"
            line = f"{verdict} by {self.by or '?'}"
            if self.approval is not None:
                line += f" (request {self.approval})"
            if self.note:
                line += f": note {short(json.dumps(self.note, ensure_ascii=False), limit)}"
            out = [line]
            if self.asked:
                out.append(f"asked {short(self.asked, limit)}")
            return out
        if self.kind == "tools" and isinstance(self.result, list):
            names = [str(t.get("name")) for t in self.result if isinstance(t, Mapping)]
            return [f"its tool sources offer {len(names)}: {short(', '.join(names), limit)}"]
        return [f"→ {short(compact(readable(self.result)), limit)}"]


@dataclass(frozen=True, slots=True)
class DeadLetterStep:
    """A dead letter of one handling: why (``reason``), after how many attempts, the error,
    and the redrive session that took it back, if one did."""

    entry_id: int
    reason: str
    attempts: int
    error_type: str | None
    error: str | None
    redriven_by: str | None = None

    def text(self, limit: int | None = EXCERPT) -> str:
        """``dead letter #3: failed after 1 attempt: RuntimeError: ...``."""
        line = f"dead letter #{self.entry_id}: {self.reason} after {_n(self.attempts, 'attempt')}"
        if self.error_type or self.error:
            error = f"{self.error_type or 'Error'}: {self.error or ''}".rstrip()
            line += f": {short(error, limit)}"
        if self.redriven_by:
            line += f" (redriven by {self.redriven_by})"
        return line


@dataclass(frozen=True, slots=True)
class Handling:
    """One subscriber's handling of a message: when it started (``start_ms``, from the
    item's input), how long it waited and ran, how it ended (the delivery's ``outcome``:
    ``delivered``, ``failed``, ``circuit_open``...), its effect calls in ordinal order and
    its dead letters. A handling whose delivery is not in the record (its process died
    in it, or it was dead-lettered before it ran) has no times and outcome ``unfinished``
    or ``dead_letter``."""

    subscriber: str
    node: str | None
    start_ms: float | None
    queue_wait_ms: float | None
    handling_ms: float | None
    outcome: str
    error: str | None
    effects: tuple[EffectStep, ...] = ()
    dead_letters: tuple[DeadLetterStep, ...] = ()

    def head(self, limit: int | None = EXCERPT) -> str:
        """``triage on brain: started +7.6 ms (waited 7.6 ms), handled in 1712.1 ms,
        delivered``."""
        where = f" on {self.node}" if self.node else ""
        if self.start_ms is None:
            why = "its dead letter below" if self.dead_letters else "its process stopped in it"
            return f"{self.subscriber}{where}: never finished ({why})"
        error = f": {short(self.error, limit)}" if self.error else ""
        return (
            f"{self.subscriber}{where}: started +{self.start_ms:.1f} ms (waited "
            f"{_ms(self.queue_wait_ms)}), handled in {_ms(self.handling_ms)}, "
            f"{self.outcome}{error}"
        )

    def lines(self, limit: int | None = EXCERPT) -> list[str]:
        """The handling's :meth:`head`, then each effect call (its ordinal, headline and
        duration, and its :meth:`~EffectStep.details` below it) and each dead letter."""
        out = [self.head(limit)]
        for e in self.effects:
            node = f" on {e.node}" if e.node and e.node != self.node else ""
            out.append(f"  {e.ordinal} {short(e.headline, limit)}  {_ms(e.duration_ms)}{node}")
            out.extend(f"      {d}" for d in e.details(limit))
        out.extend(f"  {d.text(limit)}" for d in self.dead_letters)
        return out

    @property
    def errors(self) -> int:
        """Effect calls that raised, and the handling itself when it failed."""
        failed = self.outcome not in ("delivered", "unfinished", "dead_letter")
        return sum(e.status == "raised" for e in self.effects) + failed


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the item's tree: published at ``t_ms`` from the item's input by
    ``source`` (None: the input itself) in process ``node`` (multi-process sessions only),
    ``depth`` hops below the input, and every handling of it."""

    envelope_id: int
    causation_id: int | None
    topic: str
    source: str | None
    node: str | None
    depth: int
    t_ms: float
    payload: Any
    handlings: tuple[Handling, ...] = ()

    @property
    def subscribers(self) -> tuple[str, ...]:
        return tuple(h.subscriber for h in self.handlings)

    @property
    def route(self) -> str:
        """``from triage on brain → notify``: who published it, where, and who handled it
        (``input`` for the item's input, ``nobody`` when no subscriber did)."""
        origin = "input" if self.source is None else f"from {self.source}"
        where = f" on {self.node}" if self.node else ""
        return f"{origin}{where} → {', '.join(self.subscribers) or 'nobody'}"

    @property
    def head(self) -> str:
        """``+1719.6 ms  alert.triaged  from triage on brain → notify``."""
        return f"+{self.t_ms:.1f} ms  {self.topic}  {self.route}"


@dataclass(frozen=True, slots=True)
class ItemTrace:
    """One item's story in a session (see the module docstring). ``item`` is its key
    (None for a tree named by an envelope id that carries none), ``key`` the payload field
    naming items and ``noun`` what the team calls one; ``outcome`` the decision as the
    team words it (None: the item reached none), ``expected`` its label's."""

    session: str
    kind: str
    scenario: str | None
    item: str | None
    key: str
    noun: str
    messages: tuple[Message, ...]
    outcome: str | None
    decision: dict[str, str] | None
    expected: str | None
    right: bool | None
    multi_process: bool = False
    numbered: bool = False
    """The item is named by its input's place (``#2``): the input has no ``key`` field, so
    no outcome can name it."""

    @property
    def handlings(self) -> list[Handling]:
        return [h for m in self.messages for h in m.handlings]

    @property
    def head(self) -> str:
        """``alert A-1 in session S (run of opsdesk): 3 messages, 2 handlings, ...``."""
        name = f"{self.noun} {self.item}" if self.item is not None else "message tree"
        return (
            f"{name} in session {self.session} ({self.kind} of {self.scenario or '?'}): "
            f"{_n(len(self.messages), 'message')}, {_n(len(self.handlings), 'handling')}, "
            f"{_n(self.effects, 'effect call')}, {_n(self.errors, 'error')}, "
            f"{_n(self.dead_letters, 'dead letter')}"
        )

    @property
    def verdict(self) -> str | None:
        """``outcome: restart (expected restart: right)``; None for a tree that names no
        item."""
        if self.item is None:
            return None
        if self.numbered:
            return (
                f"outcome: none can name it (its input has no {self.key!r} field; the "
                "scenario's input.key names the field that does)"
            )
        if self.outcome is None:
            return f"outcome: none (the {self.noun} reached no outcome)"
        if self.expected is None:
            return f"outcome: {self.outcome}"
        return (
            f"outcome: {self.outcome} (expected {self.expected}: "
            f"{'right' if self.right else 'wrong'})"
        )

    @property
    def effects(self) -> int:
        return sum(len(h.effects) for h in self.handlings)

    @property
    def errors(self) -> int:
        return sum(h.errors for h in self.handlings)

    @property
    def dead_letters(self) -> int:
        return sum(len(h.dead_letters) for h in self.handlings)

    def to_dict(self) -> dict[str, Any]:
        """Every field, and the counts the text's first line gives."""
        return asdict(self) | {
            "counts": {
                "messages": len(self.messages),
                "handlings": len(self.handlings),
                "effects": self.effects,
                "errors": self.errors,
                "dead_letters": self.dead_letters,
            }
        }


@dataclass(frozen=True, slots=True)
class ItemRow:
    """One item of a session, for the list to pick from: its outcome (and label), its
    messages and handlings (``hops``), effect calls, errors (effect calls that raised and
    handlings that failed) and dead letters; ``start_ms`` when its input came in, from the
    session's first message."""

    item: str
    outcome: str | None
    expected: str | None
    right: bool | None
    messages: int
    hops: int
    effects: int
    errors: int
    dead_letters: int
    start_ms: float


@dataclass(frozen=True, slots=True)
class ItemList:
    """A session's items, in the order their inputs came in. ``numbered`` of them are
    named ``#N`` (the session's Nth input), their input having no ``key`` field."""

    session: str
    kind: str
    scenario: str | None
    key: str
    noun: str
    items: tuple[ItemRow, ...]
    numbered: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- text ------------------------------------------------------------------------------------


def short(text: str, limit: int | None = EXCERPT) -> str:
    """``text`` on one line (newlines escaped), cut to ``limit`` characters with ``…``."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    if limit is None or len(text) <= limit:
        return text
    return text[: max(limit - 1, 1)] + "…"


def compact(value: Any) -> str:
    """A value as one line of JSON (a string quoted), anything JSON cannot say as its repr."""
    return json.dumps(value, ensure_ascii=False, default=repr)


def readable(value: Any) -> Any:
    """A recorded answer as a reader wants it: a string holding JSON (an MCP tool's text
    result) parsed; anything else as it is."""
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def call_text(name: str, arguments: Any) -> str:
    """``disk_usage(host="web1", lines=3)``: a call as it reads, its arguments as JSON."""
    if isinstance(arguments, Mapping):
        inner = ", ".join(f"{k}={compact(v)}" for k, v in arguments.items())
    else:
        inner = "" if arguments is None else compact(arguments)
    return f"{name}({inner})"


def _n(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _ms(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.1f} ms"


def trace_lines(trace: ItemTrace, *, limit: int | None = EXCERPT) -> list[str]:
    """The story as ``pantheon trace`` prints it, plain text, one string a line: its
    :attr:`~ItemTrace.head`, each message (indented by its depth) with its handlings and
    their effect calls (:meth:`Handling.lines`), and the :attr:`~ItemTrace.verdict`.
    ``limit`` cuts each value shown (None: whole)."""
    lines = [trace.head]
    for m in trace.messages:
        pad = "  " * m.depth
        lines.append(f"{pad}{m.head}")
        lines.append(f"{pad}    {short(compact(m.payload), limit)}")
        for h in m.handlings:
            lines.extend(f"{pad}  {line}" for line in h.lines(limit))
    if trace.verdict is not None:
        lines.append(trace.verdict)
    return lines


# -- reading ---------------------------------------------------------------------------------


def _root_of(e: StoredEnvelope) -> int:
    """The tree an envelope belongs to: its correlation id, or itself for an input."""
    return e.correlation_id if e.correlation_id is not None else e.id


class _Session:
    """A session's record grouped by item: trees by root, items by key."""

    def __init__(self, store: SessionStore, ref: str) -> None:
        from pantheon.rerun import outcome_spec

        info = store.session(ref)
        self.store, self.info = store, info
        self.spec: OutcomeSpec = outcome_spec(info)
        self.envelopes = store.envelopes(info.id)
        self.trees: dict[int, list[StoredEnvelope]] = defaultdict(list)
        for e in self.envelopes:
            self.trees[_root_of(e)].append(e)
        #: item -> the roots of its trees, in the order they started.
        self.items: dict[str, list[int]] = {}
        #: Items named by their input's place (``#2``): the input has no key field.
        self.numbered = 0
        self.keyed: set[str] = set()
        inputs = 0
        for root, group in self.trees.items():
            first = group[0]
            is_input = first.id == root and first.causation_id is None and first.source is None
            if is_input and not first.topic.startswith("system."):
                inputs += 1
            names = list(dict.fromkeys(self._names(root, group)))
            if names:
                self.keyed.update(names)
            elif is_input and not first.topic.startswith("system."):
                names = [f"#{inputs}"]
                self.numbered += 1
            for item in names:
                self.items.setdefault(item, []).append(root)
        self.multi = bool(info.summary.get("nodes")) or bool(store.node_journals(info.id))

    def _names(self, root: int, group: list[StoredEnvelope]) -> Iterable[str]:
        """The items a tree is about: its input's key, and every key its outcome messages
        (or a refused record) name."""
        spec = self.spec
        for e in group:
            p = e.payload
            if not isinstance(p, Mapping):
                continue
            if e.id == root and e.causation_id is None:
                # Only the team's input key: any ``*_id`` field (a customer's) would merge
                # the trees of different inputs into one "item"; those are numbered (#N).
                key = p.get(spec.input_key)
                if key is not None:
                    yield str(key)
            elif e.topic == spec.malformed_topic and p.get("key") is not None:
                yield str(p["key"])
            elif (
                spec.declared
                and p.get(spec.key) is not None
                and any(matches(t, e.topic) for t in spec.topics)
            ):
                yield str(p[spec.key])

    def node(self, node: str | None) -> str | None:
        return (node or DRIVER) if self.multi else None

    def resolve(self, ref: str) -> tuple[str | None, list[int]]:
        """The item ``ref`` names (or the tree of the envelope whose id it is)."""
        if ref in self.items:
            return ref, self.items[ref]
        if ref.isdigit():
            wanted = int(ref)
            for e in self.envelopes:
                if e.id == wanted:
                    root = _root_of(e)
                    named = [k for k, roots in self.items.items() if root in roots]
                    return (named[0] if named else None), [root]
        raise ItemNotFound(self.info.id, ref, self.spec.noun, closest(ref, list(self.items)))


def closest(ref: str, keys: list[str], n: int = HINTS) -> list[str]:
    """The ``n`` keys most like ``ref`` (ties in the keys' order), or the first ``n`` when
    none is much like it."""
    scored = [(difflib.SequenceMatcher(None, ref, k).ratio(), i, k) for i, k in enumerate(keys)]
    near = sorted((-r, i, k) for r, i, k in scored if r >= 0.5)
    return [k for _, _, k in near[:n]] or keys[:n]


def _outcomes(store: SessionStore, info: SessionInfo) -> Any:
    from pantheon.rerun import session_outcomes

    return session_outcomes(store, info.id)


def _decision(outcomes: Any, item: str) -> tuple[str | None, str | None, bool | None]:
    """(outcome, expected, right) of ``item`` as the team words them; a team that names
    no decision fields (the default outcome: what its last message changed) gets each
    field named, ``invoice_id=INV-04``, not a bare value."""
    fields = outcomes.spec.fields

    def text(d: Mapping[str, str]) -> str:
        if fields:
            return decision_text(d, fields)
        return ", ".join(f"{k}={v}" for k, v in d.items()) or "(nothing changed)"

    decision = outcomes.decisions.get(item)
    expected = outcomes.expected(item) if item in outcomes.labels else None
    right = None
    if expected is not None:
        right = decision is not None and all(decision.get(f) == v for f, v in expected.items())
    return (
        None if decision is None else text(decision),
        None if expected is None else text(expected),
        right,
    )


def item_list(store: SessionStore, sid: str) -> ItemList:
    """The session's items (``sid``: an id or unique prefix), in the order their inputs
    came in, each with its outcome and its counts."""
    s = _Session(store, sid)
    info = s.info
    outcomes = _outcomes(store, info)
    env_root = {e.id: _root_of(e) for e in s.envelopes}
    hops: dict[int, int] = defaultdict(int)
    failed: dict[int, int] = defaultdict(int)
    for d in store.deliveries(info.id):
        root = env_root.get(d.envelope_id)
        if root is not None:
            hops[root] += 1
            failed[root] += d.outcome != "delivered"
    effects: dict[int, int] = defaultdict(int)
    raised: dict[int, int] = defaultdict(int)
    for f in store.effects(info.id):
        root = env_root.get(f.envelope_id)
        if root is not None:
            effects[root] += 1
            raised[root] += f.flag == EFFECT_ERROR
    letters: dict[int, int] = defaultdict(int)
    for letter in store.dead_letters(info.id):
        root = env_root.get(letter.envelope_id)
        if root is not None:
            letters[root] += 1
    first = min((e.created_ns for e in s.envelopes), default=0)
    rows = []
    for item, roots in s.items.items():
        outcome, expected, right = _decision(outcomes, item)
        rows.append(
            ItemRow(
                item=item,
                outcome=outcome,
                expected=expected,
                right=right,
                messages=sum(len(s.trees[r]) for r in roots),
                hops=sum(hops[r] for r in roots),
                effects=sum(effects[r] for r in roots),
                errors=sum(raised[r] + failed[r] for r in roots),
                dead_letters=sum(letters[r] for r in roots),
                start_ms=(min(s.trees[r][0].created_ns for r in roots) - first) / 1e6,
            )
        )
    rows.sort(key=lambda r: r.start_ms)
    return ItemList(
        info.id, info.kind, info.scenario, s.spec.key, s.spec.noun, tuple(rows), s.numbered
    )


def item_trace(store: SessionStore, sid: str, ref: str) -> ItemTrace:
    """The story of the item ``ref`` names (its key, or the id of any message of its
    tree) in session ``sid`` (an id or unique prefix). :class:`ItemNotFound`, naming the
    closest keys, when the session has no such item or message."""
    s = _Session(store, sid)
    info = s.info
    item, roots = s.resolve(ref)
    group = [e for r in roots for e in s.trees[r]]
    ids = {e.id for e in group}
    origin = min(e.created_ns for e in group)
    deliveries = [d for d in store.deliveries(info.id) if d.envelope_id in ids]
    effects = [f for f in store.effects(info.id) if f.envelope_id in ids]
    letters = [d for d in store.dead_letters(info.id) if d.envelope_id in ids]
    handlings = _handlings(s, deliveries, effects, letters, origin, _Approvals(store, info))
    messages = []
    for e, depth in _story(roots, group):
        messages.append(
            Message(
                envelope_id=e.id,
                causation_id=e.causation_id,
                topic=e.topic,
                source=e.source,
                node=s.node(e.node),
                depth=depth,
                t_ms=(e.created_ns - origin) / 1e6,
                payload=e.payload,
                handlings=tuple(handlings.get(e.id, ())),
            )
        )
    outcome = expected = decision = right = None
    if item is not None:
        outcomes = _outcomes(store, info)
        outcome, expected, right = _decision(outcomes, item)
        decision = outcomes.decisions.get(item)
    return ItemTrace(
        session=info.id,
        kind=info.kind,
        scenario=info.scenario,
        item=item,
        key=s.spec.key,
        noun=s.spec.noun,
        messages=tuple(messages),
        outcome=outcome,
        decision=None if decision is None else dict(decision),
        expected=expected,
        right=right,
        multi_process=s.multi,
        numbered=item is not None and item not in s.keyed,
    )


def _story(roots: list[int], group: list[StoredEnvelope]) -> list[tuple[StoredEnvelope, int]]:
    """The tree's messages depth first (each message, then what it caused, in publish
    order) with their depth. A message whose cause is not in the record (a node's journal
    cut short) starts a branch of its own, in publish order after the rest."""
    by_id = {e.id: e for e in group}
    children: dict[int, list[StoredEnvelope]] = defaultdict(list)
    loose = []
    for e in group:
        if e.causation_id is not None and e.causation_id in by_id:
            children[e.causation_id].append(e)
        elif e.id not in roots:
            loose.append(e)
    out: list[tuple[StoredEnvelope, int]] = []
    seen: set[int] = set()

    def walk(e: StoredEnvelope, depth: int) -> None:
        stack = [(e, depth)]
        while stack:  # iterative: a deep tree must not meet the recursion limit
            env, d = stack.pop()
            if env.id in seen:
                continue
            seen.add(env.id)
            out.append((env, d))
            stack.extend((c, d + 1) for c in reversed(children.get(env.id, [])))

    for start in [by_id[r] for r in roots if r in by_id] + loose:
        walk(start, 0 if start.id in roots else 1)
    return out


class _Approvals:
    """The approval requests an ``human.approval`` answer may refer to: the session's own
    (or, resumed, its original's) and those of the sessions it re-ran, whose decisions a
    replay or a what-if serves. Read once, on the first approval met."""

    __slots__ = ("_info", "_rows", "_store")

    def __init__(self, store: SessionStore, info: SessionInfo) -> None:
        self._store, self._info = store, info
        self._rows: list[Any] | None = None

    def _load(self) -> list[Any]:
        from pantheon.sessions import ApprovalBook, ApprovalError

        rows: list[Any] = []
        info: SessionInfo | None = self._info
        seen: set[str] = set()
        try:
            book = ApprovalBook(self._store)
            while info is not None and info.id not in seen:
                seen.add(info.id)
                rows.extend(book.entries(origin_of(self._store, info)))
                parent = info.replay_of or info.forked_from
                info = None if parent is None else self._store.session(parent)
        except (ApprovalError, SessionError):
            pass  # the requests are a detail: the decision itself is in the effect
        return rows

    def asked(self, agent: str, number: int, approved: bool, by: str) -> str | None:
        """The summary of the request this decision answered, when one matches it (same
        number, asker, verdict and decider)."""
        if self._rows is None:
            self._rows = self._load()
        status = "approved" if approved else "rejected"
        for a in self._rows:
            if (a.id, a.agent, a.status, a.decided_by) == (number, agent, status, by):
                return str(a.summary)
        return None


def _kind(name: str) -> str:
    if name.startswith("model.") and name.endswith(".chat"):
        return "model"
    if name == "tools.list":
        return "tools"
    if name.startswith("tool."):
        return "tool"
    if name == APPROVAL_EFFECT:
        return "approval"
    return "effect"


_STATUS = {EFFECT_OK: "ok", EFFECT_ERROR: "raised", EFFECT_DIVERGED: "diverged"}


def _steps(
    s: _Session, effects: list[StoredEffect], origin: int, approvals: _Approvals
) -> tuple[EffectStep, ...]:
    """A handling's effect calls in ordinal order, each answer decoded; a tool's
    arguments are those of the first call of that tool the model asked for and no tool
    call has taken yet."""
    asked: list[ToolAsk] = []
    out = []
    for f in sorted(effects, key=lambda f: (f.ordinal, f.seq)):
        kind = _kind(f.name)
        status = _STATUS.get(f.flag, "unencodable")
        value = f.value if f.flag not in (EFFECT_ERROR, EFFECT_DIVERGED) else None
        extra: dict[str, Any] = {}
        if kind == "model" and status == "ok" and (chat := _chat(value)) is not None:
            asks = tuple(ToolAsk(c.name, c.arguments, c.id) for c in chat.tool_calls)
            asked.extend(asks)
            extra = {
                "text": None if chat.content is None else str(chat.content),
                "asks": asks,
                "model": chat.model or None,
                "input_tokens": chat.usage.input_tokens,
                "output_tokens": chat.usage.output_tokens,
            }
        elif kind == "tool":
            tool = f.name.removeprefix("tool.")
            match = next((a for a in asked if a.name == tool), None)
            if match is not None:
                asked.remove(match)
                extra = {"arguments": match.arguments}
        elif kind == "approval" and status == "ok" and isinstance(value, Mapping):
            approved, by = bool(value.get("approved")), str(value.get("by") or "")
            number = value.get("id")
            number = number if isinstance(number, int) else None
            agent = (f.subscriber or "").partition(":")[0]
            extra = {
                "approved": approved,
                "by": by,
                "note": str(value.get("note") or "") or None,
                "approval": number,
                "asked": None if number is None else approvals.asked(agent, number, approved, by),
            }
        out.append(
            EffectStep(
                ordinal=f.ordinal,
                name=f.name,
                kind=kind,
                status=status,
                start_ms=(f.started_ns - origin) / 1e6 if f.started_ns else None,
                duration_ms=max(0, f.ended_ns - f.started_ns) / 1e6,
                result=value,
                error_type=f.error_type,
                error=f.error,
                node=s.node(f.node),
                **extra,
            )
        )
    return tuple(out)


def _chat(value: Any) -> ChatResult | None:
    """A recorded model answer, read as a replay reads it (:meth:`ChatResult.from_dict`);
    None for one that is not (a record from elsewhere): the trace shows the rest."""
    if not isinstance(value, Mapping):
        return None
    try:
        return ChatResult.from_dict(value)
    except (KeyError, TypeError, ValueError):
        return None


def _handlings(
    s: _Session,
    deliveries: list[StoredDelivery],
    effects: list[StoredEffect],
    letters: list[StoredDeadLetter],
    origin: int,
    approvals: _Approvals,
) -> dict[int, list[Handling]]:
    """Envelope id -> its handlings, in the order they started (those the record has no
    delivery of last). Effects and dead letters go to the handling of their envelope and
    subscriber; when several processes handled the same message (a group member died in
    it, another took it), to the one on the effect's node."""
    calls: dict[tuple[int, str | None], list[StoredEffect]] = defaultdict(list)
    for f in effects:
        calls[(f.envelope_id, f.subscriber)].append(f)
    dead: dict[tuple[int, str], list[StoredDeadLetter]] = defaultdict(list)
    for letter in letters:
        dead[(letter.envelope_id, letter.subscriber)].append(letter)
    by_key: dict[tuple[int, str | None], list[StoredDelivery]] = defaultdict(list)
    for d in sorted(deliveries, key=lambda d: d.started_ns):
        by_key[(d.envelope_id, d.subscriber)].append(d)
    out: dict[int, list[Handling]] = defaultdict(list)
    for key in dict.fromkeys([*by_key, *calls, *dead]):
        env_id, subscriber = key
        runs = by_key.get(key, [])
        mine = calls.get(key, [])
        letters_of = [_letter(d) for d in dead.get((env_id, subscriber or ""), [])]
        if not runs:
            out[env_id].append(
                Handling(
                    subscriber=subscriber or "(outside a handler)",
                    node=s.node(mine[0].node) if mine else None,
                    start_ms=None,
                    queue_wait_ms=None,
                    handling_ms=None,
                    outcome="dead_letter" if letters_of else "unfinished",
                    error=None,
                    effects=_steps(s, mine, origin, approvals),
                    dead_letters=tuple(letters_of),
                )
            )
            continue
        split = len({r.node for r in runs}) == len(runs) > 1
        for i, d in enumerate(runs):
            if not split:
                own = mine if i == 0 else []
            else:
                own = [f for f in mine if f.node == d.node]
                if i == 0:  # effects of no run's node: the first run's
                    own += [f for f in mine if all(f.node != r.node for r in runs)]
            out[env_id].append(
                Handling(
                    subscriber=d.subscriber,
                    node=s.node(d.node),
                    start_ms=(d.started_ns - origin) / 1e6,
                    queue_wait_ms=d.queue_wait_ns / 1e6,
                    handling_ms=d.handling_ns / 1e6,
                    outcome=d.outcome,
                    error=_error(d),
                    effects=_steps(s, own, origin, approvals),
                    dead_letters=tuple(letters_of) if i == len(runs) - 1 else (),
                )
            )
    for hs in out.values():
        hs.sort(key=lambda h: (h.start_ms is None, h.start_ms or 0.0))
    return out


def _letter(d: StoredDeadLetter) -> DeadLetterStep:
    return DeadLetterStep(d.entry_id, d.reason, d.attempts, d.error_type, d.error, d.redriven_by)


def _error(d: StoredDelivery) -> str | None:
    if d.error_type and d.error:
        return f"{d.error_type}: {d.error}"
    return d.error_type or d.error or None
