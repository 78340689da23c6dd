"""Replaying a recorded session on a fresh bus, and redriving its dead letters."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from agents import FaultTimeline, fault_timeline
from bus import Bus, Delivery, Envelope
from pantheon.sessions._align import (
    FailureMatch,
    Lineage,
    Mapper,
    compare_runs,
    is_input,
    same_payload,
)
from pantheon.sessions._codec import normalize
from pantheon.sessions._effects import EffectsContext, ReplayEffects
from pantheon.sessions._errors import ReplayDivergence, SessionError
from pantheon.sessions._recorder import Recorder
from pantheon.sessions._store import (
    EFFECT_DIVERGED,
    SessionInfo,
    SessionStore,
    StoredEffect,
    StoredEnvelope,
)

__all__ = ["RedriveReport", "ReplayReport", "Setup", "redrive", "replay_session"]

#: Subscribes a team on a bus (agents or plain handlers). Replay and redrive call it on the
#: fresh bus they create, after the recorder is attached and before any input.
Setup = Callable[[Bus], Awaitable[None]]

#: Seconds a replay waits for the bus to go quiet (per input and at the end).
DEFAULT_REPLAY_TIMEOUT = 300.0


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What :func:`replay_session` found.

    ``matched`` is True when no divergence was found; ``hops_compared`` counts the message
    pairs aligned and compared; ``failures`` lists the deliveries that failed in the
    original and failed the same way (subscriber, outcome, error type) in the replay;
    ``divergence`` is the first :class:`ReplayDivergence`, or None.

    ``incomplete`` says why the original's record stops short (its recording process
    died, or it is still being recorded), else None: the replay then goes up to the last
    committed message, and what the record lacks past that point (messages, deliveries and
    effects the team went on to produce) is not a divergence. ``recorded_messages`` is
    how many messages the record holds, ``reproduced_messages`` how many of them the
    replay produced again."""

    new_session_id: str
    original_session_id: str
    matched: bool
    hops_compared: int
    failures: list[FailureMatch]
    divergence: ReplayDivergence | None
    inputs_replayed: int = 0
    inputs_skipped: int = 0
    effects_served: int = 0
    effects_called: int = 0
    live_effects: bool = False
    incomplete: str | None = None
    recorded_messages: int = 0
    reproduced_messages: int = 0

    def raise_for_divergence(self) -> None:
        """Raise the divergence, if any (as ``httpx.Response.raise_for_status`` does)."""
        if self.divergence is not None:
            raise self.divergence

    def to_dict(self) -> dict[str, Any]:
        return {
            "new_session_id": self.new_session_id,
            "original_session_id": self.original_session_id,
            "matched": self.matched,
            "hops_compared": self.hops_compared,
            "failures": [f.to_dict() for f in self.failures],
            "divergence": None if self.divergence is None else self.divergence.to_dict(),
            "inputs_replayed": self.inputs_replayed,
            "inputs_skipped": self.inputs_skipped,
            "effects_served": self.effects_served,
            "effects_called": self.effects_called,
            "live_effects": self.live_effects,
            "incomplete": self.incomplete,
            "recorded_messages": self.recorded_messages,
            "reproduced_messages": self.reproduced_messages,
        }


def incomplete_reason(info: SessionInfo) -> str | None:
    """Why a session's record stops short of the end of its run, or None when it does not.

    A record is complete once the run closed it (``completed`` or ``failed``); ``aborted``
    means the recording process died (the store marks it so when it finds the process
    gone) and ``running`` that it is still being written."""
    if info.status == "aborted":
        return "aborted: its recording process died"
    if info.status == "running":
        return f"still being recorded (pid {info.pid} on {info.host})"
    return None


def _past_the_record(div: ReplayDivergence) -> bool:
    """A difference an incomplete record explains: the replay has something (a message, an
    effect call, a delivery) where the record simply stops."""
    if div.field == "extra":
        return True
    if div.field == "effect":
        return div.expected is None
    return div.field == "outcome" and div.expected == "not delivered"


def _effect_index(
    effects: Iterable[StoredEffect],
) -> dict[tuple[int, str | None], list[StoredEffect]]:
    index: dict[tuple[int, str | None], list[StoredEffect]] = defaultdict(list)
    for e in effects:
        if e.flag != EFFECT_DIVERGED:
            index[(e.envelope_id, e.subscriber)].append(e)
    for records in index.values():
        records.sort(key=lambda e: e.ordinal)
    return index


