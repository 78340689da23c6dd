"""Redriving a finished session's dead letters through a (fixed) team."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from agents import FaultTimeline, fault_timeline
from bus import Bus, Delivery, Envelope
from pantheon.sessions._align import is_input
from pantheon.sessions._errors import SessionError
from pantheon.sessions._recorder import Recorder
from pantheon.sessions._store import SessionStore

__all__ = ["DEFAULT_REPLAY_TIMEOUT", "RedriveReport", "Setup", "redrive"]

#: Subscribes a team on a bus (agents or plain handlers). A replay (``pantheon.rerun``) and
#: a redrive call it on the fresh bus they create, after the recorder is attached and
#: before any input.
Setup = Callable[[Bus], Awaitable[None]]

#: Seconds a replay or a redrive waits for the bus to go quiet (per input and at the end).
DEFAULT_REPLAY_TIMEOUT = 300.0


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
