"""``pantheon resume``: finish a run whose process died, from its recording.

What resuming does, exactly:

1. Only an unfinished run can be resumed, once: an ``aborted`` one, whose recording
   process died (the store marks a ``running`` session so once its pid is gone) or whose
   input a signal stopped (``pantheon run``'s Ctrl-C: it finished what was in flight and
   recorded everything, every node's journal included, whatever its transport); or a NATS
   run that ended (``failed``, when it expects ``zero_lost``) with a node dead and work left
   in the stream for agents nobody else hosted (:func:`left_in_stream`: its summary names
   those items). A running,
   finished or replay session, a ZeroMQ run whose driver died (its nodes' records reach
   the store only through the driver, so what they did after its last commit is nowhere),
   or one resumed before (by a resume that did not itself die), is refused with the
   reason. A resume that died is resumed in
   turn. A NATS run whose driver died resumes in this one process: first, the shipments
   its nodes left on the stream that the dead driver had not stored are added to its
   record (``pantheon.runner._multiprocess.import_from_stream``), so what they did is
   served, not redone. One whose node died takes in the messages that node published
   after its last shipment, read back from the stream (the live nodes acted on them, so
   without them their work would be done again); on a throwaway server (``server: auto``)
   they are gone and the resume is refused, saying to run the scenario again.
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
   or its original deadline. One its run cancelled because the asking node died (``rejected``
   by ``node-lost``: nobody in that run could act on an answer, which is no answer) is
   reopened, pending with a new deadline, and waits the same way
   (:meth:`pantheon.approvals.StoreDesk.put`). Its decision is recorded in the new session.
5. The inputs the original never published follow, live: the Observer skips as many
   items of its source as the recording holds inputs and goes on at the scenario's rate.
6. The run ends like ``pantheon run``: drained, summarized over the whole story (every
   input; the outbox and the Learners' scores count what was served too), expectations
   judged; the summary says how many effects were served and called.
7. A NATS run's consumer groups, which still hold what the dead run left unacknowledged
   (later runs of the team never see it: each session's groups are its own, and their
   summaries list it as ``leftovers``), are deleted from the server: that work is done now.
   The stream keeps the messages. A run that ended (interrupted, or a node died) deleted
   its own already.

Agent state is rebuilt by re-handling the recorded inputs (with served effects), which is
why the team need not persist anything of its own. Tool calls the original made in its last
uncommitted group run again: the outbox of a resumed session is its own file, and an
Actor's tools must be idempotent per key for that to be harmless (``Outbox`` is).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from agents import InputItem, Observer, input_ordinal
from bus import Bus
from pantheon.approvals import OnWaiting
from pantheon.live import live_run
from pantheon.rerun import Rerun, Resume, credit_inputs
from pantheon.runner import (
    Recording,
    RunSummary,
    build_team,
    drain_progressing,
    local_report,
    summarize,
)
from pantheon.scenario import NatsTransportConfig, Scenario, ScenarioError, parse_scenario
from pantheon.sessions import SessionError, SessionInfo, SessionStore, StoredEnvelope
from pantheon.sessions.internals import origin_of

__all__ = ["ResumeResult", "left_in_stream", "resumable", "resume", "resume_refusal"]


def left_in_stream(info: SessionInfo) -> bool:
    """Whether run ``info`` ended with items unfinished in the team's stream: a node died
    (killed by the scenario or not) leaving messages for agents no live process hosted, or
    handed over in its own memory (``RunSummary.stream``; ``zero lost`` failed naming them).

    Such a run is unfinished in the sense resume means, as one whose driver died: every
    input is in its record and what was done is recorded (what the dead node published
    after its last shipment is read back from the stream), so a resume serves that and
    does the rest live. The waiting messages are not what it finishes from (nobody
    consumes them any more: the run's groups are deleted when it ends); the record is."""
    stream = info.summary.get("stream") or {}
    return bool(stream.get("items") or stream.get("handed_over"))


def _dead_nodes(info: SessionInfo) -> list[str]:
    """The nodes whose death left run ``info`` unfinished (:func:`left_in_stream`), as its
    summary names them; empty for any other session. Whatever its checks said: it ended
    ``failed`` when it expects ``zero_lost``, but one that does not still left the items."""
    if info.status not in ("completed", "failed") or not left_in_stream(info):
        return []
    return [str(n) for n in info.summary["stream"].get("killed") or ()]


def _needs_stream(info: SessionInfo, scenario: Scenario, dead: Sequence[str]) -> str | None:
    """Why a run whose node died cannot be resumed, saying what to do instead, or None: on
    a throwaway server (``server: auto``) the stream that held what the node published
    after its last journal shipment stopped with the run."""
    cfg = scenario.transport
    if isinstance(cfg, NatsTransportConfig) and cfg.server == "auto":
        which = ("node " if len(dead) == 1 else "nodes ") + ", ".join(map(repr, dead))
        its = "its" if len(dead) == 1 else "their"
        return (
            f"session {info.id} ran on its own throwaway NATS server (transport.server: "
            f"auto), which stopped with the run: what {which} published after {its} last "
            "journal shipment went with it, so resuming would do again what the other nodes "
            "did with those messages. Run the scenario again to decide the items it left; "
            "a run on a server that outlives it (transport.url) can be resumed after a node "
            "dies"
        )
    return None


def _recorded_scenario(info: SessionInfo, *, check_files: bool = True) -> Scenario:
    base = None if info.scenario_dir is None else Path(info.scenario_dir)
    return parse_scenario(
        info.scenario_text or "",
        f"<scenario of session {info.id}>",
        base_dir=base,
        check_files=check_files,
    )


def _refused_by_transport(info: SessionInfo, scenario: Scenario) -> str | None:
    """Why the transport of run ``info`` keeps it from being resumed, or None."""
    # A run whose input a signal stopped finished what was in flight and stored every
    # node's journal to its end mark: its record is whole, whatever the transport.
    if info.summary.get("interrupted"):
        return None
    if scenario.transport.kind == "zmq":
        # Its nodes' records reach the store only through the driver, so what they did
        # after its last commit is nowhere: resuming would do it again.
        return (
            f"session {info.id} is a ZeroMQ run: its nodes' records died with its "
            "driver, so resuming would do again what they did (a NATS run's survive)"
        )
    dead = _dead_nodes(info)
    if scenario.transport.kind == "nats" and dead:
        # What the dead node published after its last shipment (a Reasoner's
        # classification) is on the stream alone, and the live nodes acted on it (replied
        # to the email): without it in the record their recorded work has no cause to be
        # served against, and would be done again.
        return _needs_stream(info, scenario, dead)
    return None


def resume_refusal(store: SessionStore, info: SessionInfo) -> str | None:
    """Why ``pantheon resume`` refuses session ``info``, or None when it takes it: the
    refusals of step 1 of the module docstring, read from the store alone (nothing is run
    or connected to), so that a page can say what the command would before anyone runs
    it. :func:`resume` raises these; it also reads the scenario's files again (its input,
    the checks of its fields), which a page that imports no team's code does not, so a
    moved input file is said only by the command."""
    refused = resumable(info)
    if refused is not None:
        return refused
    for other in store.sessions():
        if other.replay_of == info.id and other.kind == "resume" and other.status != "aborted":
            return f"session {info.id} was resumed already, as {other.id} ({other.status})"
    try:
        scenario = _recorded_scenario(info, check_files=False)
    except ScenarioError as exc:
        return f"session {info.id}'s recorded scenario no longer reads: {exc}"
    return _refused_by_transport(info, scenario)


def resumable(info: SessionInfo) -> str | None:
    """Why ``info`` cannot be resumed, or None when it can."""
    if info.kind not in ("run", "resume"):
        return f"session {info.id} is a {info.kind}, not a run: replay its original instead"
    if info.status == "running":
        return (
            f"session {info.id} is still running (pid {info.pid} on {info.host}); only a run "
            "whose process died can be resumed"
        )
    if _dead_nodes(info):
        return None
    if info.status != "aborted":
        return (
            f"session {info.id} ended ({info.status}); only a run whose process died "
            "(aborted) can be resumed"
        )
    return None


def _published(inputs: Sequence[StoredEnvelope]) -> dict[str, int] | None:
    """How many items of each input topic the original published: one past the highest
    input number its record holds per topic, or None when its inputs are not numbered.

    By number, not by count: the inputs of a NATS run whose driver died are read back from
    the stream, and that holds only the ones another process subscribed to (its emails, not
    the malformed records its driver handled itself), so a count would skip too few."""
    out: dict[str, int] = {}
    for inp in inputs:
        ordinal = input_ordinal(inp.id)
        if ordinal is None:
            return None
        out[inp.topic] = max(out.get(inp.topic, 0), ordinal + 1)
    return out


async def _skip(
    source: Any, per_topic: dict[str, int] | None, published: int
) -> AsyncIterator[InputItem]:
    """``source`` without the items the original already published: per topic, those
    numbered below ``per_topic`` (:func:`_published`), else the first ``published``."""
    seen: dict[str, int] = {}
    total = 0
    async for item in source:
        if per_topic is None:
            total += 1
            if total <= published:
                continue
        else:
            n = seen[item.topic] = seen.get(item.topic, -1) + 1
            if n < per_topic.get(item.topic, 0):
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
    #: Effects a node recorded as failed only because the driver had died (approvals,
    #: budget admissions) or its model agent was stopping (tool listings and calls): asked
    #: again rather than served.
    asked_again: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "original_session_id": self.original_session_id,
            "new_session_id": self.summary.session_id,
            "inputs_replayed": self.inputs_replayed,
            "effects_served": self.effects_served,
            "effects_called": self.effects_called,
            "mismatched": self.mismatched,
            "asked_again": self.asked_again,
            "differences": list(self.differences),
        }


