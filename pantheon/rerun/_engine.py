"""The one re-run loop: a recorded session's inputs through a team on a fresh bus, every
effect call looked up in the record and decided by a :class:`~pantheon.rerun.Policy`.

Exact replay, what-if and resume are this loop with another policy (and their own report):

* the original's outside messages (no cause, no source, not ``system.*``: its inputs, and
  others such as a Monitor's sampled alert, counted apart: :meth:`Rerun.observed`) are
  re-published in recorded order, each once what the original had published before it,
  under inputs already fed, has been published again (or the bus went quiet): that keeps
  inputs interleaved with the work they caused as they were, which agent state (a
  Memory's history) depends on;
* every message the new run publishes is aligned onto the original as it is published
  (:class:`~pantheon.sessions._align.Mapper`; publish listeners run before routing, so a
  handler's effects find their original message);
* every effect call is keyed (original message, subscriber, ordinal), looked up once in
  the index of the original's effects, and served, run live or diverged as the policy says;
  served answers and live ones alike are recorded in the new session;
* an approval (``human.approval``) is an effect like any other: served when the policy
  serves it, otherwise asked through the new session's approval desk
  (:class:`~pantheon.approvals._desk.StoreDesk`, when the caller gives an ``approvals`` config),
  where the scripted person, the timeout or ``pantheon approve`` decides it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agents import APPROVAL_EFFECT, InputOrdinals, Observer, input_ordinal
from bus import Bus, Envelope, current_handler
from pantheon.approvals import OnWaiting, StoreDesk, request_key
from pantheon.rerun._policies import EffectCall, Policy
from pantheon.scenario import DRIVER_NODE, ApprovalsConfig
from pantheon.sessions import (
    DEFAULT_REPLAY_TIMEOUT,
    ApprovalBook,
    Recorder,
    RecordingEffects,
    ReplayDivergence,
    SessionInfo,
    SessionStore,
    Setup,
    StoredDeadLetter,
    StoredDelivery,
    StoredEffect,
    StoredEnvelope,
)
from pantheon.sessions.internals import (
    EFFECT_DIVERGED,
    EFFECT_ERROR,
    EffectSink,
    Lineage,
    Mapper,
    Status,
    decode,
    normalize,
    rebuild_error,
    request_digest,
    same_payload,
)

__all__ = [
    "DEFAULT_REPLAY_TIMEOUT",
    "MAX_DIFFERENCES",
    "Rerun",
    "RerunEffects",
    "Setup",
    "Tracker",
    "by_name",
    "counts_line",
    "credit_inputs",
    "cut_inputs",
    "dangling",
    "incomplete_reason",
    "past_the_record",
    "progress_or_quiet",
    "rerun",
]

#: Differences from the record a re-run that goes on past them (what-if, resume) keeps.
MAX_DIFFERENCES = 100

EffectIndex = Mapping[tuple[int, str | None], Sequence[StoredEffect]]


def by_name(counts: Mapping[str, int]) -> dict[str, int]:
    """Effect counts by name, the most first (a tie by name): how the reports list them."""
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def counts_line(label: str, counts: Mapping[str, int]) -> str:
    """``called live 40: model.openai.chat 38, tool.lookup 2``: a total and its names."""
    named = ", ".join(f"{name} {n}" for name, n in by_name(counts).items())
    return f"{label} {sum(counts.values())}" + (f": {named}" if named else "")


def incomplete_reason(info: SessionInfo) -> str | None:
    """Why a session's record stops short of the end of its run, or None when it does not.

    A record is complete once the run closed it (``completed`` or ``failed``, or
    ``aborted`` with a summary saying which signal stopped its input: that run finished
    what was in flight and recorded it all); otherwise ``aborted`` means the recording
    process died (the store marks it so when it finds the process gone) and ``running``
    that it is still being written."""
    if info.status == "aborted" and not info.summary.get("interrupted"):
        if str(info.summary.get("error", "")).startswith("interrupted ("):
            return "aborted: interrupted at once (a second Ctrl-C) before the run finished"
        return "aborted: its recording process died"
    if info.status == "running":
        return f"still being recorded (pid {info.pid} on {info.host})"
    return None


def unrecorded_nodes(store: SessionStore, info: SessionInfo) -> list[str]:
    """The processes of a multi-process session whose part of the run is not in its record:
    every node of a session recorded before nodes shipped their journals (only the driver's
    bus was recorded then), none of one recorded since (a node that died has a journal that
    stops early, which :func:`node_cuts` says)."""
    remote = sorted(set(info.summary.get("nodes") or ()) - {DRIVER_NODE})
    if not remote:
        return []
    shipped = store.node_journals(info.id)
    return [] if shipped else remote


def node_cuts(store: SessionStore, info: SessionInfo) -> dict[str, str]:
    """Nodes whose journal stops before their end mark, each with how far it reached (a
    node killed or dead mid-run): a re-run goes on past where their records stop."""
    remote = set(info.summary.get("nodes") or ()) - {DRIVER_NODE}
    journals = store.node_journals(info.id)
    cuts = {}
    for node in sorted(remote):
        j = journals.get(node)
        if j is None:
            cuts[node] = "shipped no records"
        elif not j.ended:
            cuts[node] = f"its records end after {j.records} in {j.shipments} shipments"
    return cuts


def cut_inputs(
    store: SessionStore,
    info: SessionInfo,
    cuts: Mapping[str, str],
    lineage: Lineage,
    effects: list[StoredEffect],
) -> set[int]:
    """The inputs (by id) of session ``info`` whose trees a node of ``cuts`` (its
    :func:`node_cuts`, ``lineage`` and ``effects`` its record) was in the middle of when it
    died: what replay and what-if leave out, and a diff of the two runs too (see
    :func:`_touched`). Empty when no node was cut."""
    if not cuts:
        return set()
    return _touched(lineage, cuts, store.deliveries(info.id), store.dead_letters(info.id), effects)


def dangling(
    envelopes: Iterable[StoredEnvelope],
    cuts: Mapping[str, str],
    deliveries: Iterable[StoredDelivery],
    effects: Iterable[StoredEffect],
) -> set[int]:
    """Messages a node of ``cuts`` published in a handling it never finished (no delivery
    of the cause to that subscriber on it) that nothing else recorded hangs on: no recorded
    message was caused by one, no recorded effect was made handling one.

    Such a message is a request an effect of that handling made (a Reasoner's Memory
    lookup), shipped before the node died while the effect's own record was not: with no
    effect window to say so (``effect_internal``), alignment would take it for the
    handling's first output and pair the real output with it, and everything after that
    with nothing, so a resume would do again what the live nodes did (reply to an email
    twice). Or an output nobody took, which a resume produces again anyway. A message
    something recorded does hang on is kept, and its cause with it."""
    envelopes = list(envelopes)
    ended = {(d.envelope_id, d.subscriber) for d in deliveries if d.node in cuts}
    cut_short = {
        e.id
        for e in envelopes
        if e.node in cuts
        and e.causation_id is not None
        and (e.causation_id, e.source or "") not in ended
    }
    if not cut_short:
        return set()
    cause = {e.id: e.causation_id for e in envelopes}
    needed = {e.causation_id for e in envelopes if e.id not in cut_short}
    needed.update(f.envelope_id for f in effects)
    kept: set[int] = set()
    wanted = [m for m in cut_short if m in needed]
    while wanted:
        m = wanted.pop()
        if m in kept:
            continue
        kept.add(m)
        parent = cause.get(m)
        if parent in cut_short:
            wanted.append(parent)
    return cut_short - kept


def past_the_record(div: ReplayDivergence) -> bool:
    """A difference an incomplete record explains: the re-run has something (a message, an
    effect call, a delivery) where the record simply stops."""
    if div.field == "extra":
        return True
    if div.field == "effect":
        return div.expected is None
    return div.field == "outcome" and div.expected == "not delivered"


def _effect_index(
    effects: Iterable[StoredEffect],
    deliveries: Callable[[], Iterable[StoredDelivery]] = tuple,
) -> dict[tuple[int, str | None], list[StoredEffect]]:
    """The original's effects by (envelope, subscriber), in ordinal order; calls that
    diverged in it (it was itself a replay) answered nothing and are left out.

    In a multi-process session a message can be handled by the same group on two nodes:
    a node died mid-handling and the transport handed the message to another member.
    Ordinals count per process, so the two handlings' calls would interleave; the one
    served is the handling that ended (a delivery on that node), the one the run went on
    with, and the cut one's calls are left out."""
    index: dict[tuple[int, str | None], list[StoredEffect]] = defaultdict(list)
    for e in effects:
        if e.flag != EFFECT_DIVERGED:
            index[(e.envelope_id, e.subscriber)].append(e)
    handled: dict[tuple[int, str], set[str | None]] | None = None
    for key, records in index.items():
        nodes = {e.node for e in records}
        if len(nodes) > 1:
            if handled is None:
                handled = defaultdict(set)
                for d in deliveries():
                    handled[(d.envelope_id, d.subscriber)].add(d.node)
            ended = handled.get((key[0], key[1] or ""), set())
            kept = [e for e in records if e.node in ended]
            if kept:
                records[:] = kept
        records.sort(key=lambda e: e.ordinal)
    return index


