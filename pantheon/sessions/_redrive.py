"""Redriving a finished session's dead letters through a (fixed) team."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from agents import ApprovalDesk, FaultTimeline, attach_desk, fault_timeline
from bus import Bus, DeadLetter, DeadLetterRecord, Delivery, Envelope
from pantheon.sessions._align import is_input
from pantheon.sessions._errors import SessionError
from pantheon.sessions._recorder import Recorder
from pantheon.sessions._store import SessionStore

__all__ = [
    "DEFAULT_REPLAY_TIMEOUT",
    "DeskFactory",
    "RedriveDeadLetter",
    "RedriveReport",
    "Setup",
    "redrive",
]

#: Subscribes a team on a bus (agents or plain handlers). A replay (``pantheon.rerun``) and
#: a redrive call it on the fresh bus they create, after the recorder is attached and
#: before any input.
Setup = Callable[[Bus], Awaitable[None]]

#: Opens the approval desk of the session named (a redrive's own): what the team's
#: ``approve()`` asks while the redrive runs. ``pantheon.approvals.approval_desk`` with the
#: scenario and the store is one (``pantheon dlq redrive`` passes it).
DeskFactory = Callable[[str], contextlib.AbstractAsyncContextManager[ApprovalDesk]]

#: Seconds a replay or a redrive waits for the bus to go quiet (per input and at the end).
DEFAULT_REPLAY_TIMEOUT = 300.0

#: How an entry's outcome starts when its redelivery went through and what it caused failed.
DOWNSTREAM = "failed downstream: "
#: Dead letters a downstream failure's outcome names before "and N more".
_NAMED = 3


@dataclass(frozen=True, slots=True)
class RedriveDeadLetter(DeadLetterRecord):
    """A dead letter of the redrive's own session (``entry_id`` is its number there, what
    ``pantheon dlq list`` shows), and ``caused_by``: the redriven entry of the original
    whose redelivery it was or led to (followed by causation, then correlation, id), or
    None when none did."""

    caused_by: int | None

    def describe(self) -> str:
        """``#9 approver on invoice.checked: failed: ApprovalUnavailable: ...``"""
        text = f"#{self.entry_id} {self.subscriber} on {self.topic}: {self.reason}"
        return f"{text}: {self.error_type}: {self.error}" if self.error_type else text

    def to_dict(self) -> dict[str, Any]:
        return {
            "entry_id": self.entry_id,
            "envelope_id": self.envelope_id,
            "topic": self.topic,
            "subscriber": self.subscriber,
            "reason": self.reason,
            "error_type": self.error_type,
            "error": self.error,
            "attempts": self.attempts,
            "caused_by": self.caused_by,
        }