async def resume(
    session: str,
    *,
    store: str | Path | None = None,
    drain_timeout: float = 60.0,
    on_bus: Callable[[Bus], None] | None = None,
    on_waiting: OnWaiting | None = None,
) -> ResumeResult:
    """Resume the aborted run ``session`` (an id or unique prefix) as described in this
    module's docstring; :class:`SessionError` says why a session cannot be resumed.
    ``on_bus`` gets the resumed run's bus before anything flows (its ``session_id`` is the
    new session's); ``on_waiting`` hears of approval requests left waiting for a person
    (:class:`~pantheon.approvals.StoreDesk`), asked again or new."""
    with SessionStore(None if store is None else Path(store), create=False) as st:
        original = st.session(session)
        refused = resume_refusal(st, original)
        if refused is not None:
            raise SessionError(refused)
        scenario = _recorded_scenario(original)
        # A run whose input a signal stopped finished what was in flight and stored every
        # node's journal to its end mark: its record is whole, whatever the transport.
        interrupted = bool(original.summary.get("interrupted"))
        # A run that ended with a node dead: its driver stored every journal, but the dead
        # node's stops at its last shipment.
        dead = _dead_nodes(original)
        if scenario.transport.kind == "nats" and not interrupted:
            from pantheon.runner import import_from_stream

            if dead:
                # What it published after its last shipment, read back from the stream
                # (resume_refusal refused a throwaway server's, which is gone).
                await import_from_stream(st, original, scenario, origins=dead)
            else:
                # Whatever its nodes shipped and the dead driver had not stored is still on
                # the stream: take it in first, so none of it is done twice.
                await import_from_stream(st, original, scenario)
        policy = Resume()
        run = Rerun(
            st,
            original,
            policy,
            kind="resume",
            truncated=True,
            redo_cut=True,
            approvals=scenario.approvals,
            origin=origin_of(st, original),
            on_waiting=on_waiting,
        )
        try:
            summary = await _run(
                scenario, original, run, on_bus, drain_timeout + scenario.approvals.timeout
            )
        except BaseException as exc:
            await run.fail({"resume_of": original.id, "error": repr(exc)})
            raise
        result = ResumeResult(
            summary,
            original.id,
            len(run.observed(run.inputs)),
            run.runner.served,
            run.runner.calls,
            policy.mismatched,
            tuple(run.tracker.differences),
            policy.asked_again,
        )
        data = dataclasses.asdict(summary) | {"passed": summary.passed, "resume": result.to_dict()}
        await run.finish("completed" if summary.passed else "failed", data)
        cfg = scenario.transport
        ended = interrupted or bool(dead)
        if isinstance(cfg, NatsTransportConfig) and cfg.server != "auto" and not ended:
            # What the dead run left unacknowledged in its consumer groups is done now:
            # later runs of the team no longer list the session as having left work. A run
            # that ended deleted its own (``run_cluster``): nothing to ask a server that
            # may be gone, which this resume otherwise never needed.
            from pantheon.runner import discard_consumers

            await discard_consumers(scenario, cfg.url, original.id)
        return result