def _touched(
    lineage: Lineage,
    cuts: Mapping[str, str],
    deliveries: list[StoredDelivery],
    dead_letters: list[StoredDeadLetter],
    effects: list[StoredEffect],
) -> set[int]:
    """The inputs (by id) whose trees a cut node was in the middle of when it died.

    Handlings it finished are in its journal like any other and replay exactly; what
    cannot be done again in one process is: a handling it began and never ended (effects,
    or messages it published, from it and no delivery), a message that reached its mailbox
    and died there (a subscription it hosts took that topic, and nobody handled this one),
    one the transport handed to a second member or dead-lettered as ``node_lost``."""
    topic = {e.id: e.topic for e in lineage.envelopes}
    ended: set[tuple[int, str | None]] = set()
    hosted: set[str] = set()
    handled: dict[tuple[int, str], int] = defaultdict(int)
    takes: dict[str, set[str]] = defaultdict(set)
    for d in deliveries:
        handled[(d.envelope_id, d.subscriber)] += 1
        takes[d.subscriber].add(topic.get(d.envelope_id, ""))
        if d.node in cuts:
            hosted.add(d.subscriber)
            ended.add((d.envelope_id, d.node))
    messages = {m for (m, _), n in handled.items() if n > 1}
    messages.update(
        e.envelope_id for e in effects if e.node in cuts and (e.envelope_id, e.node) not in ended
    )
    messages.update(
        e.causation_id
        for e in lineage.envelopes
        if e.node in cuts and e.causation_id is not None and (e.causation_id, e.node) not in ended
    )
    messages.update(
        e.id
        for e in lineage.envelopes
        for sub in hosted
        if e.topic in takes[sub] and (e.id, sub) not in handled
    )
    messages.update(d.envelope_id for d in dead_letters if d.reason == "node_lost")
    return {r for m in messages if (r := lineage.root.get(m)) is not None}


