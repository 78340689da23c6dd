"""Action: Guardian (policy before any action), Actor (tools), Learner (outcomes vs labels)."""

from __future__ import annotations

import json
import threading
from collections import Counter, deque
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from agents._base import Agent, AgentSettings, Fault
from agents._perception import Labels, find_pii
from agents._providers import INTENTS
from bus import Envelope

__all__ = ["Actor", "Guardian", "Learner", "Outbox", "redact"]


def redact(text: str, spans: list[dict[str, Any]]) -> str:
    """Replace each span with ``[REDACTED <kind>]``, right to left so offsets stay valid."""
    for span in sorted(spans, key=lambda s: s["start"], reverse=True):
        text = f"{text[: span['start']]}[REDACTED {span['kind']}]{text[span['end'] :]}"
    return text


class Guardian(Agent):
    """Checks every plan against policy before anything is done, and says why.

    Rules, in order: spam is ignored; confidence under ``min_confidence`` goes to a human;
    a refund over ``refund_limit`` needs human approval; personal data is redacted from
    replies (``block_pii_in_replies``). Every decision, with all its reasons, is published
    on ``guardian.decision`` and kept in ``decisions``.
    """

    role = "guardian"
    subscriptions = ("plan.proposed",)

    class Settings(AgentSettings):
        """The scenario's ``policy`` section fills these; ``settings`` may override them."""

        refund_limit: Annotated[float, Field(ge=0)] = 200.0
        min_confidence: Annotated[float, Field(ge=0, le=1)] = 0.6
        block_pii_in_replies: bool = True

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.refund_limit = self.settings.refund_limit
        self.min_confidence = self.settings.min_confidence
        self.block_pii = self.settings.block_pii_in_replies
        self.decisions: Counter[str] = Counter()

    async def handle(self, env: Envelope) -> None:
        await self.emit("guardian.decision", self.decide(env.payload))

    def decide(self, plan: Mapping[str, Any]) -> dict[str, Any]:
        action, steps = plan["action"], [dict(s) for s in plan["steps"]]
        reasons: list[str] = []
        verdict = "approved"
        escalate = None
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
                escalate = (
                    f"refund {plan['amount']:.2f} over limit {self.refund_limit:.2f} "
                    "needs human approval"
                )
        if escalate is not None and action != "escalate":
            verdict, action = "escalated", "escalate"
            steps = [{"tool": "escalate", "queue": "humans", "why": escalate}]
            reasons.append(escalate)
        if self.block_pii:
            for step in steps:
                if step["tool"] == "reply":
                    spans = find_pii(step["text"])
                    if spans:
                        step["text"] = redact(step["text"], spans)
                        kinds = sorted({s["kind"] for s in spans})
                        reasons.append(f"redacted {', '.join(kinds)} from reply")
                        if verdict == "approved":
                            verdict = "modified"
        if not reasons:
            reasons.append("within policy")
        self.decisions[verdict] += 1
        if verdict == "escalated":
            self.log.info("escalated to a human", email_id=plan["email_id"], reasons=reasons)
        return {
            "email_id": plan["email_id"],
            "sender": plan["sender"],
            "intent": plan["intent"],
            "confidence": plan["confidence"],
            "verdict": verdict,
            "action": action,
            "steps": steps,
            "reasons": reasons,
        }