async def _run(
    scenario: Scenario,
    original: SessionInfo,
    run: Rerun,
    on_bus: Callable[[Bus], None] | None,
    drain_timeout: float,
) -> RunSummary:
    seed = original.seed if original.seed is not None else scenario.seed
    recorder = run.recorder
    outbox_dir = run.store.path.parent / "outbox"
    team = build_team(scenario, seed=seed, outbox_path=outbox_dir / f"{recorder.session_id}.jsonl")
    run.serve_desk(team.agents.values())
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
    inputs = run.inputs
    started = time.perf_counter()
    async with Bus(session_id=recorder.session_id) as bus:
        rec = Recording(bus, recorder, outbox_dir)
        async with live_run(rec, scenario.name) as live:
            live.watch(team)
            run.track(bus)  # before the recorder sees it
            if on_bus is not None:
                on_bus(bus)
            try:
                await team.attach(bus)
                await live.attach(bus)
                await team.check_model()
                await team.start()
                await run.feed(bus, drain_timeout)
                # The recorded inputs count as the Observer's: the summary's inputs are the
                # whole run's, as the original's would have been. Only the Observer's: a
                # Monitor's sampled alert fed again is no item of the source to skip.
                observed = run.observed(inputs)
                malformed = getattr(scenario.input, "malformed_topic", None)
                credit_inputs(observers, observed, malformed)
                numbered = _published(observed)
                already = len(observed) if numbered is None else sum(numbered.values())
                for observer, source in sources:
                    count = observer.settings.count
                    left = None if count is None else count - already
                    if source is None or (left is not None and left <= 0):
                        continue
                    observer.source = _skip(source, numbered, already)
                    observer.ordinals = run.ordinals  # numbered on from the recorded ones
                    if left is not None:
                        observer.settings = observer.settings.model_copy(update={"count": left})
                    observer.done.clear()
                    await observer.start()
                for o in observers:
                    await o.done.wait()
                await drain_progressing(bus, drain_timeout)
                await team.stop()
                await drain_progressing(bus, drain_timeout)
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
