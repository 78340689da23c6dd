"""Exact replay: the same team, every effect served from the record, checked hop by hop."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pantheon.rerun._engine import (
    DEFAULT_REPLAY_TIMEOUT,
    Rerun,
    Setup,
    by_name,
    incomplete_reason,
    past_the_record,
    rerun,
)
from pantheon.rerun._outcomes import outcome_spec
from pantheon.rerun._policies import ExactReplay
from pantheon.scenario import DRIVER_NODE
from pantheon.sessions import (
    WATCHER_PREFIX,
    FailureMatch,
    ReplayDivergence,
    SessionStore,
    StoredDelivery,
)
from pantheon.sessions.internals import Mapper, compare_runs, item_of, same_payload

__all__ = ["ReplayReport", "nondeterminism_hint", "replay_session"]


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
    replay produced again.

    ``cut`` names the nodes of a multi-process session whose journal stops before its end
    (killed, or dead) and how far it reached. What such a node was doing when it died
    (a handling cut short, then redelivered to another member or dead-lettered
    ``node_lost``) is not something one process can do again, so the inputs whose trees
    it was in the middle of are not replayed (``cut_inputs`` of them, counted in
    ``inputs_skipped``); every other input must match exactly, the ones the node handled
    to the end included.

    ``inputs_replayed`` counts the original's inputs fed again (what its Observers
    published: its summary's ``inputs`` and ``malformed``); ``others_replayed`` the other
    outside messages fed again, by topic (a Monitor's sampled alerts, a gateway client's
    direct publishes; see :meth:`~pantheon.rerun.Rerun.observed`).

    ``served_by_name`` and ``called_by_name`` split ``effects_served`` and
    ``effects_called`` by effect name, the most first. ``requests_changed`` counts, by
    name, the calls whose request digest differed from the record's (see
    :class:`~pantheon.rerun.ExactReplay`)."""

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
    cut: dict[str, str] | None = None
    cut_inputs: int = 0
    served_by_name: dict[str, int] = field(default_factory=dict)
    called_by_name: dict[str, int] = field(default_factory=dict)
    requests_changed: dict[str, int] = field(default_factory=dict)
    others_replayed: dict[str, int] = field(default_factory=dict)

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
            "others_replayed": self.others_replayed,
            "effects_served": self.effects_served,
            "effects_called": self.effects_called,
            "served_by_name": self.served_by_name,
            "called_by_name": self.called_by_name,
            "requests_changed": self.requests_changed,
            "live_effects": self.live_effects,
            "incomplete": self.incomplete,
            "recorded_messages": self.recorded_messages,
            "reproduced_messages": self.reproduced_messages,
            "cut": self.cut,
            "cut_inputs": self.cut_inputs,
        }


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
    recorded order, paced as :mod:`pantheon.rerun._engine` says. Effects are served from
    the record (no real call) unless ``live_effects`` is set.

    Then the two runs are aligned hop by hop (see ``pantheon.sessions._align``) and
    compared: topic and payload of every message, missing and extra messages, effect names
    and order, and every delivery's outcome (a handler that failed in the original must fail
    at the same hop, for the same subscriber, with the same error type). At the first
    divergence noticed while running, no further input is fed; the run drains and the
    comparison reports the earliest divergence in the original's order. A message that
    differs although its handler got the same message and the same effect answers says so,
    as does one from an agent that (or one upstream of which) ran in several processes
    (:func:`nondeterminism_hint`).

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
    policy = ExactReplay(live=live_effects)
    run = await rerun(
        store,
        original,
        policy,
        setup,
        kind="replay",
        timeout=timeout,
        from_ts=from_ts,
        truncated=incomplete is not None,
        skip_cut=True,
    )
    original_deliveries = store.deliveries(original.id)
    new_envelopes = store.envelopes(run.session_id)
    try:
        comparison = compare_runs(
            run.lineage,
            new_envelopes,
            original_deliveries=original_deliveries,
            new_deliveries=store.deliveries(run.session_id),
            original_effects=run.effects,
            new_effects=store.effects(run.session_id),
            inputs=run.inputs,
            roots={e.id for e in run.published},
        )
    except BaseException as exc:
        await run.fail({"replay_of": original.id, "error": repr(exc)})
        raise
    cut_roots = run.tolerated
    # Each replayed message's input (its correlation id), for divergences with no original.
    conversations = {e.id: e.correlation_id for e in new_envelopes} if cut_roots else {}
    divergence = comparison.divergence
    if incomplete is not None or cut_roots:
        divergence = next(
            (
                d
                for d in comparison.divergences
                if not (incomplete is not None and past_the_record(d))
                and _root(d, run, comparison.mapper, conversations) not in cut_roots
            ),
            None,
        )
    if divergence is not None and not live_effects:
        divergence = nondeterminism_hint(run, divergence, original_deliveries)
    if divergence is not None:
        key = outcome_spec(original).input_key
        divergence.name_item(
            item_of(run.envelopes, divergence.original_id, key)
            or item_of(new_envelopes, divergence.replay_id, key)
        )
    report = ReplayReport(
        new_session_id=run.session_id,
        original_session_id=original.id,
        matched=divergence is None,
        hops_compared=len(comparison.pairs),
        failures=comparison.failures,
        divergence=divergence,
        inputs_replayed=len(run.observed(run.published)),
        inputs_skipped=run.skipped,
        others_replayed=run.others(run.published),
        effects_served=run.runner.served,
        effects_called=run.runner.calls,
        live_effects=live_effects,
        incomplete=incomplete,
        recorded_messages=len(run.envelopes),
        reproduced_messages=len(comparison.pairs),
        cut=run.cuts or None,
        cut_inputs=len(cut_roots),
        served_by_name=by_name(run.runner.served_by_name),
        called_by_name=by_name(run.runner.called_by_name),
        requests_changed=by_name(policy.requests_changed),
    )
    await run.finish("completed", {"replay": report.to_dict()})
    if raise_on_divergence:
        report.raise_for_divergence()
    return report


