"""What-if replay: the recorded inputs of a session through a team changed by an overlay.

An exact replay (``pantheon.rerun.replay_session``) checks that the *same* team takes the
same path. A what-if replay asks what a *changed* team would have done with the same inputs:
the overlay (see :mod:`pantheon.rerun._overlay`) is merged over the recorded scenario, the team it
makes is attached to a fresh bus, the original's outside inputs are re-published in the
recorded order, and every effect is either served from the record or run live:

* **served** when the call is the one the original made: at the same position (the
  original's message, aligned by lineage, the same subscriber and place among that
  handling's effects), under the same name, asking the same request by its digest
  (:mod:`pantheon.sessions._digest`), whatever changed in the agent. A call without a
  digest (its function carries state the digest cannot see, or the session predates
  digests) is served by the older rule: the same agent with the same configuration
  (:func:`~pantheon.rerun._overlay.agent_fingerprints`; for ``model.*`` calls the model provider
  too), handling a message equal to the original's, with every earlier effect of that
  handling answered as recorded (see :class:`~pantheon.rerun.WhatIf`);
* **live** otherwise (a changed request, or without digests a changed message, a changed
  agent, a handling that already left the recorded path; an added agent's calls), and
  recorded in the new session.

An approval (``human.approval``) follows the same rule: the recorded decision is served
when the request is the recorded one; otherwise it is asked through the what-if session's
own approval desk, configured by the changed scenario's ``approvals:`` section (the
scripted person, the timeout and its default, or a person through ``pantheon approve`` on
the what-if session), as in a run.

The result is an ordinary session (``kind='whatif'``, ``forked_from`` = the original)
whose scenario text is the merged one, so it can itself be replayed exactly. Its summary
is judged as ``pantheon run`` judges a run (:func:`pantheon.runner._report.judge`) against the
changed scenario's expectations, with two differences a replay calls for: timing bounds
(``max_p99_ms``, ``p99_*``, ``min_throughput``) are left out and named in ``not_judged``
(a replay's timings measure the replay, not the team), and a scenario that says nothing
about dead letters (no ``max_dlq``, no ``dlq``) is held to none, so a change that makes
the team drop work fails. It also holds the overlay and the headline of the decision diff
against the original (``pantheon diff`` recomputes the full diff).

A session whose node died mid-run (killed by the scenario, or lost) is re-run as an exact
replay re-runs it: the inputs the node was in the middle of are left out, neither re-run
(their effects would otherwise all run live, with nothing recorded to serve) nor counted
as decisions that changed (see :class:`WhatIfReport`).

The summary is built as a run's is (:func:`pantheon.runner.local_report`), from the changed
team, which is why the built-in agents build what it reports outside their effects: the
Learner scores every outcome before its ``learner.observe`` effect (served or not), and the
Actor counts the outbox from each tool call's answer. A team's custom checks then read the
same figures as in a run (the on-call scorer's pages, the outbox). The decision fields'
accuracy alone is replaced by the decision diff's score of the what-if's record, read by
the original's outcome and labels, so both runs are measured the same way; what else the
Learners report is kept beside it, as for a multi-process run
(:func:`pantheon.runner.score_from_record`).

What is not carried over: state a team's own agent builds *inside* an effect it would have
run, since a served effect runs nothing.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import Observer
from bus import Bus
from pantheon.approvals import OnWaiting
from pantheon.rerun import (
    DEFAULT_REPLAY_TIMEOUT,
    OutcomeDiff,
    Rerun,
    WhatIf,
    by_name,
    credit_inputs,
    diff_outcomes,
    incomplete_reason,
    unrecorded_nodes,
)
from pantheon.rerun._overlay import Overlay, agent_fingerprints, apply_overlay
from pantheon.runner import RunSummary, accuracy_bounds, build_team, judge, local_report, summarize
from pantheon.scenario import ExpectConfig, Scenario, ScenarioError, parse_scenario
from pantheon.sessions import SessionError, SessionStore

__all__ = ["TIMING_EXPECTATIONS", "WhatIfReport", "whatif_replay"]

#: Expectations a what-if does not judge: they bound the timings of the replay, which say
#: nothing of the changed team (served effects take no time, live ones all the time).
TIMING_EXPECTATIONS = ("max_p99_ms", "p99_handling_ms", "p99_queue_wait_ms", "min_throughput")


@dataclass(frozen=True, slots=True)
class WhatIfReport:
    """What :func:`whatif_replay` did: the new session, how many effects were served from
    the record and how many ran live, the decisions that changed (``decisions``) and the
    changed team's run summary (``summary``), its expectations judged as a run's.

    ``passed`` is whether every expectation held; ``not_judged`` names the timing bounds
    left out (see the module docstring). ``served_by_name`` and ``called_by_name`` split
    the effects served and called by effect name, the most first.

    ``cut`` names the nodes of a multi-process original whose journal stops before its end
    (killed, or dead) and how far it reached; the ``cut_inputs`` inputs they were in the
    middle of are left out as an exact replay leaves them out (counted in
    ``inputs_skipped``): not re-run, their effects not called, their items not in
    ``decisions``. Their record is unfinished, so what the changed team would do with them
    cannot be told from what the original did."""

    new_session_id: str
    original_session_id: str
    overlay_source: str
    inputs_replayed: int
    effects_served: int
    effects_called: int
    decisions: OutcomeDiff
    summary: RunSummary
    #: The scenario's ``min_accuracy`` as checks: (name, accuracy key, bound).
    accuracy_bounds: tuple[tuple[str, str, float], ...] = ()
    not_judged: tuple[str, ...] = ()
    served_by_name: dict[str, int] = dataclasses.field(default_factory=dict)
    called_by_name: dict[str, int] = dataclasses.field(default_factory=dict)
    inputs_skipped: int = 0
    cut: dict[str, str] | None = None
    cut_inputs: int = 0
    #: The other outside messages fed again, by topic (see ``ReplayReport``).
    others_replayed: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Whether the changed team meets every expectation judged."""
        return self.summary.passed

    @property
    def expectations(self) -> list[dict[str, Any]]:
        return self.summary.expectations

    @property
    def accuracy_passed(self) -> bool | None:
        """Whether the changed team meets the scenario's ``min_accuracy`` (None: no bound
        or no labels)."""
        acc = self.summary.accuracy
        if not self.accuracy_bounds or not acc.get("scored"):
            return None
        return all(
            acc.get(key) is not None and acc[key] >= bound for _, key, bound in self.accuracy_bounds
        )

    def to_dict(self) -> dict[str, Any]:
        s = self.summary
        return {
            "new_session_id": self.new_session_id,
            "original_session_id": self.original_session_id,
            "overlay_source": self.overlay_source,
            "inputs_replayed": self.inputs_replayed,
            "inputs_skipped": self.inputs_skipped,
            "others_replayed": self.others_replayed,
            "cut": self.cut,
            "cut_inputs": self.cut_inputs,
            "effects_served": self.effects_served,
            "effects_called": self.effects_called,
            "served_by_name": self.served_by_name,
            "called_by_name": self.called_by_name,
            "min_accuracy": {name: bound for name, _, bound in self.accuracy_bounds},
            "accuracy_passed": self.accuracy_passed,
            "passed": self.passed,
            "expectations": s.expectations,
            "not_judged": list(self.not_judged),
            "dlq": s.dlq,
            "dead_letters": s.dead_letters,
            "decisions": self.decisions.to_dict(),
        }


