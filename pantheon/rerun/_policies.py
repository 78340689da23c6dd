"""What a re-run does with each effect call: serve the recorded answer, run it live, or
call it a divergence. One policy per mode; the engine (:mod:`pantheon.rerun._engine`) asks
it for every call and does the rest (the lookup, the serving, the recording).

Why policies and not three runners: the three modes differ only in this one decision (and
in what they learn from a live answer); the key, the lookup and what is written to the new
session are the same, so they live once, in the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from agents import BUDGET_EFFECT, AgentStopping
from pantheon._errors import DriverGone
from pantheon.sessions import StoredEffect
from pantheon.sessions.internals import (
    EFFECT_ERROR,
    EFFECT_OK,
    EFFECT_REPR,
    encode,
    rebuild_error,
)

__all__ = ["EffectCall", "ExactReplay", "Policy", "Resume", "Verdict", "WhatIf"]


@dataclass(frozen=True, slots=True)
class EffectCall:
    """One effect call of the re-run, and what the record holds at its position.

    ``envelope_id``/``subscriber``/``ordinal`` key it in the new run (envelope 0: outside
    any handler); ``original_id`` is the aligned original envelope (0 outside a handler,
    None when the message has no original); ``record`` is the original's effect at the
    same (message, subscriber, ordinal), whatever its name, or None. ``same_message``:
    the message being handled is equal to its original (topic and payload; always true
    outside a handler). ``digest``: the call's request digest
    (:mod:`pantheon.sessions._digest`), None when it has no stable encoding."""

    envelope_id: int
    subscriber: str | None
    ordinal: int
    name: str
    original_id: int | None
    record: StoredEffect | None
    same_message: bool = True
    digest: bytes | None = None

    @property
    def agent(self) -> str | None:
        """The agent behind the subscriber (``reasoner:memory.*`` is ``reasoner``)."""
        return None if self.subscriber is None else self.subscriber.partition(":")[0]

    @property
    def handling(self) -> tuple[int, str | None]:
        return (self.envelope_id, self.subscriber)

    def matches_record(self) -> bool:
        """The record at this position is this call (same name) and can be served."""
        rec = self.record
        return rec is not None and rec.name == self.name and rec.flag != EFFECT_REPR

    def same_request(self) -> bool | None:
        """Whether the call asks what the record at its position asked, by their request
        digests; None when either has none (a session recorded before digests, a call
        with no stable encoding)."""
        rec = self.record
        if rec is None or rec.digest is None or self.digest is None:
            return None
        return rec.digest == self.digest


@dataclass(frozen=True, slots=True)
class Verdict:
    """A policy's answer for one call; ``problem`` says why a call diverges."""

    action: Literal["serve", "live", "diverge"]
    problem: str | None = None


SERVE = Verdict("serve")
LIVE = Verdict("live")


class Policy(ABC):
    """The decision per effect call. ``halts``: whether a difference from the record
    (a changed, extra or missing message, a diverged effect) stops feeding inputs."""

    halts = False

    @abstractmethod
    def decide(self, call: EffectCall) -> Verdict:
        """Serve the recorded answer, run the call live, or diverge."""

    def ran(self, call: EffectCall, result: Any, failed: bool) -> None:  # noqa: B027
        """A live call's answer (``failed``: it raised): what a policy learns from it. A
        hook, not abstract: most policies learn nothing from it."""


class ExactReplay(Policy):
    """Serve every call the record holds at its position, under its name; anything else
    diverges. ``live``: call every effect for real (still checked by name and order).

    A call served although its request digest differs from the record's (both have one)
    is counted in ``requests_changed``, by name: a replay that matches can still have asked
    something else (a prompt with the time in it, read outside an effect)."""

    halts = True

    def __init__(self, *, live: bool = False) -> None:
        self.live = live
        self.requests_changed: Counter[str] = Counter()

    def decide(self, call: EffectCall) -> Verdict:
        rec = call.record
        if rec is None:
            return Verdict("diverge", "no recorded effect at this position")
        if rec.name != call.name:
            return Verdict("diverge")
        if call.same_request() is False:
            self.requests_changed[call.name] += 1
        if self.live:
            return LIVE
        if rec.flag == EFFECT_REPR:
            return Verdict(
                "diverge", "the original result could not be stored (not msgpack-encodable)"
            )
        return SERVE