def _root(
    div: ReplayDivergence, run: Rerun, mapper: Mapper, conversations: dict[int, int | None]
) -> int | None:
    """The original input whose tree ``div`` is in (an extra message: through the input its
    tree in the replay started from, which the replay re-published for that one)."""
    if div.original_id is not None:
        return run.lineage.root.get(div.original_id)
    new_root = conversations.get(div.replay_id or 0)
    return None if new_root is None else mapper.to_original.get(new_root)


def nondeterminism_hint(
    run: Rerun, div: ReplayDivergence, original_deliveries: Sequence[StoredDelivery] = ()
) -> ReplayDivergence:
    """``div`` with a hint when it can only come from the handlers themselves.

    When the original ran the differing agent, or one whose messages led to it, in several
    processes (placed on two nodes, or given a standby, which shares the work from the
    start), the hint says so: each instance kept its own state from its share of the
    messages, and their messages reached the next agent in an order no one process gives,
    which a one-process replay cannot be. Otherwise, a message that differs (or is extra)
    although the handling that published it got the message the original got and every one
    of its effects was served from the record: that handler read something outside an
    effect (randomness, the clock) that changed between runs."""
    if div.field not in ("extra", "payload", "topic") or div.replay_id is None or not div.agent:
        return div
    agent = div.agent.partition(":")[0]
    hint = _split_hint(agent, _upstream(run, div), original_deliveries)
    if hint is None and _same_input_and_answers(run, div):
        hint = (
            f"agent {agent!r} published a different message from the same input and the "
            "same effect answers: it reads randomness or the clock outside an effect; draw "
            "them with `await self.random()` / `await self.now()`, or wrap the call in "
            "`self.effect(...)`"
        )
    if hint is None:
        return div
    return ReplayDivergence(
        div.field,
        original_id=div.original_id,
        replay_id=div.replay_id,
        agent=div.agent,
        expected=div.expected,
        actual=div.actual,
        topic=div.topic,
        diff=div.diff,
        detail=div.detail,
        hint=hint,
    )


def _same_input_and_answers(run: Rerun, div: ReplayDivergence) -> bool:
    """Whether the handling that published ``div``'s message got the message its original
    got, with every one of its effects served from the record."""
    new = {e.id: e for e in run.store.envelopes(run.session_id)}
    env = new.get(div.replay_id or 0)
    if env is None or env.causation_id is None:
        return False
    parent_new = new.get(env.causation_id)
    parent_id = run.tracker.mapper.to_original.get(env.causation_id)
    parent = None if parent_id is None else run.lineage.by_id.get(parent_id)
    if parent_new is None or parent is None or not same_payload(parent, parent_new):
        return False
    return (env.causation_id, div.agent) not in run.runner.unserved


def _upstream(run: Rerun, div: ReplayDivergence) -> set[str]:
    """The agent of ``div`` and the agents whose messages led to it in the original (the
    sources along its causation chain): whose state could have made it differ."""
    agents = {(div.agent or "").partition(":")[0]}
    env = run.lineage.by_id.get(div.original_id) if div.original_id is not None else None
    while env is not None:
        if env.source:
            agents.add(env.source.partition(":")[0])
        env = run.lineage.by_id.get(env.causation_id) if env.causation_id is not None else None
    return agents


def _split_hint(agent: str, upstream: set[str], deliveries: Sequence[StoredDelivery]) -> str | None:
    """Why a handler given the same input and answers may still differ, when the original
    ran ``agent`` or one upstream of it in several processes: each instance kept its own
    state from its share of the messages, and what they sent on reached the next agent in
    an order no one process gives. None when none of ``upstream`` ran split."""
    ran_in: dict[str, set[str]] = {}
    for d in deliveries:
        name = d.subscriber.partition(":")[0]
        if name in upstream and not d.subscriber.startswith(WATCHER_PREFIX):
            ran_in.setdefault(name, set()).add(d.node or DRIVER_NODE)
    split = {name: sorted(nodes) for name, nodes in sorted(ran_in.items()) if len(nodes) > 1}
    if not split:
        return None
    where = "; ".join(
        f"{name!r} ran in {len(nodes)} processes ({', '.join(nodes)})"
        for name, nodes in split.items()
    )
    why = (
        f"in the original run {where}: each instance kept its own state from its share of "
        "the messages"
    )
    if agent not in split:
        why += f", and what they sent reached {agent!r} in an order one process does not give"
    return (
        f"agent {agent!r} published a different message than in the original run, and "
        f"{why}, which this one-process replay cannot reproduce. Place "
        "an agent that keeps state in one process (a hot standby shares its work: "
        "transport.standby_mode: warm takes over only once its node is gone), or keep "
        "that state in effects"
    )
