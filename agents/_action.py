"""Action: Guardian (policy before any action), Actor (tools), Learner (outcomes vs labels)."""

from __future__ import annotations

import json
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ImportString, PrivateAttr, model_validator

from agents._base import Agent, AgentSettings, Fault
from agents._effects import call_maybe_async
from agents._outcomes import Outcomes, OutcomeSpec
from agents._perception import Labels
from bus import Envelope

__all__ = ["SUPPORT_OUTCOME", "Actor", "Guardian", "Learner", "Outbox"]


#: The verdict of a decision a person has to make (see :class:`Guardian`).
ASK = "ask"

#: What a Guardian policy is: one proposal in, its decision out (see :class:`Guardian`).
Policy = Callable[[Mapping[str, Any]], Mapping[str, Any]]


class Guardian(Agent):
    """Checks every proposal against policy before anything is done, and says why.

    Without a ``policy`` setting it applies the support desk's rules, in order: spam is
    ignored; confidence under ``min_confidence`` goes to a human; a refund over
    ``refund_limit`` needs human approval; personal data is redacted from replies
    (``block_pii_in_replies``) by the team's ``pii`` function (setting, ``"module:function"``:
    text in, the redacted text and the kinds of data it hid out; the support desk's is
    ``support.pii:scrub``). What personal data looks like is the team's to say: without a
    ``pii`` function, replies go out as planned. "Needs human approval" means, by
    ``over_limit``: escalate (the humans queue gets it and the run goes on) or ask (a person
    approves or rejects it through :meth:`~agents.Agent.approve` while the proposal waits:
    approved, it runs as proposed; rejected, nothing runs).

    Another team brings its own rules as ``policy: "module:name"``, so the Guardian's place
    in the team (every proposal passes it, every decision is published and counted, blocked
    ones are logged) does not have to be rewritten per domain. The policy takes one proposal
    (a mapping) and returns the decision: a mapping with at least ``verdict`` (a string) and
    ``reasons`` (a list of strings), published as it is. A class is instantiated once, with
    ``policy_options`` as keyword arguments, and its instances are the callables; a function
    takes no options. A policy must be pure (the same proposal gets the same decision): a
    replay runs it again instead of serving its answer from the recording.

    Every decision is published on ``guardian.decision`` and counted in ``decisions`` by
    verdict.
    """

    role = "guardian"
    subscriptions = ("plan.proposed",)

    class Settings(AgentSettings):
        """The scenario's ``policy`` section fills the support rules' knobs; ``settings`` may
        override them, or name a ``policy`` of the team's own."""

        refund_limit: Annotated[float, Field(ge=0)] = 200.0
        min_confidence: Annotated[float, Field(ge=0, le=1)] = 0.6
        block_pii_in_replies: bool = True
        pii: ImportString[Callable[[str], tuple[str, Sequence[str]]]] | None = None
        """``"module:function"`` redacting personal data from a reply's text: returns the
        new text and the kinds of data it hid (none: nothing to hide)."""
        over_limit: Literal["escalate", "ask"] = "escalate"
        """A refund over ``refund_limit``: ``escalate`` to the humans queue, or ``ask`` a
        person to approve or reject it while the run waits (``approvals`` in the scenario
        bounds the wait)."""
        policy: ImportString[Callable[..., Any]] | None = None
        """``"module:name"`` of a policy replacing the support rules (a function, or a class
        whose instances are)."""
        policy_options: dict[str, Any] = Field(default_factory=dict)
        """Keyword arguments for a policy class, checked when the scenario is loaded."""

        _policy: Policy | None = PrivateAttr(default=None)

        @model_validator(mode="after")
        def _build_policy(self) -> Guardian.Settings:
            # Built here, once per settings object, so a policy class that refuses its options
            # is a located error at `pantheon validate`, not a crash when the run starts.
            spec = self.policy
            if spec is None:
                if self.policy_options:
                    raise ValueError("policy_options given without a policy to take them")
                return self
            name = getattr(spec, "__qualname__", repr(spec))
            if isinstance(spec, type):
                try:
                    self._policy = spec(**self.policy_options)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"policy {name} refused policy_options: {exc}") from None
                if not callable(self._policy):
                    raise ValueError(f"policy {name}: its instances are not callable")
            elif self.policy_options:
                raise ValueError(
                    f"policy {name} is a function, which takes no policy_options; "
                    "make it a class to configure it"
                )
            else:
                self._policy = spec
            return self

        def build_policy(self) -> Policy | None:
            """The policy callable the settings name (built once), or ``None`` for the support
            desk's own rules."""
            return self._policy

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.refund_limit = self.settings.refund_limit
        self.min_confidence = self.settings.min_confidence
        self.block_pii = self.settings.block_pii_in_replies
        self.pii = self.settings.pii
        self.over_limit = self.settings.over_limit
        self.policy: Policy | None = self.settings.build_policy()
        self.decisions: Counter[str] = Counter()

    async def handle(self, env: Envelope) -> None:
        decision = self.decide(env.payload)
        if decision.get("verdict") == ASK:
            decision = await self._ask_person_about(decision)
        await self.emit("guardian.decision", decision)

    async def _ask_person_about(self, decision: dict[str, Any]) -> dict[str, Any]:
        """Send a decision whose verdict is ``ask`` to a person, and make it theirs."""
        request = decision.pop("approval", None)
        if request is None:
            what = decision.get("action", "?")
            request = {"summary": f"{what}: {'; '.join(map(str, decision['reasons']))}"}
        answer = await self.approve(request)
        self.decisions[answer.verdict] += 1
        reasons = [*decision["reasons"], answer.reason()]
        if answer.approved:
            return {**decision, "verdict": "approved", "reasons": reasons}
        self.log.info("rejected by a person", by=answer.by, note=answer.note)
        rejected = {"verdict": "rejected", "action": "ignore", "steps": [], "reasons": reasons}
        return {**decision, **rejected}

    def decide(self, plan: Mapping[str, Any]) -> dict[str, Any]:
        """The decision on one proposal: the team's ``policy`` if it has one, else the
        support desk's rules."""
        if self.policy is not None:
            return self._apply_policy(self.policy, plan)
        action, steps = plan["action"], [dict(s) for s in plan["steps"]]
        reasons: list[str] = []
        verdict = "approved"
        escalate = None
        ask = None
        if action == "ignore":
            reasons.append("spam: no action")
        else:
            if plan["confidence"] < self.min_confidence:
                escalate = f"confidence {plan['confidence']:.2f} below {self.min_confidence:.2f}"
            elif (
                plan["intent"] == "refund"
                and plan.get("amount") is not None
                and plan["amount"] > self.refund_limit
            ):
                why = (
                    f"refund {plan['amount']:.2f} over limit {self.refund_limit:.2f} "
                    "needs human approval"
                )
                if self.over_limit == "ask":
                    ask = {
                        "summary": f"{why}: {plan['email_id']} from {plan['sender']}",
                        "email_id": plan["email_id"],
                        "sender": plan["sender"],
                        "amount": plan["amount"],
                        "action": action,
                    }
                    reasons.append(why)
                else:
                    escalate = why
        if escalate is not None and action != "escalate":
            verdict, action = "escalated", "escalate"
            steps = [{"tool": "escalate", "queue": "humans", "why": escalate}]
            reasons.append(escalate)
        if self.block_pii and self.pii is not None:
            for step in steps:
                if step["tool"] == "reply":
                    text, kinds = self.pii(step["text"])
                    if kinds:
                        step["text"] = text
                        reasons.append(f"redacted {', '.join(kinds)} from reply")
                        if verdict == "approved":
                            verdict = "modified"
        if not reasons:
            reasons.append("within policy")
        if ask is not None:
            # Counted once the person has decided (see _ask_person_about).
            verdict = ASK
        else:
            self.decisions[verdict] += 1
        if verdict == "escalated":
            self.log.info("escalated to a human", email_id=plan["email_id"], reasons=reasons)
        decision = {
            "email_id": plan["email_id"],
            "sender": plan["sender"],
            "intent": plan["intent"],
            "confidence": plan["confidence"],
            "verdict": verdict,
            "action": action,
            "steps": steps,
            "reasons": reasons,
        }
        if ask is not None:
            decision["approval"] = ask
        return decision

    def _apply_policy(self, policy: Policy, proposal: Mapping[str, Any]) -> dict[str, Any]:
        decision = policy(proposal)
        if not isinstance(decision, Mapping):
            raise TypeError(
                f"{self.name}: policy returned {type(decision).__name__}, not a mapping"
            )
        verdict, reasons = decision.get("verdict"), decision.get("reasons")
        if not isinstance(verdict, str) or not isinstance(reasons, list | tuple):
            raise ValueError(
                f"{self.name}: a policy decision needs 'verdict' (a string) and 'reasons' "
                f"(a list); got verdict={verdict!r}, reasons={reasons!r}"
            )
        if verdict != ASK:  # an ask is counted once the person has decided
            self.decisions[verdict] += 1
        if verdict != "approved":
            self.log.info("not approved as proposed", verdict=verdict, reasons=list(reasons))
        return dict(decision)