def _judged_scenario(scenario: Scenario) -> tuple[Scenario, tuple[str, ...]]:
    """The scenario whose expectations a what-if judges, and the timing bounds it left out
    (see the module docstring)."""
    expect = scenario.expect
    left_out = tuple(k for k in TIMING_EXPECTATIONS if getattr(expect, k) is not None)
    update: dict[str, Any] = dict.fromkeys(left_out)
    if expect.max_dlq is None and not expect.dlq:
        update["max_dlq"] = 0
    judged = scenario.model_copy(update={"expect": expect.model_copy(update=update)})
    return judged, left_out


async def whatif_replay(
    store: SessionStore,
    session_id: str,
    overlay: Overlay | str,
    *,
    source: str = "<overlay>",
    timeout: float | None = DEFAULT_REPLAY_TIMEOUT,
    on_waiting: OnWaiting | None = None,
) -> WhatIfReport:
    """Replay session ``session_id``'s inputs through its team changed by ``overlay`` (the
    overlay's YAML text, named ``source`` in errors, or an :class:`Overlay` already applied)
    and record the run as a new session linked to the original.

    ``on_waiting`` hears of approval requests the changed team asks again and nobody
    decides within a second (:class:`~pantheon.approvals.StoreDesk`), on the new session.

    Raises :class:`~pantheon.scenario.ScenarioError` (located in the overlay) before
    anything runs when the overlay is invalid, and ``SessionError`` when the session is
    unknown, has no scenario text, or its record is incomplete."""
    original = store.session(session_id)
    if not original.scenario_text:
        raise SessionError(
            f"session {original.id} has no scenario text, so its team cannot be changed"
        )
    incomplete = incomplete_reason(original)
    if incomplete is not None:
        raise SessionError(f"session {original.id} is {incomplete}: replay a finished session")
    remote = unrecorded_nodes(store, original)
    if remote:
        # As for an exact replay: hops handled on other nodes, and their effects, are not
        # in the record, so there is nothing to serve them from or to compare them with.
        raise SessionError(
            f"session {original.id} ran on several processes (nodes: {', '.join(remote)}) "
            "and was recorded before every node recorded its part: only the driver's "
            "messages are there. Try the change on a newer run."
        )
    base_dir = None if original.scenario_dir is None else Path(original.scenario_dir)
    if isinstance(overlay, str):
        overlay = apply_overlay(original.scenario_text, overlay, source=source, base_dir=base_dir)
    try:
        before = parse_scenario(original.scenario_text, base_dir=base_dir, check_files=False)
    except ScenarioError as exc:
        raise SessionError(f"cannot rebuild the recorded team of {original.id}:\n{exc}") from None
    scenario = overlay.scenario
    old, new = agent_fingerprints(before), agent_fingerprints(scenario)

    def same_agent(agent: str | None, model_call: bool) -> bool:
        if agent is None:
            return True
        a, b = old.get(agent), new.get(agent)
        return a is not None and b is not None and a[model_call] == b[model_call]

    team = build_team(scenario, replay=True)
    # A re-asked approval may wait for a person: the drain waits out its timeout too.
    drain = None if timeout is None else timeout + scenario.approvals.timeout
    reports: list[dict[str, Any]] = []

    async def setup(bus: Bus) -> None:
        await team.attach(bus)
        await team.start()

    async def after(bus: Bus) -> None:
        await team.stop()
        await bus.drain(timeout=drain)
        malformed = getattr(scenario.input, "malformed_topic", None)
        credit_inputs(team.of_role(Observer), run.observed(run.published), malformed)
        reports.append(local_report(bus, team))

    started = time.perf_counter()
    try:
        run = Rerun(
            store,
            original,
            WhatIf(same_agent),
            kind="whatif",
            forked=True,
            scenario=scenario.name,
            scenario_text=overlay.merged_text,
            approvals=scenario.approvals,
            on_waiting=on_waiting,
            skip_cut=True,
        )
        run.serve_desk(team.agents.values())
        try:
            await run.play(setup, timeout=drain, after=after)
        except BaseException as exc:
            await run.fail({"forked_from": original.id, "error": repr(exc)})
            raise
    finally:
        await team.aclose()
    elapsed = time.perf_counter() - started
    decisions = diff_outcomes(store, original.id, run.session_id)
    judged, left_out = _judged_scenario(scenario)
    # Summarized with no expectation (custom checks run once, below), then scored as the
    # decision diff scores both runs: from the record, by the original's outcome. What
    # else the team's Learners report stays beside it, as in a run: a team's custom checks
    # read it (the on-call scorer's pages).
    summary = summarize(
        judged.model_copy(update={"expect": ExpectConfig()}),
        reports,
        seed=scenario.seed,
        elapsed=elapsed,
        session_id=run.session_id,
    )
    scored = decisions.b.score.as_report()
    summary.accuracy = scored | {k: v for k, v in summary.accuracy.items() if k not in scored}
    summary.expectations = judge(judged, summary, fields=decisions.a.spec.fields)
    report = WhatIfReport(
        new_session_id=run.session_id,
        original_session_id=original.id,
        overlay_source=overlay.source,
        inputs_replayed=len(run.observed(run.published)),
        effects_served=run.runner.served,
        effects_called=run.runner.calls,
        decisions=decisions,
        summary=summary,
        accuracy_bounds=tuple(accuracy_bounds(judged, decisions.a.spec.fields)),
        not_judged=left_out,
        served_by_name=by_name(run.runner.served_by_name),
        called_by_name=by_name(run.runner.called_by_name),
        inputs_skipped=run.skipped,
        cut=run.cuts or None,
        cut_inputs=len(run.tolerated),
        others_replayed=run.others(run.published),
    )
    await run.finish("completed" if report.passed else "failed", _summary(report, overlay))
    return report


#: Keys of the report the summary holds already, at its top level.
_IN_THE_RUN = frozenset({"decisions", "expectations", "not_judged", "dlq", "dead_letters"})


def _summary(report: WhatIfReport, overlay: Overlay) -> dict[str, Any]:
    """The new session's summary: the changed team's run summary (expectations judged as
    the module docstring says), the what-if and its overlay, and the decisions that moved."""
    run = dataclasses.asdict(report.summary) | {"passed": report.passed}
    return run | {
        # The overlay's text inside the what-if record: `sessions show` prints it as one
        # JSON line rather than spilling its lines into the summary.
        "whatif": {k: v for k, v in report.to_dict().items() if k not in _IN_THE_RUN}
        | {"overlay": overlay.text},
        "decisions": report.decisions.headline(),
        "not_judged": list(report.not_judged),
    }