class _Live:
    """The replay's view of itself while it runs: aligns each envelope as it is published
    (publish listeners run before routing, so a handler's effects can already be mapped to
    the original) and notices the first divergence, after which no more input is fed."""

    def __init__(
        self, lineage: Lineage, inputs: list[StoredEnvelope], *, truncated: bool = False
    ) -> None:
        self.mapper = Mapper(lineage, inputs)
        #: The record stops short: messages past its end are expected, not a divergence.
        self.truncated = truncated
        #: The replay's effects runner: messages published while one of its live effects
        #: runs belong to the effect and are not aligned (served effects publish nothing).
        self.active: dict[tuple[int, str | None], int] = {}
        self.lineage = lineage
        self.stopped: str | None = None
        self.waiting: set[int] = set()
        self.progress = asyncio.Event()

    def on_publish(self, env: Envelope) -> None:
        if self.mapper.effect_own(env, self.active):
            return
        extras = len(self.mapper.extras)
        orig = self.mapper.feed(env)
        if orig is None:
            if len(self.mapper.extras) > extras and not self.truncated:
                self.stop("extra message")
            return
        if self.waiting:
            self.waiting.discard(orig.id)
            if not self.waiting:
                self.progress.set()
        if orig.topic != env.topic:
            self.stop("topic")
            return
        payload, as_repr = normalize(env.payload)
        probe = StoredEnvelope(
            0, env.id, env.topic, 0, None, None, None, 0, 0, 0.0, payload, as_repr
        )
        if not same_payload(orig, probe):
            self.stop("payload")

    def stop(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why
        self.progress.set()


async def replay_session(
    store: SessionStore,
    session_id: str,
    setup: Setup,
    *,
    live_effects: bool = False,
    from_ts: float | None = None,
    raise_on_divergence: bool = False,
    timeout: float | None = DEFAULT_REPLAY_TIMEOUT,
) -> ReplayReport:
    """Re-run a recorded session on a fresh bus and check it takes the same path.

    ``setup(bus)`` subscribes the team. The replay is recorded as a new session
    (``kind='replay'``, ``replay_of`` = the original). The original's outside inputs
    (envelopes with no cause and no source, ``system.*`` excluded) are re-published in
    recorded order, each one once every message the original had published before it has
    been published again (or the bus has gone quiet): that reproduces how inputs
    interleaved with the work they caused. Effects are served from the record (no real
    call) unless ``live_effects`` is set.

    Then the two runs are aligned hop by hop (see ``pantheon.sessions._align``) and
    compared: topic and payload of every message, missing and extra messages, effect names
    and order, and every delivery's outcome (a handler that failed in the original must fail
    at the same hop, for the same subscriber, with the same error type). At the first
    divergence noticed while running, no further input is fed; the run drains and the
    comparison reports the earliest divergence in the original's order.

    ``from_ts`` (seconds since the original started) starts the replay at the first input
    published at or after it. "Restored" means exactly this: earlier inputs are not
    re-published, and neither they nor anything they caused is compared; effects are still
    served from the record for everything that is replayed. Agent state that earlier inputs
    built up is *not* restored (the team starts fresh), so a team whose later handling
    depends on that state diverges, and the report says where.

    Returns a :class:`ReplayReport`; with ``raise_on_divergence`` a divergence is raised
    instead (after the replay session is closed).
    """
    original = store.session(session_id)
    incomplete = incomplete_reason(original)
    envelopes = store.envelopes(original.id)
    original_effects = store.effects(original.id)
    lineage = Lineage(envelopes, original_effects)
    inputs = lineage.inputs
    if from_ts is not None:
        inputs = [e for e in inputs if e.wall - original.started >= from_ts]
    skipped = len(lineage.inputs) - len(inputs)
    recorded = _effect_index(original_effects)
    live = _Live(lineage, inputs, truncated=incomplete is not None)

    recorder = Recorder(
        store,
        scenario=original.scenario,
        scenario_text=original.scenario_text,
        scenario_dir=original.scenario_dir,
        seed=original.seed,
        replay_of=original.id,
        kind="replay",
    )

    def effect_diverged(div: ReplayDivergence) -> None:
        if incomplete is None or not _past_the_record(div):
            live.stop("effect")

    runner = ReplayEffects(
        recorder._writer.events.append,
        recorded,
        live.mapper.to_original.get,
        live=live_effects,
        seed=original.seed,
        on_divergence=effect_diverged,
    )
    live.active = runner.active
    recorder._effects = EffectsContext.wrap(runner)
    published: list[StoredEnvelope] = []
    status = "completed"
    try:
        async with Bus(session_id=recorder.session_id) as bus:
            # Ours first: the mapping must exist before the recorder or any handler sees it.
            bus.observe(live)
            recorder.attach(bus)
            await setup(bus)
            await _feed(bus, live, lineage, inputs, published, timeout)
            await bus.drain(timeout=timeout)
        await recorder.flush()
        comparison = compare_runs(
            lineage,
            store.envelopes(recorder.session_id),
            original_deliveries=store.deliveries(original.id),
            new_deliveries=store.deliveries(recorder.session_id),
            original_effects=original_effects,
            new_effects=store.effects(recorder.session_id),
            inputs=inputs,
            roots={e.id for e in published},
        )
    except BaseException:
        status = "failed"
        with contextlib.suppress(Exception):
            await recorder.finish("failed", {"replay_of": original.id, "error": "replay raised"})
        raise
    divergence = comparison.divergence
    if incomplete is not None:
        divergence = next((d for d in comparison.divergences if not _past_the_record(d)), None)
    report = ReplayReport(
        new_session_id=recorder.session_id,
        original_session_id=original.id,
        matched=divergence is None,
        hops_compared=len(comparison.pairs),
        failures=comparison.failures,
        divergence=divergence,
        inputs_replayed=len(published),
        inputs_skipped=skipped,
        effects_served=runner.served,
        effects_called=runner.calls,
        live_effects=live_effects,
        incomplete=incomplete,
        recorded_messages=len(envelopes),
        reproduced_messages=len(comparison.pairs),
    )
    await recorder.finish(status, {"replay": report.to_dict()})  # type: ignore[arg-type]
    if raise_on_divergence:
        report.raise_for_divergence()
    return report


async def _feed(
    bus: Bus,
    live: _Live,
    lineage: Lineage,
    inputs: list[StoredEnvelope],
    published: list[StoredEnvelope],
    timeout: float | None,
) -> None:
    roots: set[int] = set()
    originals = lineage.envelopes
    cursor = 0
    for inp in inputs:
        if live.stopped:
            return
        # Everything the original published before this input, under inputs already fed,
        # should have been published again before we feed it.
        while cursor < len(originals) and originals[cursor].seq < inp.seq:
            o = originals[cursor]
            cursor += 1
            if lineage.root.get(o.id) in roots and o.id not in live.mapper.to_new:
                live.waiting.add(o.id)
        if live.waiting:
            await _wait_for(bus, live, timeout)
            if live.stopped:
                return
            if live.waiting:
                live.stop("missing")
                return
        env = Envelope.new(inp.topic, inp.payload, inp.priority, session_id=bus.session_id)
        env.context = bus.context
        roots.add(inp.id)
        published.append(inp)
        await bus.publish(env)


async def _wait_for(bus: Bus, live: _Live, timeout: float | None) -> None:
    """Until the awaited messages all appeared, something diverged, or the bus is quiet."""
    live.progress.clear()
    if not live.waiting or live.stopped:
        return
    await progress_or_quiet(bus, live.progress, timeout)


async def progress_or_quiet(bus: Bus, progress: asyncio.Event, timeout: float | None) -> None:
    """Until ``progress`` is set or ``bus`` has drained (within ``timeout``), whichever is
    first: a replay waits for the next recorded message this way, without polling."""
    progressed = asyncio.ensure_future(progress.wait())
    drained = asyncio.ensure_future(bus.drain(timeout=timeout))
    try:
        await asyncio.wait({progressed, drained}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (progressed, drained):
            task.cancel()
        await asyncio.gather(progressed, drained, return_exceptions=True)


@dataclass(frozen=True, slots=True)
class RedriveReport:
    """What :func:`redrive` did: the new session it ran in and, per dead-letter entry, the
    outcome of its redelivery (``delivered``, ``skipped: <why>``, or anything else when it
    failed again: ``failed: <ErrorType>: message``, ``circuit_open: ...``).

    ``ok`` is False when any entry failed again or was skipped: the CLI exits 1 then, and
    :attr:`outcome` says so in words ("3 of 17 failed again")."""

    new_session_id: str
    original_session_id: str
    outcomes: dict[int, str] = field(default_factory=dict)

    @property
    def redriven(self) -> list[int]:
        return [k for k, v in self.outcomes.items() if v == "delivered"]

    @property
    def skipped(self) -> list[int]:
        return [k for k, v in self.outcomes.items() if v.startswith("skipped:")]

    @property
    def failed(self) -> list[int]:
        """Entries whose redelivery failed again (they stay dead letters, not redriven)."""
        return [
            k for k, v in self.outcomes.items() if v != "delivered" and not v.startswith("skipped:")
        ]

    @property
    def ok(self) -> bool:
        return len(self.redriven) == len(self.outcomes)

    @property
    def outcome(self) -> str:
        """``N of M redriven, K failed again`` (and ``S skipped`` when some were)."""
        text = f"{len(self.redriven)} of {len(self.outcomes)} redriven"
        text += f", {len(self.failed)} failed again"
        if self.skipped:
            text += f", {len(self.skipped)} skipped"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "new_session_id": self.new_session_id,
            "original_session_id": self.original_session_id,
            "outcomes": {str(k): v for k, v in self.outcomes.items()},
            "redriven": self.redriven,
            "failed": self.failed,
            "skipped": self.skipped,
            "attempted": len(self.outcomes),
            "ok": self.ok,
            "outcome": self.outcome,
        }


async def redrive(
    store: SessionStore,
    session_id: str,
    setup: Setup,
    entry_ids: Iterable[int] | None = None,
    *,
    timeout: float | None = DEFAULT_REPLAY_TIMEOUT,
) -> RedriveReport:
    """Redrive dead letters of a *finished* session: re-deliver each entry's envelope to the
    subscription that failed it, on a fresh bus set up by ``setup`` (the team as it is now,
    typically fixed), with live effects, recorded as a new session (``kind='redrive'``).

    An entry that is delivered this time is marked ``redriven`` in the original session.
    All entries not yet redriven by default. Messages the redriven handlers emit are
    handled by the team as usual. A session still recording belongs to its process: redrive
    it there with ``bus.dlq.redrive()``.

    Agents attaching in ``setup`` continue the original run's fault timeline
    (:data:`agents.fault_timeline`): its start, and the inputs it took in. A redrive happens
    later in the same story, so a fault window (``until``) that ended during the run does
    not fail the redrive.
    """
    original = store.session(session_id)
    if original.status == "running":
        raise SessionError(
            f"session {original.id} is still running (pid {original.pid}); redrive its dead "
            "letters from that process with bus.dlq.redrive()"
        )
    entries = {e.entry_id: e for e in store.dead_letters(original.id)}
    wanted = (
        [i for i, e in entries.items() if not e.redriven] if entry_ids is None else list(entry_ids)
    )
    unknown = [i for i in wanted if i not in entries]
    if unknown:
        raise SessionError(f"session {original.id} has no dead letter {unknown[0]}")
    by_id = {e.id: e for e in store.envelopes(original.id)}
    inputs = Counter(e.topic for e in by_id.values() if is_input(e))
    timeline = FaultTimeline(original.started, max(inputs.values(), default=0))
    recorder = Recorder(
        store,
        scenario=original.scenario,
        scenario_text=original.scenario_text,
        scenario_dir=original.scenario_dir,
        seed=original.seed,
        replay_of=original.id,
        kind="redrive",
    )
    outcomes: dict[int, str] = {}
    try:
        async with Bus(session_id=recorder.session_id) as bus:
            joined = fault_timeline.set(timeline)
            try:
                await setup(bus)
            finally:
                fault_timeline.reset(joined)
            subs = bus.subscriptions()
            staged: dict[int, int] = {}
            for entry_id in wanted:
                entry = entries[entry_id]
                stored = by_id.get(entry.envelope_id)
                if stored is None or entry.subscriber not in subs:
                    why = "envelope not recorded" if stored is None else "no such subscriber"
                    outcomes[entry_id] = f"skipped: {why}"
                    continue
                env = Envelope.new(
                    stored.topic,
                    stored.payload,
                    stored.priority,
                    session_id=recorder.session_id,
                )
                env.context = recorder.effects
                # Staged in this bus's DLQ before the recorder attaches, so the only record
                # is the redelivery itself.
                local = bus.dlq.add(env, entry.subscriber, "redrive")
                staged[entry_id] = local.entry_id
            recorder.attach(bus)
            seen: dict[tuple[int, str], str] = {}

            def watch(d: Delivery) -> None:
                seen[(d.envelope.id, d.subscriber)] = d.outcome

            watching = bus.observe(SimpleNamespace(on_delivery=watch))
            for entry_id, local_id in staged.items():
                letter = bus.dlq.get(local_id)
                await bus.dlq.redrive([local_id])
                await bus.drain(timeout=timeout)
                outcome = seen.get((letter.envelope.id, letter.subscriber), "not delivered")
                if outcome != "delivered":
                    again = [
                        d
                        for d in bus.dlq.entries(subscriber=letter.subscriber)
                        if d.envelope.id == letter.envelope.id and d.reason != "redrive"
                    ]
                    if again:
                        outcome = f"{outcome}: {again[-1].error_type}: {again[-1].error}"
                outcomes[entry_id] = outcome
            watching.close()
    except BaseException:
        with contextlib.suppress(Exception):
            await recorder.finish("failed", {"redrive_of": original.id})
        raise
    report = RedriveReport(recorder.session_id, original.id, outcomes)
    for entry_id, outcome in outcomes.items():
        if outcome == "delivered":
            store.mark_redriven(original.id, entry_id, recorder.session_id)
    await recorder.finish("completed", {"redrive": report.to_dict()})
    return report