class Outbox:
    """Where the Actor's tools write: one JSON line per effect, in a file a user can read.

    Writes are idempotent per (key, step), the key being what the steps act on (an email's
    id for the support desk): a retried handler does not send a reply twice.

    ``counts`` (the run summary's ``outbox``) are counted from each tool call's answer
    (:meth:`tally`), not by :meth:`write`: a re-run (what-if, resume) serves a recorded
    tool call without writing anything, and its summary must still count what the team did.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        #: Tool calls that did their work, by tool: answers :meth:`tally` saw as ``done``.
        self.counts: Counter[str] = Counter()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def done(self, key: str, index: int) -> bool:
        """Whether step ``index`` of ``key`` was written already."""
        with self._lock:
            return (key, index) in self._seen

    def write(
        self, email_id: str, index: int, step: Mapping[str, Any], *, field: str = "email_id"
    ) -> dict[str, Any]:
        """Write step ``index`` of the item ``email_id`` names, once; the line names the
        item under ``field``."""
        with self._lock:
            key = (email_id, index)
            if key in self._seen:
                return {"tool": step["tool"], "status": "duplicate"}
            self._seen.add(key)
            if self.path is not None:
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({field: email_id, "step": index, **step}) + "\n")
        return {"tool": step["tool"], "status": "done"}

    def tally(self, key: str, index: int, answer: Mapping[str, Any]) -> None:
        """Count the answer of step ``index`` of ``key``, live or served from a record: a
        call that did its work (``done``) counts, a duplicate of one already done does not.
        Either way the step is done from here on: a resume serves a dead run's answer and
        then retries the handling live, and the retry must find it done (``duplicate``),
        not call the tool and count it again."""
        status = answer.get("status")
        if status in ("done", "duplicate"):
            with self._lock:
                self._seen.add((key, index))
                if status == "done":
                    self.counts[answer["tool"]] += 1


class Actor(Agent):
    """Executes approved steps through its tool adapters.

    Built in are the support desk's reply, ticket and escalate, whose work is writing the
    outbox line. A team adds its own in ``tools`` (settings), name -> ``"module:function"``:
    the function takes the step (a mapping) and returns its result (plain data), and may be
    async. The decision's ``steps`` name a tool each; the outbox gets one line per step,
    with the result, once per (decision ``key``, step index), so a retried handler never
    calls a tool that already did its work.

    Each tool call is an effect (``tool.<name>``), so a replay serves the recorded result and
    never calls anything twice. A scenario fault with ``tool`` set makes that tool fail at
    its rate; the bus subscription's retry policy and breaker decide what happens next, and
    an exhausted message lands in the DLQ. Every decision handled is reported on
    ``action.executed``: its ``outcome_fields`` and the results.
    """

    role = "actor"
    subscriptions = ("guardian.decision",)
    TOOLS = ("reply", "ticket", "escalate")

    class Settings(AgentSettings):
        tools: dict[str, ImportString[Callable[..., Any]]] = Field(default_factory=dict)
        """Tools besides reply, ticket and escalate (a name here replaces a built-in one)."""
        key: str = "email_id"
        """The decision field naming what its steps act on: steps run once per key."""
        outcome_fields: tuple[str, ...] = ("email_id", "sender", "intent", "action", "verdict")
        """Decision fields copied into ``action.executed``, beside the results."""

    def __init__(self, name: str | None = None, *, outbox: Outbox | None = None, **kw: Any):
        super().__init__(name, **kw)
        self.outbox = outbox or Outbox(None)
        self.tools: dict[str, Callable[..., Any]] = dict(self.settings.tools)

    async def handle(self, env: Envelope) -> None:
        decision = env.payload
        key = decision[self.settings.key]
        results = []
        for i, step in enumerate(decision["steps"]):
            tool = step["tool"]
            if tool not in self.tools and tool not in self.TOOLS:
                raise ValueError(f"unknown tool {tool!r} in step {i}")
            result = await self.effect(f"tool.{tool}", self._call, key, i, step)
            # Counted from the answer, outside the effect, so a served call counts too.
            self.outbox.tally(key, i, result)
            results.append(result)
        outcome = {f: decision[f] for f in self.settings.outcome_fields}
        outcome["results"] = results
        await self.emit("action.executed", outcome)

    async def _call(self, key: str, index: int, step: Mapping[str, Any]) -> dict[str, Any]:
        fault = self.fault
        if (
            fault.tool == step["tool"]
            and (fault.failure_rate or fault.latency_ms)
            and self.fault_window_open()
        ):
            await self.inject(Fault(fault.failure_rate, fault.latency_ms), f"{key}/{index}")
        tool = self.tools.get(step["tool"])
        field = self.settings.key
        if tool is None:  # reply, ticket, escalate: writing the outbox line is their work
            return self.outbox.write(key, index, step, field=field)
        if self.outbox.done(key, index):
            return {"tool": step["tool"], "status": "duplicate"}
        # The tool runs before its line is written: a tool that fails leaves no line, and
        # the retry calls it again.
        result = await call_maybe_async(tool, dict(step))
        done = self.outbox.write(key, index, {**step, "result": result}, field=field)
        return {**done, "result": result}


#: The support desk's outcome: what the built-in team's Actor reports on ``action.executed``,
#: named by ``email_id``, decided by ``action``; a :class:`Learner` built without an outcome
#: (in Python, as the agents' own tests do) scores this one. A scenario always gives its own.
SUPPORT_OUTCOME = OutcomeSpec(
    topics=("action.executed",),
    key="email_id",
    fields=("action",),
    malformed_topic="observation.email.malformed",
)


class Learner(Agent):
    """Scores each item's outcome against its label, and learns from the misses.

    What an outcome is comes from the team (``outcome``: a scenario's ``outcome:`` section,
    given by the runtime): the Learner subscribes to its topics and the input's malformed
    topic (unless the scenario says ``subscribe:``), and scores every decision field of the
    last outcome per item against the label the Observer filed for it (``labels``, from the
    input's ``label`` field; see :class:`~agents.Labels` and :func:`agents.score_decisions`).
    ``report()`` is the run summary's ``accuracy`` block for a team without its own scorer.

    To learn something of your own, subclass it and override :meth:`learn`, which sees each
    scored outcome and returns the updates to publish on ``learner.threshold.updated`` (the
    scoring stays as it is); override :meth:`observe` only to score differently. Both run
    in a replay, a what-if and a resume too (the effect ``learner.observe`` records only the
    updates, so what the Learner reports counts every outcome, served or not): they must
    only score and learn, never call anything outside.

    What the built-in one learns is the support desk's: when outcomes carry the Reasoner's
    predicted ``intent`` and labels the true one, ``window`` (setting, default 5)
    consecutive wrong outcomes of one predicted intent raise that intent's threshold by
    ``step`` (default 0.05): be less sure of it; ``window`` consecutive low-confidence
    escalations that were right about the intent but needless lower it. For any other
    team (no ``intent`` in its outcomes) it only scores.
    """

    role = "learner"
    subscriptions = ("action.executed", "observation.email.malformed")

    class Settings(AgentSettings):
        window: Annotated[int, Field(ge=1, le=10_000)] = 5
        """Consecutive misses (or needless escalations) before a threshold moves: 1 to
        10,000."""
        step: Annotated[float, Field(gt=0, le=1)] = 0.05
        threshold: Annotated[float, Field(ge=0, le=1)] = 0.4
        thresholds: dict[str, Annotated[float, Field(ge=0, le=1)]] = Field(default_factory=dict)
        intents: tuple[str, ...] = ()
        """The intents whose thresholds it tunes, each starting at ``threshold`` (the
        Reasoner's ``actions``; any other intent an outcome names joins when first moved)."""

    @classmethod
    def topics_for(cls, outcome: OutcomeSpec | None) -> tuple[str, ...]:
        """A Learner scoring ``outcome`` subscribes to its topics and its malformed topic
        (the class default without one)."""
        if outcome is None:
            return cls.subscriptions
        malformed = () if outcome.malformed_topic is None else (outcome.malformed_topic,)
        return (*outcome.topics, *malformed)

    def __init__(
        self,
        name: str | None = None,
        *,
        labels: Mapping[str, Mapping[str, Any]] | None = None,
        outcome: OutcomeSpec | None = None,
        subscribe: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.outcome = SUPPORT_OUTCOME if outcome is None else outcome
        if subscribe is None and outcome is not None:
            subscribe = self.topics_for(outcome)
        super().__init__(name, subscribe=subscribe, **kwargs)
        # Kept by reference, not copied: the team's Observer files labels into the same
        # mapping as it reads the input (a generator's exist only then).
        self.labels: Mapping[str, Mapping[str, Any]] = labels if labels is not None else Labels()
        self.outcomes = Outcomes(self.outcome, self.labels)
        self.window = self.settings.window
        self.step = self.settings.step
        self.thresholds: dict[str, float] = dict.fromkeys(
            self.settings.intents, self.settings.threshold
        )
        self.thresholds.update(self.settings.thresholds)
        self.scored = self.intent_correct = 0
        self.unlabelled = 0
        self.confusion: Counter[tuple[str, str]] = Counter()
        self._wrong: dict[str, deque[bool]] = {}
        self._needless: dict[str, deque[bool]] = {}

    async def handle(self, env: Envelope) -> None:
        # Scored here, outside the effect: a re-run serves a recorded effect without calling
        # it, and a Learner whose scoring was served would report (and learn from) only the
        # outcomes that ran live. The effect records what it made of the outcome: that
        # depends on arrival order, and a replay publishes the recorded updates even if
        # messages interleave differently (as the Reasoner's threshold read does).
        updates = await self.effect("learner.observe", list, self.observe(env.topic, env.payload))
        for update in updates:
            await self.emit("learner.threshold.updated", update)

    def observe(self, topic: str, outcome: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Score one outcome; return what :meth:`learn` makes of it."""
        spec = self.outcome
        if not isinstance(outcome, Mapping):
            self.unlabelled += 1  # names no item: nothing to score it against
            return []
        malformed = topic == spec.malformed_topic
        key = outcome.get("key") if malformed else outcome.get(spec.key)
        self.outcomes.see(topic, outcome, 0, None, None)
        label = None if key is None else self.labels.get(str(key))
        if label is None:
            self.unlabelled += 1
            return []
        self.scored += 1
        return self.learn(None if malformed else outcome, label)

    def learn(
        self, outcome: Mapping[str, Any] | None, label: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """What to publish on ``learner.threshold.updated`` after one labelled outcome
        (``None``: a record the input refused). The support desk's threshold tuning; it
        does nothing for outcomes without a predicted ``intent``."""
        if not isinstance(label, Mapping):
            return []
        if outcome is None:
            ok = label.get("action") == self.outcome.rejected
            self.intent_correct += ok
            self.confusion[(str(label.get("intent")), "malformed")] += 1
            return []
        intent, expected_intent = outcome.get("intent"), label.get("intent")
        if intent is None or expected_intent is None:
            return []
        intent = str(intent)
        action, expected_action = outcome.get("action"), label.get("action")
        self.intent_correct += intent == expected_intent
        self.confusion[(str(expected_intent), intent)] += 1
        updates = []
        wrong = self._wrong.setdefault(intent, deque(maxlen=self.window))
        wrong.append(intent != expected_intent)
        if len(wrong) == self.window and all(wrong):
            updates.append(self._move(intent, +self.step, f"{self.window} wrong {intent} calls"))
            wrong.clear()
        if intent == expected_intent:
            needless = self._needless.setdefault(intent, deque(maxlen=self.window))
            needless.append(action == "escalate" and expected_action != "escalate")
            if len(needless) == self.window and all(needless):
                updates.append(
                    self._move(intent, -self.step, f"{self.window} needless escalations")
                )
                needless.clear()
        return [u for u in updates if u is not None]

    def _move(self, intent: str, delta: float, reason: str) -> dict[str, Any] | None:
        old = self.thresholds.get(intent, self.settings.threshold)
        new = round(min(0.95, max(0.05, old + delta)), 4)
        if new == old:
            return None
        self.thresholds[intent] = new
        return {"intent": intent, "old": old, "new": new, "reason": reason}

    def report(self) -> dict[str, Any]:
        """The score of every item's last outcome (:meth:`agents.OutcomeScore.as_report`),
        with the support desk's intent accuracy and thresholds where it learned them."""
        out = self.outcomes.score().as_report()
        if self.confusion:
            n = sum(self.confusion.values())
            out["intent_accuracy"] = self.intent_correct / n if n else None
            out["thresholds"] = dict(self.thresholds)
        return out
