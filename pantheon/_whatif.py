"""What-if replay: the recorded inputs of a session through a team changed by an overlay.

An exact replay (``pantheon.sessions.replay_session``) checks that the *same* team takes the
same path. A what-if replay asks what a *changed* team would have done with the same inputs:
the overlay (see :mod:`pantheon._overlay`) is merged over the recorded scenario, the team it
makes is attached to a fresh bus, the original's outside inputs are re-published in the
recorded order, and every effect is either served from the record or run live:

* **served** when the call is the one the original made: the same agent, with the same
  configuration (:func:`~pantheon._overlay.agent_fingerprints`; for ``model.*`` calls the
  model provider too), handling a message equal to the original's (same topic and
  payload, aligned by lineage), at the same position among that handling's effects, with
  the same effect name, and every earlier effect of that handling answered as recorded.
  An agent is deterministic given its message and its effects' answers, so such a call
  has the same arguments as the recorded one;
* **live** otherwise (a changed message, a changed agent, an added agent, a handling that
  already left the recorded path), and recorded in the new session.

The result is an ordinary session (``kind='whatif'``, ``forked_from`` = the original)
whose scenario text is the merged one, so it can itself be replayed exactly; its summary
holds the overlay, the headline of the decision diff against the original, the accuracy
and the accuracy expectation judged anew (``pantheon diff`` recomputes the full diff).

What is not carried over: state an agent built from *served* effects it would have run
(a Learner whose ``learner.observe`` was served has not counted those outcomes). Its
live calls then see only what ran live; the decision diff scores both runs from the
record instead, so accuracy is measured the same way for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bus import Bus, Envelope
from pantheon._overlay import Overlay, agent_fingerprints, apply_overlay
from pantheon._report import accuracy_bounds
from pantheon.rerun import OutcomeDiff, diff_outcomes
from pantheon.scenario import ScenarioError, parse_scenario
from pantheon.sessions import (
    EffectsContext,
    Recorder,
    RecordingEffects,
    SessionStore,
    StoredEffect,
    StoredEnvelope,
)
from pantheon.sessions._align import Lineage, Mapper, same_payload
from pantheon.sessions._codec import decode, encode, normalize
from pantheon.sessions._effects import EffectSink, rebuild_error
from pantheon.sessions._replay import (
    DEFAULT_REPLAY_TIMEOUT,
    _effect_index,
    incomplete_reason,
    progress_or_quiet,
)
from pantheon.sessions._store import EFFECT_ERROR, EFFECT_OK, EFFECT_REPR

__all__ = ["WhatIfEffects", "WhatIfReport", "whatif_replay"]


def _agent(subscriber: str | None) -> str | None:
    return None if subscriber is None else subscriber.partition(":")[0]


class WhatIfEffects(RecordingEffects):
    """Serves an effect from the original session when the call is the recorded one (see
    the module docstring), and calls it for real otherwise; either way it is recorded in
    the new session.

    ``same_agent(agent, model_call)`` says whether an agent's configuration is unchanged;
    ``identical`` holds the new run's envelope ids whose message equals the original's.
    """

    __slots__ = ("_identical", "_recorded", "_same_agent", "_tainted", "_to_original", "served")

    def __init__(
        self,
        sink: EffectSink,
        recorded: Mapping[tuple[int, str | None], Sequence[StoredEffect]],
        to_original: Callable[[int], int | None],
        identical: set[int],
        same_agent: Callable[[str | None, bool], bool],
        *,
        seed: int | None = None,
    ) -> None:
        super().__init__(sink, seed)
        self._recorded = recorded
        self._to_original = to_original
        self._identical = identical
        self._same_agent = same_agent
        #: Handlings (envelope, subscriber) whose effects left the recorded path.
        self._tainted: set[tuple[int, str | None]] = set()
        #: Effects served from the record (the rest, ``calls``, ran live).
        self.served = 0

    def _record_at(self, env_id: int, sub: str | None, n: int, name: str) -> StoredEffect | None:
        """The recorded effect this call may be served from, or None if it must run."""
        if (env_id, sub) in self._tainted:
            return None
        if env_id:
            orig_id = self._to_original(env_id)
            if orig_id is None or env_id not in self._identical:
                return None
        else:
            orig_id = 0
        if not self._same_agent(_agent(sub), name.startswith("model.")):
            return None
        records = self._recorded.get((orig_id, sub), ())
        rec = records[n] if n < len(records) else None
        if rec is None or rec.name != name or rec.flag == EFFECT_REPR:
            return None
        return rec

    async def effect(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        env_id, sub, n = self._key()
        rec = self._record_at(env_id, sub, n, name)
        if rec is None:
            return await self._live(env_id, sub, n, name, fn, args, kwargs)
        self.served += 1
        self._sink(
            ("effect", env_id, sub, n, name, rec.flag, rec.result, rec.error_type, rec.error,
             *self._stamp())
        )  # fmt: skip
        if rec.flag == EFFECT_ERROR:
            raise rebuild_error(rec.error_type or "Exception", rec.error or "")
        return decode(rec.result)

    async def _live(
        self,
        env_id: int,
        sub: str | None,
        n: int,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        # Later effects of this handling stay on the recorded path only if this one answers
        # what the record says it answered (a changed rule set that still classifies the
        # email the same way leaves its threshold read servable).
        orig_id = self._to_original(env_id) if env_id else 0
        records = self._recorded.get((orig_id, sub), ()) if orig_id is not None else ()
        rec = records[n] if n < len(records) else None
        try:
            result = await self._run(env_id, sub, n, name, fn, args, kwargs)
        except Exception:
            self._tainted.add((env_id, sub))
            raise
        answered = None if rec is None or rec.name != name or rec.flag != EFFECT_OK else rec.result
        if answered is None or encode(result)[0] != answered:
            self._tainted.add((env_id, sub))
        return result

    @staticmethod
    def _stamp() -> tuple[float, int, int]:
        now_ns = time.monotonic_ns()
        return time.time(), now_ns, now_ns


@dataclass(frozen=True, slots=True)
class WhatIfReport:
    """What :func:`whatif_replay` did: the new session, how many effects were served from
    the record and how many ran live, and the decisions that changed (``decisions``)."""

    new_session_id: str
    original_session_id: str
    overlay_source: str
    inputs_replayed: int
    effects_served: int
    effects_called: int
    decisions: OutcomeDiff
    #: The scenario's ``min_accuracy`` as checks: (name, accuracy key, bound).
    accuracy_bounds: tuple[tuple[str, str, float], ...] = ()

    @property
    def accuracy(self) -> dict[str, Any]:
        """The changed team's ``accuracy`` block, as a run's summary has it."""
        return self.decisions.b.score.as_report()

    @property
    def passed(self) -> bool | None:
        """Whether the changed team meets the scenario's ``min_accuracy`` (None: no bound
        or no labels)."""
        acc = self.accuracy
        if not self.accuracy_bounds or not acc["scored"]:
            return None
        return all(
            acc.get(key) is not None and acc[key] >= bound for _, key, bound in self.accuracy_bounds
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "new_session_id": self.new_session_id,
            "original_session_id": self.original_session_id,
            "overlay_source": self.overlay_source,
            "inputs_replayed": self.inputs_replayed,
            "effects_served": self.effects_served,
            "effects_called": self.effects_called,
            "min_accuracy": {name: bound for name, _, bound in self.accuracy_bounds},
            "passed": self.passed,
            "decisions": self.decisions.to_dict(),
        }


class _Aligner:
    """Aligns the new run's messages onto the original as they are published, and notes
    which are equal to their original (their handlers' effects may then be served)."""

    def __init__(self, lineage: Lineage, runner_active: dict[tuple[int, str | None], int]):
        self.mapper = Mapper(lineage)
        self.active = runner_active
        self.identical: set[int] = set()
        self.waiting: set[int] = set()
        self.progress = asyncio.Event()

    def on_publish(self, env: Envelope) -> None:
        if self.mapper.effect_own(env, self.active):
            return
        orig = self.mapper.feed(env)
        if orig is None:
            return
        if self.waiting:
            self.waiting.discard(orig.id)
            if not self.waiting:
                self.progress.set()
        if orig.topic != env.topic:
            return
        payload, as_repr = normalize(env.payload)
        probe = StoredEnvelope(
            0, env.id, env.topic, 0, None, None, None, 0, 0, 0.0, payload, as_repr
        )
        if same_payload(orig, probe):
            self.identical.add(env.id)


async def whatif_replay(
    store: SessionStore,
    session_id: str,
    overlay: Overlay | str,
    *,
    source: str = "<overlay>",
    timeout: float | None = DEFAULT_REPLAY_TIMEOUT,
) -> WhatIfReport:
    """Replay session ``session_id``'s inputs through its team changed by ``overlay`` (the
    overlay's YAML text, named ``source`` in errors, or an :class:`Overlay` already applied)
    and record the run as a new session linked to the original.

    Raises :class:`~pantheon.scenario.ScenarioError` (located in the overlay) before
    anything runs when the overlay is invalid, and ``SessionError`` when the session is
    unknown, has no scenario text, or its record is incomplete."""
    from pantheon._team import team_setup
    from pantheon.sessions import SessionError

    original = store.session(session_id)
    if not original.scenario_text:
        raise SessionError(
            f"session {original.id} has no scenario text, so its team cannot be changed"
        )
    incomplete = incomplete_reason(original)
    if incomplete is not None:
        raise SessionError(f"session {original.id} is {incomplete}: replay a finished session")
    remote = sorted(set(original.summary.get("nodes") or ()) - {"driver"})
    if remote:
        # As for an exact replay: hops handled on other nodes, and their effects, are not
        # in the record, so there is nothing to serve them from or to compare them with.
        raise SessionError(
            f"session {original.id} ran on several processes (nodes: {', '.join(remote)}); "
            "only the driver's messages are recorded. Try the change on a single-process run."
        )
    base_dir = None if original.scenario_dir is None else Path(original.scenario_dir)
    if isinstance(overlay, str):
        overlay = apply_overlay(original.scenario_text, overlay, source=source, base_dir=base_dir)
    try:
        before = parse_scenario(original.scenario_text, base_dir=base_dir, check_files=False)
    except ScenarioError as exc:
        raise SessionError(f"cannot rebuild the recorded team of {original.id}:\n{exc}") from None
    old, new = agent_fingerprints(before), agent_fingerprints(overlay.scenario)

    def same_agent(agent: str | None, model_call: bool) -> bool:
        if agent is None:
            return True
        a, b = old.get(agent), new.get(agent)
        return a is not None and b is not None and a[model_call] == b[model_call]

    setup = team_setup(overlay.merged_text, base_dir=base_dir)
    original_effects = store.effects(original.id)
    lineage = Lineage(store.envelopes(original.id), original_effects)
    recorder = Recorder(
        store,
        scenario=overlay.scenario.name,
        scenario_text=overlay.merged_text,
        scenario_dir=original.scenario_dir,
        seed=original.seed,
        kind="whatif",
        forked_from=original.id,
    )
    runner_active: dict[tuple[int, str | None], int] = {}
    aligner = _Aligner(lineage, runner_active)
    runner = WhatIfEffects(
        recorder._writer.events.append,
        _effect_index(original_effects),
        aligner.mapper.to_original.get,
        aligner.identical,
        same_agent,
        seed=original.seed,
    )
    runner.active = runner_active
    recorder._effects = EffectsContext.wrap(runner)
    fed = 0
    try:
        async with Bus(session_id=recorder.session_id) as bus:
            bus.observe(SimpleNamespace(on_publish=aligner.on_publish))
            recorder.attach(bus)
            await setup(bus)
            fed = await _feed(bus, aligner, lineage, timeout)
            await bus.drain(timeout=timeout)
        await recorder.flush()
    except BaseException:
        with contextlib.suppress(Exception):
            await recorder.finish("failed", {"forked_from": original.id, "error": "raised"})
        raise
    decisions = diff_outcomes(store, original.id, recorder.session_id)
    report = WhatIfReport(
        new_session_id=recorder.session_id,
        original_session_id=original.id,
        overlay_source=overlay.source,
        inputs_replayed=fed,
        effects_served=runner.served,
        effects_called=runner.calls,
        decisions=decisions,
        accuracy_bounds=tuple(accuracy_bounds(overlay.scenario)),
    )
    await recorder.finish("completed", _summary(report, overlay))
    return report


def _summary(report: WhatIfReport, overlay: Overlay) -> dict[str, Any]:
    """The new session's summary: the what-if, its overlay and accuracy, and the one
    expectation a replay can judge anew (accuracy; timings of a replay mean nothing)."""
    acc = report.accuracy
    summary: dict[str, Any] = {
        # The overlay's text inside the what-if record: `sessions show` prints it as one
        # JSON line rather than spilling its lines into the summary.
        "whatif": {k: v for k, v in report.to_dict().items() if k != "decisions"}
        | {"overlay": overlay.text},
        "decisions": report.decisions.headline(),
        "accuracy": acc,
    }
    if report.accuracy_bounds:
        summary["expectations"] = [
            {
                "name": name,
                "passed": acc.get(key) is not None and acc[key] >= bound,
                "expected": bound,
                "actual": acc.get(key),
            }
            for name, key, bound in report.accuracy_bounds
        ]
    return summary


async def _feed(bus: Bus, aligner: _Aligner, lineage: Lineage, timeout: float | None) -> int:
    """Publish the original's inputs in order, each once what the original had published
    before it under earlier inputs has appeared again or the bus went quiet (a changed
    team need not publish it at all): that keeps inputs interleaved with the work they
    caused as they were, which the live agents' state (a Memory's history) depends on."""
    roots: set[int] = set()
    originals = lineage.envelopes
    cursor = 0
    for inp in lineage.inputs:
        while cursor < len(originals) and originals[cursor].seq < inp.seq:
            o = originals[cursor]
            cursor += 1
            if lineage.root.get(o.id) in roots and o.id not in aligner.mapper.to_new:
                aligner.waiting.add(o.id)
        if aligner.waiting:
            await _settle(bus, aligner, timeout)
            aligner.waiting.clear()
        env = Envelope.new(inp.topic, inp.payload, inp.priority, session_id=bus.session_id)
        env.context = bus.context
        roots.add(inp.id)
        await bus.publish(env)
    return len(lineage.inputs)


async def _settle(bus: Bus, aligner: _Aligner, timeout: float | None) -> None:
    aligner.progress.clear()
    await progress_or_quiet(bus, aligner.progress, timeout)