class Tracker:
    """The re-run's view of itself while it runs: aligns each envelope as it is published,
    notes which are equal to their original (``identical``: their handlers' effects may be
    served) and the differences from the record. With ``halts`` the first difference stops
    the feed (``stopped`` says why); ``truncated``: the record stops short, so messages
    past its end are expected, not a difference."""

    def __init__(
        self,
        lineage: Lineage,
        inputs: Sequence[StoredEnvelope],
        *,
        halts: bool,
        truncated: bool = False,
        tolerated: set[int] | None = None,
    ) -> None:
        self.mapper = Mapper(lineage, inputs)
        self.halts = halts
        self.truncated = truncated
        #: Original inputs whose trees a dead node's journal cut (:func:`node_cuts`): what
        #: differs in them is not a difference, and does not stop the feed.
        self.tolerated = tolerated or set()
        #: The effects runner's live calls: messages published while one of them runs
        #: belong to the effect and are not aligned (served effects publish nothing).
        self.active: Mapping[tuple[int, str | None], int] = {}
        self.identical: set[int] = set()
        self.differences: list[str] = []
        self.stopped: str | None = None
        self.waiting: set[int] = set()
        self.progress = asyncio.Event()

    def on_publish(self, env: Envelope) -> None:
        mapper = self.mapper
        if mapper.effect_own(env, self.active):
            return
        extras = len(mapper.extras)
        orig = mapper.feed(env)
        if self.tolerated and mapper.to_original.get(env.correlation_id) in self.tolerated:
            if orig is not None and self.waiting:
                self.waiting.discard(orig.id)
                if not self.waiting:
                    self.progress.set()
            return
        if orig is None:
            if len(mapper.extras) > extras and not self.truncated:
                self.differ("extra message")
            return
        if self.waiting:
            self.waiting.discard(orig.id)
            if not self.waiting:
                self.progress.set()
        if orig.topic != env.topic:
            self.differ("topic")
            return
        payload, as_repr = normalize(env.payload)
        probe = StoredEnvelope(
            0, env.id, env.topic, 0, None, None, None, 0, 0, 0.0, payload, as_repr
        )
        if same_payload(orig, probe):
            self.identical.add(env.id)
        else:
            self.differ("payload")

    def differ(self, why: str) -> None:
        if len(self.differences) < MAX_DIFFERENCES:
            self.differences.append(why)
        if self.halts:
            # Only a halting re-run wakes the feed: one that goes on keeps its pacing.
            if self.stopped is None:
                self.stopped = why
            self.progress.set()