class WhatIf(Policy):
    """Serve a call when it is the one the original made; live otherwise.

    When the record and the call both have a request digest, "the one the original made"
    is decided by the request: the call is at the recorded position (the aligned message,
    the subscriber, the ordinal) under the recorded name and the digests are equal,
    whatever changed in the agent's configuration. An instructions edit then runs live
    only the model calls whose prompt it changed, and a tool call asked with the same
    arguments is served, not made a second time.

    Two things the older rule asks are not asked then, because the digest answers them:

    * the message being equal (``same_message``): the digest covers everything the call's
      answer depends on (its function, the object a method is bound to, every argument),
      so an equal request deserves the recorded answer whatever else the message held,
      and a changed message that changes the request changes the digest;
    * the handling's earlier calls all answered as recorded (the taint): that only stood
      in for "so this call's arguments are the recorded ones", which the digest now says
      directly. It would also defeat the point: a live model call never answers byte for
      byte as recorded (a tool call's id, the prompt's token count), so every tool call
      after it would run again with the very arguments the record answered.

    Without digests on both sides (a session recorded before them, a call whose function
    or arguments have no stable encoding, such as an agent's own method) the rule is the
    older, coarser one: the same agent with the same configuration
    (``same_agent(agent, model_call)``), handling a message equal to the original's
    (:attr:`EffectCall.same_message`), at the same position under the same name, with
    every earlier effect of that handling answered as recorded (a live call that answers
    what the record says keeps the handling servable: a changed rule set that still
    classifies the email the same way leaves its threshold read served). An agent is
    deterministic given its message and its effects' answers, so such a call has the same
    arguments as the recorded one."""

    def __init__(self, same_agent: Callable[[str | None, bool], bool]) -> None:
        self._same_agent = same_agent
        #: Handlings (envelope, subscriber) whose effects left the recorded path.
        self._tainted: set[tuple[int, str | None]] = set()

    def decide(self, call: EffectCall) -> Verdict:
        if call.name == BUDGET_EFFECT:
            # A budget admission is decided again, on the changed team's own ledgers (it
            # calls nothing outside): a raised budget admits a call the original refused,
            # whose answer then differs from the record and so is asked live.
            return LIVE
        if call.original_id is None:
            return LIVE
        same = call.same_request()
        if same is not None:
            return SERVE if same and call.matches_record() else LIVE
        if call.handling in self._tainted or not call.same_message:
            return LIVE
        if not self._same_agent(call.agent, call.name.startswith("model.")):
            return LIVE
        return SERVE if call.matches_record() else LIVE

    def ran(self, call: EffectCall, result: Any, failed: bool) -> None:
        rec = call.record
        answered = None if rec is None or rec.name != call.name or rec.flag != EFFECT_OK else rec
        if failed or answered is None or encode(result)[0] != answered.result:
            self._tainted.add(call.handling)


class Resume(Policy):
    """Serve what the dead run recorded at the position; run the rest live. A record of
    another name there means the resumed team took another path: the call runs live and is
    counted in ``mismatched`` rather than failing a run whose point is to finish. A failure a
    node recorded only because the driver had died (:class:`~pantheon._errors.DriverGone`:
    an approval or a budget admission nobody could answer) is asked again, live, and counted
    in ``asked_again``: serving it would dead-letter work a person is still to decide. So is
    a model agent's tool listing or call that failed because the agent was stopping
    (:class:`agents.AgentStopping`: its tool servers closed as its node left), which says
    nothing of what the tools would answer."""

    def __init__(self) -> None:
        self.mismatched = 0
        self.asked_again = 0

    def decide(self, call: EffectCall) -> Verdict:
        if call.matches_record():
            rec = call.record
            assert rec is not None
            if rec.flag == EFFECT_ERROR and _interrupted(rec):
                self.asked_again += 1
                return LIVE
            return SERVE
        self.mismatched += call.record is not None
        return LIVE


def _interrupted(rec: StoredEffect) -> bool:
    """Whether ``rec`` failed only because its run was going away: a
    :class:`~pantheon._errors.DriverGone` or :class:`agents.AgentStopping` error, rebuilt as
    a replay rebuilds a recorded error (the nodes' relays that define them are loaded: a
    resume runs the team). A session recorded before these existed has the plain
    ``ApprovalUnavailable`` there: it is served, as it was then."""
    error = rebuild_error(rec.error_type or "", rec.error or "")
    return isinstance(error, DriverGone | AgentStopping)
