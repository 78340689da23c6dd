"""``pantheon resume``: finish a run whose process died, from its recording.

What resuming does, exactly:

1. Only a session whose recording process died (``aborted``; the store marks a ``running``
   session so once its pid is gone) can be resumed, once: a running, finished, replay or
   multi-process session, or one resumed before (by a resume that did not itself die), is
   refused with the reason. A resume that died is resumed in turn.
2. A new session (kind ``resume``, ``replay_of`` the original) runs the recorded scenario's
   team on a fresh bus in this process.
3. The original's recorded inputs are published again in recorded order, paced as a replay
   paces them (each once the messages the original had published before it have appeared
   again). Every effect is served from the recording where one was recorded at that
   position (same message, agent, ordinal and name): nothing the dead process did is done
   twice. Where the recording stops (effects that had not happened yet, or were in the
   last uncommitted group of the recorder), the effect runs live and is recorded.
4. Approval requests the dead run had asked keep their number and their deadline: asked
   again (live, step 3), each finds its row in the store. A request decided while no process
   was running is answered at once; a pending one waits for a person, the scripted person
   or its original deadline. Its decision is recorded in the new session.
5. The inputs the original never published follow, live: the Observer skips as many
   items of its source as the recording holds inputs and goes on at the scenario's rate.
6. The run ends like ``pantheon run``: drained, summarized over the whole story (every
   input), expectations judged; the summary says how many effects were served and called.

Agent state is rebuilt by re-handling the recorded inputs (with served effects), which is
why the team need not persist anything of its own. Tool calls the original made in its last
uncommitted group run again: the outbox of a resumed session is its own file, and an
Actor's tools must be idempotent per key for that to be harmless (``Outbox`` is).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agents import Observer
from agents._approvals import APPROVAL_EFFECT
from agents._perception import InputItem
from bus import Bus
from pantheon._approvals import StoreDesk
from pantheon._report import RunSummary, local_report, summarize
from pantheon._session_run import Recording
from pantheon._team import build_team
from pantheon.live import live_run
from pantheon.scenario import Scenario, parse_scenario
from pantheon.sessions import SessionError, SessionInfo, SessionStore
from pantheon.sessions._align import Lineage
from pantheon.sessions._approvals import origin_of
from pantheon.sessions._codec import decode
from pantheon.sessions._effects import EffectsContext, ReplayEffects, rebuild_error
from pantheon.sessions._recorder import Recorder
from pantheon.sessions._replay import _effect_index, _feed, _Live
from pantheon.sessions._store import EFFECT_ERROR, EFFECT_REPR, StoredEffect, StoredEnvelope

__all__ = ["ResumeEffects", "ResumeResult", "resumable", "resume"]


class ResumeEffects(ReplayEffects):
    """Serves each effect the original recorded at this position; runs (and records) the
    ones it did not. A recorded effect of another name at the position is a sign the
    resumed team took another path there: the call runs live and is counted in
    ``mismatched`` rather than failing the run, whose point is to finish."""

    __slots__ = ("_on_served", "mismatched")

    def __init__(
        self,
        sink: Callable[[tuple[Any, ...]], None],
        recorded: Mapping[tuple[int, str | None], Sequence[StoredEffect]],
        to_original: Callable[[int], int | None],
        *,
        seed: int | None,
        on_served: Callable[[str, Callable[..., Any], tuple[Any, ...]], None] | None = None,
    ) -> None:
        super().__init__(sink, recorded, to_original, seed=seed)
        self._on_served = on_served
        self.mismatched = 0

    async def effect(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        env_id, sub, n = self._key()
        orig_id = 0 if env_id == 0 else self._to_original(env_id)
        records = self._recorded.get((orig_id, sub), ()) if orig_id is not None else ()
        rec = records[n] if n < len(records) else None
        if rec is None or rec.name != name or rec.flag == EFFECT_REPR:
            self.mismatched += rec is not None
            return await self._run(env_id, sub, n, name, fn, args, kwargs)
        self.served += 1
        if self._on_served is not None:
            self._on_served(name, fn, args)
        now_ns = time.monotonic_ns()
        self._sink(
            ("effect", env_id, sub, n, name, rec.flag, rec.result, rec.error_type, rec.error,
             time.time(), now_ns, now_ns)
        )  # fmt: skip
        if rec.flag == EFFECT_ERROR:
            raise rebuild_error(rec.error_type or "Exception", rec.error or "")
        return decode(rec.result)


class _Follow(_Live):
    """The replay's aligner, minus stopping: a resume goes on whatever it finds, and only
    notes where the resumed team's messages differ from the recording's."""

    def __init__(self, lineage: Lineage, inputs: list[StoredEnvelope]) -> None:
        super().__init__(lineage, inputs, truncated=True)
        self.differences: list[str] = []

    def stop(self, why: str) -> None:
        if len(self.differences) < 100:
            self.differences.append(why)
        self.progress.set()


def resumable(info: SessionInfo) -> str | None:
    """Why ``info`` cannot be resumed, or None when it can."""
    if info.kind not in ("run", "resume"):
        return f"session {info.id} is a {info.kind}, not a run: replay its original instead"
    if info.status == "running":
        return (
            f"session {info.id} is still running (pid {info.pid} on {info.host}); only a run "
            "whose process died can be resumed"
        )
    if info.status != "aborted":
        return (
            f"session {info.id} ended ({info.status}); only a run whose process died "
            "(aborted) can be resumed"
        )
    return None


async def _skip(source: Any, n: int) -> AsyncIterator[InputItem]:
    """``source`` without its first ``n`` items: the ones the original already published."""
    seen = 0
    async for item in source:
        if seen < n:
            seen += 1
            continue
        yield item


@dataclasses.dataclass(frozen=True, slots=True)
class ResumeResult:
    """A resumed run: its summary, and how it got there."""

    summary: RunSummary
    original_session_id: str
    inputs_replayed: int
    effects_served: int
    effects_called: int
    mismatched: int
    differences: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "original_session_id": self.original_session_id,
            "new_session_id": self.summary.session_id,
            "inputs_replayed": self.inputs_replayed,
            "effects_served": self.effects_served,
            "effects_called": self.effects_called,
            "mismatched": self.mismatched,
            "differences": list(self.differences),
        }


async def resume(
    session: str,
    *,
    store: str | Path | None = None,
    drain_timeout: float = 60.0,
    on_bus: Callable[[Bus], None] | None = None,
) -> ResumeResult:
    """Resume the aborted run ``session`` (an id or unique prefix) as described in this
    module's docstring; :class:`SessionError` says why a session cannot be resumed."""
    with SessionStore(None if store is None else Path(store), create=False) as st:
        original = st.session(session)
        refused = resumable(original)
        if refused is not None:
            raise SessionError(refused)
        for other in st.sessions():
            resumed = other.replay_of == original.id and other.kind == "resume"
            if resumed and other.status != "aborted":
                raise SessionError(
                    f"session {original.id} was resumed already, as {other.id} ({other.status})"
                )
        if set(original.summary.get("nodes") or ()) - {"driver"}:
            raise SessionError(f"session {original.id} ran on several processes; resume runs one")
        base = None if original.scenario_dir is None else Path(original.scenario_dir)
        scenario = parse_scenario(
            original.scenario_text or "",
            f"<scenario of session {original.id}>",
            base_dir=base,
        )
        if scenario.transport.kind == "zmq":
            raise SessionError(f"session {original.id} is a ZeroMQ run; resume runs one process")
        envelopes = st.envelopes(original.id)
        effects = st.effects(original.id)
        lineage = Lineage(envelopes, effects)
        inputs = lineage.inputs
        origin = origin_of(st, original)
        recorder = Recorder(
            st,
            scenario=original.scenario,
            scenario_text=original.scenario_text,
            scenario_dir=original.scenario_dir,
            seed=original.seed,
            replay_of=original.id,
            kind="resume",
        )
        desk = StoreDesk(st.path, recorder.session_id, scenario.approvals, origin=origin)

        def served(name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
            agent = getattr(fn, "__self__", None)
            if name == APPROVAL_EFFECT and agent is not None and args:
                desk.count(agent.name, args[0])

        follow = _Follow(lineage, inputs)
        runner = ResumeEffects(
            recorder._writer.events.append,
            _effect_index(effects),
            follow.mapper.to_original.get,
            seed=original.seed,
            on_served=served,
        )
        follow.active = runner.active
        recorder._effects = EffectsContext.wrap(runner)
        try:
            summary = await _run(
                scenario,
                original,
                recorder,
                desk,
                follow,
                lineage,
                inputs,
                on_bus,
                drain_timeout + scenario.approvals.timeout,
            )
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await recorder.finish("failed", {"resume_of": original.id, "error": repr(exc)})
            raise
        finally:
            await desk.aclose()
        result = ResumeResult(
            summary,
            original.id,
            len(inputs),
            runner.served,
            runner.calls,
            runner.mismatched,
            tuple(follow.differences),
        )
        data = dataclasses.asdict(summary) | {"passed": summary.passed, "resume": result.to_dict()}
        await recorder.finish("completed" if summary.passed else "failed", data)
        return result


async def _run(
    scenario: Scenario,
    original: SessionInfo,
    recorder: Recorder,
    desk: StoreDesk,
    follow: _Follow,
    lineage: Lineage,
    inputs: list[StoredEnvelope],
    on_bus: Callable[[Bus], None] | None,
    drain_timeout: float,
) -> RunSummary:
    seed = original.seed if original.seed is not None else scenario.seed
    outbox_dir = recorder.store.path.parent / "outbox"
    team = build_team(scenario, seed=seed, outbox_path=outbox_dir / f"{recorder.session_id}.jsonl")
    desk.serve(team)
    observers: list[Observer] = team.of_role(Observer)
    if sum(o.source is not None for o in observers) > 1:
        # Which recorded input came from which source is not recorded.
        raise SessionError(
            f"session {original.id}: its team reads input through several Observers; "
            "resume continues one"
        )
    # Held back until the recorded inputs are in: the rest of the source comes after them.
    sources = [(o, o.source) for o in observers]
    for o, _ in sources:
        o.source = None
    started = time.perf_counter()
    async with Bus(session_id=recorder.session_id) as bus:
        rec = Recording(bus, recorder, outbox_dir)
        async with live_run(rec, scenario.name) as live:
            live.watch(team)
            bus.observe(
                SimpleNamespace(on_publish=follow.on_publish)
            )  # before the recorder sees it
            if on_bus is not None:
                on_bus(bus)
            try:
                await team.attach(bus)
                await live.attach(bus)
                await team.check_model()
                await team.start()
                await _feed(bus, follow, lineage, inputs, [], drain_timeout)
                if observers:
                    # The recorded inputs count as the Observer's: the summary's inputs are
                    # the whole run's, as the original's would have been.
                    bad = getattr(scenario.input, "malformed_topic", None)
                    malformed = sum(e.topic == bad for e in inputs)
                    observers[0].malformed += malformed
                    observers[0].emitted += len(inputs) - malformed
                for observer, source in sources:
                    count = observer.settings.count
                    left = None if count is None else count - len(inputs)
                    if source is None or (left is not None and left <= 0):
                        continue
                    observer.source = _skip(source, len(inputs))
                    if left is not None:
                        observer.settings = observer.settings.model_copy(update={"count": left})
                    observer.done.clear()
                    await observer.start()
                for o in observers:
                    await o.done.wait()
                await bus.drain(timeout=drain_timeout)
                await team.stop()
                await bus.drain(timeout=drain_timeout)
                summary = summarize(
                    scenario,
                    [local_report(bus, team)],
                    seed=seed,
                    elapsed=time.perf_counter() - started,
                    session_id=recorder.session_id,
                )
            finally:
                await team.aclose()
            await live.close("completed" if summary.passed else "failed")
    return summary