def _requests(store: SessionStore, session: str) -> dict[int, str]:
    """The keys of the approvals ``session`` asked (under its origin: a resumed run's are
    numbered under the run it resumed), by number."""
    book = ApprovalBook(store)
    return {a.id: a.key for a in book.entries(book.origin(session))}


#: Handlings whose last served call :class:`RerunEffects` remembers: far more than run at
#: once (a handling's inner calls come right after the call holding them).
_SERVED_KEPT = 4096


def _inside(inner: StoredEffect, outer: StoredEffect) -> bool:
    """Whether ``inner``'s call began and ended within ``outer``'s, in the same process."""
    return (
        inner.node == outer.node
        and outer.ended_ns > 0
        and outer.started_ns <= inner.started_ns
        and inner.ended_ns <= outer.ended_ns
    )


class RerunEffects(RecordingEffects):
    """The re-run's effects runner: looks each call up in the original's ``index`` at its
    position (its message aligned by ``tracker``), asks ``policy``, and serves the recorded
    answer, runs the call live, or raises the :class:`ReplayDivergence` (also given to
    ``on_divergence``). Every call is recorded in the new session; a served approval is
    counted on ``desk``, so the requests asked after it keep their keys.

    An approval the policy would ask again is still served when its request is the one the
    record's decision answered (``requests``: the original's request keys by number) and
    someone made that decision: a person (or the scripted one) decided exactly that request
    already, whatever else changed in the agent. One the timeout decided is asked again."""

    __slots__ = (
        "_desk",
        "_index",
        "_last_served",
        "_on_divergence",
        "_policy",
        "_requests",
        "_tracker",
        "active",
        "called_by_name",
        "served",
        "served_by_name",
        "unserved",
    )

    def __init__(
        self,
        sink: EffectSink,
        index: EffectIndex,
        tracker: Tracker,
        policy: Policy,
        *,
        seed: int | None = None,
        desk: StoreDesk | None = None,
        on_divergence: Callable[[ReplayDivergence], None] | None = None,
        requests: Mapping[int, str] | None = None,
    ) -> None:
        super().__init__(sink, seed)
        self._index = index
        self._requests = requests or {}
        self._tracker = tracker
        self._policy = policy
        self._desk = desk
        self._on_divergence = on_divergence
        #: (envelope id, subscriber) -> live calls of that handling running right now:
        #: messages it publishes meanwhile are the effect's own (see ``Tracker``). Kept
        #: here, not by every recording: only a re-run aligns what it publishes.
        self.active: dict[tuple[int, str | None], int] = {}
        #: Effects served from the record (``calls`` counts the ones that ran).
        self.served = 0
        #: ``served`` and ``calls`` by effect name, for the reports.
        self.served_by_name: Counter[str] = Counter()
        self.called_by_name: Counter[str] = Counter()
        #: Handlings (new envelope, subscriber) with a call not served: what they did
        #: next may differ from the record for that reason. At most one per live call.
        self.unserved: set[tuple[int, str | None]] = set()
        #: (new envelope, subscriber) -> its last served call: when it was written and its
        #: position, for the calls recorded inside that one (:meth:`_past_inner`). The
        #: newest handlings only.
        self._last_served: dict[tuple[int, str | None], tuple[int, int]] = {}

    async def effect(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        env_id, sub, n = self._key()
        tracker = self._tracker
        orig_id = 0 if env_id == 0 else tracker.mapper.to_original.get(env_id)
        records = self._index.get((orig_id, sub), ()) if orig_id is not None else ()
        rec = records[n] if n < len(records) else None
        if rec is not None and rec.name != name:
            n, rec = self._past_inner(env_id, sub, records, n, name)
        same = env_id == 0 or env_id in tracker.identical
        digest = request_digest(fn, args, kwargs)
        call = EffectCall(env_id, sub, n, name, orig_id, rec, same, digest)
        verdict = self._policy.decide(call)
        if verdict.action == "serve" and call.record is not None:
            return self._serve(call, fn, args)
        if verdict.action == "live" and self._same_request(call, fn, args):
            return self._serve(call, fn, args)
        self.unserved.add(call.handling)
        if verdict.action == "diverge":
            raise self._diverge(call, verdict.problem)
        self.called_by_name[name] += 1
        key = (env_id, sub)
        active = self.active
        active[key] = active.get(key, 0) + 1
        try:
            result = await self._run(env_id, sub, n, name, fn, args, kwargs, digest)
        except Exception:
            self._policy.ran(call, None, True)
            raise
        finally:
            left = active.pop(key) - 1
            if left:
                active[key] = left
        self._policy.ran(call, result, False)
        return result

    def _same_request(
        self, call: EffectCall, fn: Callable[..., Any], args: tuple[Any, ...]
    ) -> bool:
        """Whether an approval call asks what the recorded decision at its position answered."""
        rec = call.record
        if call.name != APPROVAL_EFFECT or not call.matches_record() or rec is None or not args:
            return False
        agent = getattr(fn, "__self__", None)
        decided = decode(rec.result)
        if agent is None or not isinstance(decided, Mapping) or not isinstance(args[0], Mapping):
            return False
        if decided.get("by") == "timeout":
            return False
        key = self._requests.get(decided.get("id"))  # type: ignore[arg-type]
        asked = request_key(agent.name, args[0], 0)
        return key is not None and key.partition("#")[0] == asked.partition("#")[0]

    def _past_inner(
        self,
        env_id: int,
        sub: str | None,
        records: Sequence[StoredEffect],
        n: int,
        name: str,
    ) -> tuple[int, StoredEffect]:
        """Where the record at this call's position is a call made *inside* the one this
        handling had served last (a tool whose function asks for approval: the tool's call
        holds the approval's), the inner calls never happen again: they are served as
        recorded, the handling's count moves past them, and the call is matched with the
        record after them. Only when that record is this call's: two calls made at once
        (``asyncio.gather``) also lie one inside the other by time, and match in order, so
        a call that still meets another name is left to the policy. An outer call that ran
        live made its inner calls itself, or none (a what-if changed it): nothing to serve.

        Served calls are written with no duration; the inner ones get the time of the call
        served before them, so the new record holds them inside it, as the original did."""
        last = self._last_served.get((env_id, sub))
        if last is None or last[1] >= n:
            return n, records[n]
        at, outer = last[0], records[last[1]]
        k = n
        while k < len(records) and _inside(records[k], outer):
            k += 1
        if k == n or k == len(records) or records[k].name != name:
            return n, records[n]
        for ordinal in range(n, k):
            inner = records[ordinal]
            self.served += 1
            self.served_by_name[inner.name] += 1
            if self._desk is not None and inner.name == APPROVAL_EFFECT:
                decided = decode(inner.result)
                number = decided.get("id") if isinstance(decided, Mapping) else None
                key = self._requests.get(number) if isinstance(number, int) else None
                if key is not None:
                    self._desk.count_key(key)
            self._sink(
                (env_id, sub, ordinal, inner.name, inner.flag, inner.result, inner.error_type,
                 inner.error, time.time(), at, at, inner.digest)
            )  # fmt: skip
        running = current_handler.get()
        if env_id == 0:
            self.outside += k - n
        elif running is not None:
            running.effects += k - n
        return k, records[k]

    def _serve(self, call: EffectCall, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        rec = call.record
        assert rec is not None
        self.served += 1
        self.served_by_name[call.name] += 1
        agent = getattr(fn, "__self__", None)
        if self._desk is not None and call.name == APPROVAL_EFFECT and agent is not None and args:
            self._desk.count(agent.name, args[0])
        now_ns = time.monotonic_ns()
        last = self._last_served
        last[(call.envelope_id, call.subscriber)] = (now_ns, call.ordinal)
        if len(last) > _SERVED_KEPT:
            del last[next(iter(last))]
        self._sink(
            (call.envelope_id, call.subscriber, call.ordinal, call.name, rec.flag,
             rec.result, rec.error_type, rec.error, time.time(), now_ns, now_ns, call.digest)
        )  # fmt: skip
        if rec.flag == EFFECT_ERROR:
            raise rebuild_error(rec.error_type or "Exception", rec.error or "")
        return decode(rec.result)

    def _diverge(self, call: EffectCall, problem: str | None) -> ReplayDivergence:
        rec = call.record
        div = ReplayDivergence(
            "effect",
            original_id=call.original_id,
            replay_id=call.envelope_id,
            agent=call.subscriber,
            expected=None if rec is None else rec.name,
            actual=call.name,
            detail=f"effect #{call.ordinal}" + (f": {problem}" if problem else ""),
        )
        now_ns = time.monotonic_ns()
        self._sink(
            (call.envelope_id, call.subscriber, call.ordinal, call.name,
             EFFECT_DIVERGED, None, None, str(div), time.time(), now_ns, now_ns, call.digest)
        )  # fmt: skip
        if self._on_divergence is not None:
            self._on_divergence(div)
        return div


class Rerun:
    """One re-run of session ``original`` under ``policy``, recorded as a new session of
    ``kind``: a ``replay_of`` the original, or ``forked_from`` it (``forked``, a what-if,
    whose scenario is ``scenario``/``scenario_text``, the changed one).

    ``from_ts`` (seconds since the original started) starts at the first input published
    at or after it. ``truncated``: the record stops short (its process died), so what the
    team does past its end is not a difference. ``approvals``: the new session gets an
    approval desk with this config (:attr:`desk`; ``origin`` numbers its requests, a
    resumed run's under the run it resumes; ``on_waiting`` hears of requests left waiting
    for a person, as :class:`~pantheon.approvals.StoreDesk` says); :meth:`serve_desk` hands
    it to a team.

    Use :func:`rerun` for the whole loop; a caller that runs the bus itself (resume, inside
    a live feed) calls :meth:`track`, :meth:`feed` and :meth:`finish` in that order."""

    def __init__(
        self,
        store: SessionStore,
        original: SessionInfo,
        policy: Policy,
        *,
        kind: str,
        forked: bool = False,
        scenario: str | None = None,
        scenario_text: str | None = None,
        from_ts: float | None = None,
        truncated: bool = False,
        approvals: ApprovalsConfig | None = None,
        origin: str | None = None,
        on_waiting: OnWaiting | None = None,
        skip_cut: bool = False,
        redo_cut: bool = False,
    ) -> None:
        self.store = store
        self.original = original
        self.policy = policy
        self.envelopes = store.envelopes(original.id)
        self.effects = store.effects(original.id)
        self.lineage = Lineage(self.envelopes, self.effects)
        #: Nodes whose journal stops before its end, and the original inputs whose trees
        #: it was in the middle of: what differs in them is not a difference, and with
        #: ``skip_cut`` (exact replay, what-if) they are not replayed at all: one process
        #: cannot do again what a death cut short (see ``ReplayReport.cut``).
        self.cuts = node_cuts(store, original)
        self.tolerated = cut_inputs(store, original, self.cuts, self.lineage, self.effects)
        if redo_cut and self.cuts:
            # ``redo_cut`` (resume): the handlings a death cut short are done again, so
            # what they left hanging is not aligned with (:func:`dangling`); what the cut
            # is computed from above keeps it.
            gone = dangling(self.envelopes, self.cuts, store.deliveries(original.id), self.effects)
            if gone:
                kept = [e for e in self.envelopes if e.id not in gone]
                self.lineage = Lineage(kept, self.effects)
        inputs = self.lineage.inputs
        #: Whether the original's Observers numbered their inputs (see :meth:`observed`).
        self.numbered = any(input_ordinal(e.id) is not None for e in inputs)
        if skip_cut:
            inputs = [e for e in inputs if e.id not in self.tolerated]
        if from_ts is not None:
            inputs = [e for e in inputs if e.wall - original.started >= from_ts]
        #: Every outside message to feed again, in recorded order: the input's, and the
        #: others no handling caused (:meth:`observed` tells them apart).
        self.inputs: list[StoredEnvelope] = inputs
        #: The original's inputs not fed (cut by a dead node, or before ``from_ts``).
        self.skipped = len(self.observed(self.lineage.inputs)) - len(self.observed(inputs))
        self.truncated = truncated
        self.recorder = Recorder(
            store,
            scenario=scenario if scenario is not None else original.scenario,
            scenario_text=scenario_text if scenario_text is not None else original.scenario_text,
            scenario_dir=original.scenario_dir,
            seed=original.seed,
            replay_of=None if forked else original.id,
            forked_from=original.id if forked else None,
            kind=kind,
        )
        self.desk = (
            None
            if approvals is None
            else StoreDesk(
                Path(store.path),
                self.recorder.session_id,
                approvals,
                origin=origin,
                on_waiting=on_waiting,
            )
        )
        self.tracker = Tracker(
            self.lineage, inputs, halts=policy.halts, truncated=truncated, tolerated=self.tolerated
        )
        index = _effect_index(self.effects, lambda: store.deliveries(original.id))
        self.runner = self.recorder.use_effects(
            lambda sink: RerunEffects(
                sink,
                index,
                self.tracker,
                policy,
                seed=original.seed,
                desk=self.desk,
                on_divergence=self._effect_diverged,
                requests=_requests(store, original.id),
            )
        )
        self.tracker.active = self.runner.active
        #: The original inputs fed so far, in order.
        self.published: list[StoredEnvelope] = []
        #: Gives each input fed the number it had in the original (an Observer that goes
        #: on after them, in a resumed run, numbers its inputs from here).
        self.ordinals = InputOrdinals()

    @property
    def session_id(self) -> str:
        return self.recorder.session_id

    def observed(self, roots: Iterable[StoredEnvelope]) -> list[StoredEnvelope]:
        """The inputs among ``roots`` (outside messages of the original, fed again): what
        its Observers published, each under an id carrying its number, and what its summary
        counted as ``inputs`` and ``malformed``.

        The other outside messages (a Monitor's sampled alert, a gateway client's direct
        publish, a flood fault's) are fed again all the same, so the team reacts to them as
        it did, but they were never the input: counted as inputs, a re-run's summary would
        differ from the run's and a custom check comparing a topic's count with
        ``summary.inputs`` would fail on a change that changed nothing. A session recorded
        before inputs were numbered (2026-11-28) cannot tell them apart: every root then,
        as it was counted."""
        if not self.numbered:
            return list(roots)
        return [e for e in roots if input_ordinal(e.id) is not None]

    def others(self, roots: Sequence[StoredEnvelope]) -> dict[str, int]:
        """The outside messages among ``roots`` that are not inputs (:meth:`observed`), by
        topic, the most first: what a report names beside the inputs it fed."""
        kept = {e.id for e in self.observed(roots)}
        return by_name(Counter(e.topic for e in roots if e.id not in kept))

    def _effect_diverged(self, div: ReplayDivergence) -> None:
        if self.truncated and past_the_record(div):
            return
        if self.tolerated and self.lineage.root.get(div.original_id or 0) in self.tolerated:
            return
        self.tracker.differ("effect")

    def serve_desk(self, agents: Iterable[Any]) -> None:
        """Give ``agents`` the new session's approval desk (none without ``approvals``)."""
        if self.desk is not None:
            for agent in agents:
                agent.desk = self.desk

    def track(self, bus: Bus) -> None:
        """Align ``bus``'s messages onto the original: before the recorder or any handler
        sees them, so the mapping exists when a handler's first effect looks it up."""
        bus.observe(self.tracker)

    async def feed(self, bus: Bus, timeout: float | None) -> None:
        """Publish the inputs, paced as the module docstring says; a halting policy stops
        at the first difference, another notes it (``tracker.differences``) and goes on."""
        tracker = self.tracker
        lineage = self.lineage
        roots: set[int] = set()
        originals = lineage.envelopes
        cursor = 0
        for inp in self.inputs:
            if tracker.stopped:
                return
            while cursor < len(originals) and originals[cursor].seq < inp.seq:
                o = originals[cursor]
                cursor += 1
                root = lineage.root.get(o.id)
                if (
                    root in roots
                    and root not in tracker.tolerated
                    and o.id not in tracker.mapper.to_new
                ):
                    tracker.waiting.add(o.id)
            if tracker.waiting:
                tracker.progress.clear()
                await progress_or_quiet(bus, tracker.progress, timeout)
                if tracker.stopped:
                    return
                if tracker.waiting:
                    # Quiet, and still not all there: the team did not publish them.
                    tracker.differ("missing")
                    if tracker.stopped:
                        return
                    tracker.waiting.clear()
            env = Envelope.new(inp.topic, inp.payload, inp.priority, session_id=bus.session_id)
            ordinal = input_ordinal(inp.id)
            if ordinal is not None:  # the number it had, for a fault window that asks
                stamped = self.ordinals.stamp(inp.topic, ordinal)
                if stamped is not None:
                    env.id = env.correlation_id = stamped
            env.context = bus.context
            roots.add(inp.id)
            self.published.append(inp)
            await bus.publish(env)

    async def play(
        self,
        setup: Setup,
        *,
        timeout: float | None = DEFAULT_REPLAY_TIMEOUT,
        after: Callable[[Bus], Awaitable[None]] | None = None,
    ) -> None:
        """The whole loop on a fresh bus: track, record, ``setup(bus)``, feed, drain, then
        ``after(bus)`` (a report read off the bus), and commit the record."""
        async with Bus(session_id=self.session_id) as bus:
            self.track(bus)
            self.recorder.attach(bus)
            await setup(bus)
            await self.feed(bus, timeout)
            await bus.drain(timeout=timeout)
            if after is not None:
                await after(bus)
        await self.recorder.flush()

    async def finish(self, status: Status, summary: dict[str, Any]) -> None:
        """Close the new session with ``status`` and ``summary``, and its desk."""
        try:
            await self.recorder.finish(status, summary)
        finally:
            await self.aclose()

    async def fail(self, summary: dict[str, Any]) -> None:
        """Close the new session as ``failed`` after the re-run raised (never raising
        itself: the caller re-raises the original error)."""
        with contextlib.suppress(Exception):
            await self.finish("failed", summary)

    async def aclose(self) -> None:
        if self.desk is not None:
            await self.desk.aclose()


async def rerun(
    store: SessionStore,
    original: SessionInfo,
    policy: Policy,
    setup: Setup,
    *,
    kind: str,
    timeout: float | None = DEFAULT_REPLAY_TIMEOUT,
    after: Callable[[Bus], Awaitable[None]] | None = None,
    **options: Any,
) -> Rerun:
    """Re-run ``original`` under ``policy`` with the team ``setup`` attaches (see
    :class:`Rerun` for ``options``). Returns the :class:`Rerun`, committed but not closed:
    the caller finishes it with its report (:meth:`Rerun.finish`). If the loop raises, the
    new session is closed as failed and the error propagates."""
    run = Rerun(store, original, policy, kind=kind, **options)
    try:
        await run.play(setup, timeout=timeout, after=after)
    except BaseException as exc:
        await run.fail({"replay_of": original.id, "error": repr(exc)})
        raise
    return run


async def progress_or_quiet(bus: Bus, progress: asyncio.Event, timeout: float | None) -> None:
    """Until ``progress`` is set or ``bus`` has drained (within ``timeout``), whichever is
    first: a re-run waits for the next recorded message this way, without polling."""
    progressed = asyncio.ensure_future(progress.wait())
    drained = asyncio.ensure_future(bus.drain(timeout=timeout))
    try:
        await asyncio.wait({progressed, drained}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (progressed, drained):
            task.cancel()
        await asyncio.gather(progressed, drained, return_exceptions=True)


def credit_inputs(
    observers: Sequence[Observer], inputs: Sequence[StoredEnvelope], malformed_topic: str | None
) -> None:
    """Count the re-published inputs as the first Observer's: a team built for a re-run
    ingests nothing itself, and its summary's inputs are still the run's. ``inputs``: the
    Observers' only (:meth:`Rerun.observed`), as the run counted them."""
    if not observers:
        return
    malformed = sum(e.topic == malformed_topic for e in inputs) if malformed_topic else 0
    observers[0].malformed += malformed
    observers[0].emitted += len(inputs) - malformed