class Outbox:
    """Where the Actor's tools write: one JSON line per effect, in a file a user can read.

    Writes are idempotent per (email, step): a retried handler does not send a reply twice.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, email_id: str, index: int, step: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            key = (email_id, index)
            if key in self._seen:
                return {"tool": step["tool"], "status": "duplicate"}
            self._seen.add(key)
            self.counts[step["tool"]] += 1
            if self.path is not None:
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"email_id": email_id, "step": index, **step}) + "\n")
        return {"tool": step["tool"], "status": "done"}


class Actor(Agent):
    """Executes approved steps through its tool adapters (reply, ticket, escalate).

    Each tool call is an effect, so a replay never sends anything twice. A scenario fault
    with ``tool`` set makes that tool fail at its rate; the bus subscription's retry policy
    and breaker decide what happens next, and an exhausted message lands in the DLQ.
    """

    role = "actor"
    subscriptions = ("guardian.decision",)
    TOOLS = ("reply", "ticket", "escalate")

    def __init__(self, name: str | None = None, *, outbox: Outbox | None = None, **kw: Any):
        super().__init__(name, **kw)
        self.outbox = outbox or Outbox(None)

    async def handle(self, env: Envelope) -> None:
        decision = env.payload
        results = []
        for i, step in enumerate(decision["steps"]):
            if step["tool"] not in self.TOOLS:
                raise ValueError(f"unknown tool {step['tool']!r} in step {i}")
            results.append(
                await self.effect(f"tool.{step['tool']}", self._call, decision["email_id"], i, step)
            )
        await self.emit(
            "action.executed",
            {
                "email_id": decision["email_id"],
                "sender": decision["sender"],
                "intent": decision["intent"],
                "action": decision["action"],
                "verdict": decision["verdict"],
                "results": results,
            },
        )

    async def _call(self, email_id: str, index: int, step: Mapping[str, Any]) -> dict[str, Any]:
        fault = self.fault
        if fault.tool == step["tool"] and (fault.failure_rate or fault.latency_ms):
            await self.inject(Fault(fault.failure_rate, fault.latency_ms), f"{email_id}/{index}")
        return self.outbox.write(email_id, index, step)


class Learner(Agent):
    """Scores outcomes against the dataset's labels and tunes the Reasoner's thresholds.

    When ``window`` (setting, default 5) consecutive outcomes of one predicted intent are
    wrong, that intent's threshold goes up by ``step`` (default 0.05): be less sure of it.
    When ``window`` consecutive low-confidence escalations of one intent were right about the
    intent but escalated needlessly, its threshold goes down. Each change is published as
    ``learner.threshold.updated`` for the Reasoner.

    ``labels`` maps an email id to its expected ``intent`` and ``action``: the scenario
    input's ``label`` field, filed by the Observer (see :class:`~agents.Labels`). A malformed
    input is looked up by the ``key`` its payload carries and scores right when its label
    says ``reject``.
    """

    role = "learner"
    subscriptions = ("action.executed", "observation.email.malformed")

    class Settings(AgentSettings):
        window: Annotated[int, Field(ge=1)] = 5
        """Consecutive misses (or needless escalations) before a threshold moves."""
        step: Annotated[float, Field(gt=0, le=1)] = 0.05
        threshold: Annotated[float, Field(ge=0, le=1)] = 0.4
        thresholds: dict[str, Annotated[float, Field(ge=0, le=1)]] = Field(default_factory=dict)

    def __init__(
        self,
        name: str | None = None,
        *,
        labels: Mapping[str, Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        # Kept by reference, not copied: the team's Observer files labels into the same
        # mapping as it reads the input (a generator's exist only then).
        self.labels: Mapping[str, Mapping[str, Any]] = labels if labels is not None else Labels()
        self.window = self.settings.window
        self.step = self.settings.step
        self.thresholds: dict[str, float] = dict.fromkeys(INTENTS, self.settings.threshold)
        self.thresholds.update(self.settings.thresholds)
        self.scored = self.intent_correct = self.action_correct = 0
        self.unlabelled = 0
        self.confusion: Counter[tuple[str, str]] = Counter()
        self._wrong: dict[str, deque[bool]] = {}
        self._needless: dict[str, deque[bool]] = {}

    async def handle(self, env: Envelope) -> None:
        # Learning state depends on arrival order; running it as an effect records each
        # decision so a replay makes the same updates even if messages interleave differently.
        updates = await self.effect("learner.observe", self.observe, env.topic, env.payload)
        for update in updates:
            await self.emit("learner.threshold.updated", update)

    def observe(self, topic: str, outcome: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Score one outcome; return the threshold changes it triggers."""
        # An outcome names its email; a malformed input names the record by its ``key``.
        key = outcome["email_id"] if "email_id" in outcome else outcome.get("key")
        label = self.labels.get(str(key))
        if label is None:
            self.unlabelled += 1
            return []
        self.scored += 1
        if topic == "observation.email.malformed":
            ok = label.get("action") == "reject"
            self.intent_correct += ok
            self.action_correct += ok
            self.confusion[(str(label.get("intent")), "malformed")] += 1
            return []
        expected_intent, expected_action = label.get("intent"), label.get("action")
        intent, action = outcome["intent"], outcome["action"]
        self.intent_correct += intent == expected_intent
        self.action_correct += action == expected_action
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
        old = self.thresholds.get(intent, 0.4)
        new = round(min(0.95, max(0.05, old + delta)), 4)
        if new == old:
            return None
        self.thresholds[intent] = new
        return {"intent": intent, "old": old, "new": new, "reason": reason}

    def report(self) -> dict[str, Any]:
        n = self.scored
        return {
            "scored": n,
            "unlabelled": self.unlabelled,
            "intent_accuracy": self.intent_correct / n if n else None,
            "action_accuracy": self.action_correct / n if n else None,
            "thresholds": dict(self.thresholds),
        }