@dataclass(frozen=True, slots=True)
class RedriveReport:
    """What :func:`redrive` did: the new session it ran in (None when there was nothing to
    redrive: no session is recorded for it) and, per dead-letter entry, the
    outcome of its redelivery (``delivered``, ``skipped: <why>``, or anything else when it
    failed again: ``failed: <ErrorType>: message``, ``circuit_open: ...``, or
    ``failed downstream: <the dead letters>`` when the redelivery went through but what it
    caused in the redrive was dead-lettered). ``new_dead_letters``: every dead letter of
    the redrive's session, each with the entry that caused it.

    ``ok`` is False when any entry failed again (itself or downstream) or was skipped: the
    CLI exits 1 then, and :attr:`outcome` says so in words ("3 of 17 failed again")."""

    new_session_id: str | None
    original_session_id: str
    outcomes: dict[int, str] = field(default_factory=dict)
    new_dead_letters: tuple[RedriveDeadLetter, ...] = ()

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
    def downstream(self) -> list[int]:
        """Failed entries whose redelivery itself went through: what it caused did not."""
        return [k for k, v in self.outcomes.items() if v.startswith(DOWNSTREAM)]

    @property
    def ok(self) -> bool:
        return len(self.redriven) == len(self.outcomes)

    @property
    def outcome(self) -> str:
        """``N of M redriven, K failed again`` (``(D downstream)`` when some of those
        failed past their redelivery, and ``S skipped`` when some were)."""
        text = f"{len(self.redriven)} of {len(self.outcomes)} redriven"
        text += f", {len(self.failed)} failed again"
        if self.downstream:
            text += f" ({len(self.downstream)} downstream)"
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
            "downstream": self.downstream,
            "skipped": self.skipped,
            "new_dead_letters": [d.to_dict() for d in self.new_dead_letters],
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
    desk: DeskFactory | None = None,
    on_start: Callable[[str, int], None] | None = None,
) -> RedriveReport:
    """Redrive dead letters of a *finished* session: re-deliver each entry's envelope to the
    subscription that failed it, on a fresh bus set up by ``setup`` (the team as it is now,
    typically fixed), with live effects, recorded as a new session (``kind='redrive'``).

    Messages the redriven handlers emit are handled by the team as usual, and an entry
    counts as redriven only when its redelivery *and everything it caused* in the new
    session went through: one whose handling, or any message descended from it, was
    dead-lettered there failed again (``failed downstream: ...``), and stays a dead letter
    of the original. Redriven entries are marked ``redriven`` in the original session. All
    entries not yet redriven by default. A session still recording belongs to its process:
    redrive it there with ``bus.dlq.redrive()``. When there is nothing to redrive (every
    entry redriven already, or none) nothing runs and nothing is recorded: the report's
    ``new_session_id`` is None, since an empty session would only list a redrive that did
    nothing.

    ``desk(new_session_id)`` opens the approval desk the team's ``approve()`` asks (given
    to every agent attaching in ``setup`` that has none, through
    :data:`agents.attach_desk`); without it an agent that asks fails its message. Each
    entry's drain waits at most ``timeout`` seconds, a wait for a person included.
    ``on_start(new_session_id, entries)`` hears of the new session before anything runs:
    a redrive that waits for a person can take minutes, and it is that session's requests
    a person decides.

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
    if not wanted:
        return RedriveReport(None, original.id)
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
    staged: dict[int, DeadLetter] = {}  # the original's entry id -> its redelivery's
    trail = _Trail()
    try:
        if on_start is not None:
            on_start(recorder.session_id, len(wanted))
        async with contextlib.AsyncExitStack() as closing:
            # Entered first, so it closes last: the bus drains while approvals can still be
            # decided.
            asking = (
                None
                if desk is None
                else await closing.enter_async_context(desk(recorder.session_id))
            )
            bus = await closing.enter_async_context(Bus(session_id=recorder.session_id))
            joined = fault_timeline.set(timeline)
            given = attach_desk.set(asking)
            try:
                await setup(bus)
            finally:
                attach_desk.reset(given)
                fault_timeline.reset(joined)
            subs = bus.subscriptions()
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
                # Staged in this bus's DLQ before the recorder (and the trail) attach, so
                # the only record is the redelivery itself.
                staged[entry_id] = bus.dlq.add(env, entry.subscriber, "redrive")
                trail.roots[env.id] = entry_id
            recorder.attach(bus)
            seen: dict[tuple[int, str], str] = {}

            def watch(d: Delivery) -> None:
                seen[(d.envelope.id, d.subscriber)] = d.outcome

            watching = bus.observe(SimpleNamespace(on_delivery=watch))
            bus.observe(trail)  # to the end: a dead letter listed as the bus closes counts
            for entry_id, letter in staged.items():
                await bus.dlq.redrive([letter.entry_id])
                await bus.drain(timeout=timeout)
                outcomes[entry_id] = seen.get(
                    (letter.envelope.id, letter.subscriber), "not delivered"
                )
            watching.close()
    except BaseException:
        with contextlib.suppress(Exception):
            await recorder.finish("failed", {"redrive_of": original.id})
        raise
    letters = trail.letters()
    for entry_id, letter in staged.items():
        caused = [d for d in letters if d.caused_by == entry_id]
        outcomes[entry_id] = _judged(outcomes[entry_id], letter, caused)
    report = RedriveReport(recorder.session_id, original.id, outcomes, tuple(letters))
    for entry_id, outcome in outcomes.items():
        if outcome == "delivered":
            store.mark_redriven(original.id, entry_id, recorder.session_id)
    await recorder.finish("completed", {"redrive": report.to_dict()})
    return report


class _Trail:
    """What the redelivered envelopes (``roots``: envelope id -> the original's entry id)
    cause in the redrive: each descendant's cause as the bus publishes it, and every dead
    letter as it is listed. A bus observer, so inline, quick and never raising.

    Only descendants of a root are kept (a message whose cause is not one is no part of
    any entry's story), so the trail is as long as the redrive's own work, not the team's
    background chatter."""

    __slots__ = ("causes", "dead", "roots")

    def __init__(self) -> None:
        self.roots: dict[int, int] = {}
        self.causes: dict[int, int] = {}
        self.dead: list[DeadLetter] = []

    def on_publish(self, env: Envelope) -> None:
        cause = env.causation_id
        if cause is not None and (cause in self.roots or cause in self.causes):
            self.causes[env.id] = cause

    def on_dead_letter(self, letter: DeadLetter) -> None:
        self.dead.append(letter)

    def root(self, env: Envelope) -> int | None:
        """The entry ``env`` descends from: up its causes to a root, else the root its
        correlation id names (a message published with a correlation but no cause)."""
        at: int | None = env.id
        # Bounded: a cause is always published before what it causes, so the chain
        # cannot loop, but a damaged one must not hang the report either.
        for _ in range(len(self.causes) + 1):
            if at is None:
                break
            if at in self.roots:
                return self.roots[at]
            at = self.causes.get(at)
        return self.roots.get(env.correlation_id)

    def letters(self) -> list[RedriveDeadLetter]:
        return [RedriveDeadLetter.of(d, caused_by=self.root(d.envelope)) for d in self.dead]


def _judged(delivery: str, letter: DeadLetter, caused: list[RedriveDeadLetter]) -> str:
    """An entry's outcome from its redelivery's (``delivery``, for ``letter``) and the new
    dead letters it ``caused``: its own failure, with the error, or the first ones
    downstream when the redelivery itself went through."""
    own = [
        d
        for d in caused
        if d.envelope_id == letter.envelope.id and d.subscriber == letter.subscriber
    ]
    if delivery != "delivered":
        if own and own[-1].error_type:
            return f"{delivery}: {own[-1].error_type}: {own[-1].error}"
        return delivery
    if not caused:
        return delivery
    named = "; ".join(d.describe() for d in caused[:_NAMED])
    more = len(caused) - _NAMED
    return DOWNSTREAM + named + (f" (and {more} more)" if more > 0 else "")
