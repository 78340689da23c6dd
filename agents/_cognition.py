"""Cognition: Memory (history per sender), Reasoner (intent and ranked actions), Planner."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import Field, ImportString

from agents._base import Agent, AgentSettings
from agents._providers import SupportsChat
from bus import Envelope, Priority

__all__ = ["Memory", "Planner", "Reasoner"]


class Memory(Agent):
    """Keeps recent history per subject and answers lookups about it.

    Every message on its subscriptions other than ``lookup_topic`` is remembered under the
    value of its payload's ``key`` field (the support desk: the sender of each
    ``action.executed``), keeping the ``fields`` listed. A request on ``lookup_topic`` with
    ``{key: value}`` answers ``{key: value, "count": n, "recent": [last 5], **tallies}``,
    where each of ``tally`` counts the remembered items whose fields match (the support
    desk's ``complaints``: items with ``intent: complaint``).

    History is in memory and bounded (``history`` per subject, oldest forgotten first): a
    run's worth of context, not a CRM.
    """

    role = "memory"
    subscriptions = ("memory.lookup", "action.executed")

    class Settings(AgentSettings):
        history: Annotated[int, Field(ge=1, le=100_000)] = 20
        """Items remembered per subject (1 to 100,000); the oldest is forgotten first."""
        key: str = "sender"
        """The payload field naming the subject, in what is remembered and in lookups."""
        fields: tuple[str, ...] = ("email_id", "intent", "action")
        """The payload fields kept of each remembered message (absent ones as None)."""
        lookup_topic: str = "memory.lookup"
        tally: dict[str, dict[str, Any]] = Field(
            default_factory=lambda: {"complaints": {"intent": "complaint"}}
        )
        """Counts a lookup answers: name -> the field values a remembered item must have."""

    settings: Settings

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._limit = self.settings.history
        self._history: dict[str, deque[dict[str, Any]]] = {}

    async def handle(self, env: Envelope) -> Any:
        key = self.settings.key
        if env.topic == self.settings.lookup_topic:
            return self.lookup(str(env.payload.get(key, "")))
        done = env.payload
        self.remember(str(done[key]), {f: done.get(f) for f in self.settings.fields})
        return None

    def remember(self, subject: str, item: dict[str, Any]) -> None:
        history = self._history.get(subject)
        if history is None:
            history = self._history[subject] = deque(maxlen=self._limit)
        history.append(item)

    def lookup(self, subject: str) -> dict[str, Any]:
        history = list(self._history.get(subject, ()))
        tallies = {
            name: sum(1 for h in history if all(h.get(f) == v for f, v in match.items()))
            for name, match in self.settings.tally.items()
        }
        return {
            self.settings.key: subject,
            "count": len(history),
            **tallies,
            "recent": history[-5:],
        }


class Reasoner(Agent):
    """Asks the model provider the team's question about each enriched message and proposes
    ranked actions.

    What to ask is the team's: ``question`` (setting, ``"module:function"``) is an async
    function ``(model, subject, body)`` returning at least ``{"intent", "confidence"}``, and
    ``actions`` maps each intent it can answer to the action that intent calls for. The
    support desk's are ``support.intents:classify`` and its ``ACTION_FOR_INTENT``. The
    question is asked of the agent, not of the provider (it goes through
    :meth:`Agent.chat`), so it is recorded, replayed, and counted in :attr:`Agent.usage`.

    ``thresholds`` (per intent, tuned by the Learner) is the confidence under which the
    Reasoner does not trust the provider's intent: it halves the confidence, which sends the
    item to a human through the Guardian. A sender with earlier complaints who writes again
    on the same thread is treated as a complaint follow-up.
    """

    role = "reasoner"
    subscriptions = ("sensor.email.enriched", "learner.threshold.updated")

    class Settings(AgentSettings):
        question: ImportString[Callable[..., Awaitable[Mapping[str, Any]]]] | None = None
        """``"module:function"``: ``async (model, subject, body) -> {"intent",
        "confidence", ...}``, the question asked of every message."""
        actions: dict[str, str] = Field(default_factory=dict)
        """Intent -> the action it calls for (``escalate`` is always ranked second)."""
        threshold: Annotated[float, Field(ge=0, le=1)] = 0.4
        """Confidence under which an intent is not trusted (the Learner moves it)."""
        thresholds: dict[str, Annotated[float, Field(ge=0, le=1)]] = Field(default_factory=dict)
        """Per-intent starting thresholds, overriding ``threshold``."""

    settings: Settings

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        if self.provider is None:
            raise TypeError("a Reasoner needs a model provider (provider=...)")
        if self.settings.question is None or not self.settings.actions:
            raise TypeError(
                f"{self.name}: a Reasoner needs its team's question and actions (settings "
                "question: 'module:function' and actions: {intent: action}; the support "
                "desk's are support.intents:classify and its ACTION_FOR_INTENT)"
            )
        self.question: Callable[[SupportsChat, str, str], Awaitable[Mapping[str, Any]]] = (
            self.settings.question
        )
        self.actions = dict(self.settings.actions)
        self.thresholds: dict[str, float] = dict.fromkeys(self.actions, self.settings.threshold)
        self.thresholds.update(self.settings.thresholds)

    async def handle(self, env: Envelope) -> None:
        if env.topic == "learner.threshold.updated":
            self.thresholds[env.payload["intent"]] = float(env.payload["new"])
            return
        email, features = env.payload["email"], env.payload["features"]
        sender = email["from"]
        # Lookups and threshold reads depend on what other messages got here first, so they go
        # through effects: recorded live, served on replay, and the replay stays exact.
        history = await self.effect(
            "memory.lookup", self.request, "memory.lookup", {"sender": sender}
        )
        verdict = await self.question(self, email.get("subject", ""), email.get("body", ""))
        thresholds = await self.effect("reasoner.thresholds", dict, self.thresholds)
        intent, confidence = verdict["intent"], float(verdict["confidence"])
        if (
            features.get("follow_up")
            and history["complaints"]
            and intent in ("question", "complaint")
        ):
            intent, confidence = "complaint", max(confidence, 0.8)
        trusted = confidence >= thresholds.get(intent, 0.0)
        if not trusted:
            confidence = round(confidence / 2, 4)
        primary = self.actions[intent]
        actions = [{"action": primary, "score": confidence}]
        if primary != "escalate":
            actions.append({"action": "escalate", "score": round(1 - confidence, 4)})
        await self.emit(
            "reasoning.intent.classified",
            {
                "email_id": email["id"],
                "sender": sender,
                "subject": email.get("subject", ""),
                "body": email.get("body", ""),
                "received_at": email.get("received_at"),
                "intent": intent,
                "confidence": confidence,
                "trusted": trusted,
                "scores": verdict.get("scores", {}),
                "actions": actions,
                "features": features,
                "history": history["count"],
            },
            Priority.HIGH if intent == "outage" else Priority.NORMAL,
        )


#: Hours until a first response is due, per intent.
SLA_HOURS = {"outage": 1, "complaint": 8, "refund": 24, "bug": 24, "question": 48, "spam": 0}
FOLLOW_UP_HOURS = 48

_REPLIES = {
    "question": "Thanks for your question. Here is what we found: {answer}",
    "refund": "We have processed your refund of {amount} for {orders}.",
    "complaint": "We are sorry about your experience. Ticket {ticket} tracks it.",
    "bug": "Thanks for the report. Ticket {ticket} tracks the fix.",
    "outage": "We are aware of the problem and engineers are on it.",
}


class Planner(Agent):
    """Turns the Reasoner's top-ranked action into concrete tool steps, with the SLA due time
    and a follow-up for anything left open. Drafts quote the customer's first line, which is
    exactly where PII slips into replies; catching it is the Guardian's job."""

    role = "planner"
    subscriptions = ("reasoning.intent.classified",)

    async def handle(self, env: Envelope) -> None:
        c = env.payload
        action = c["actions"][0]["action"]
        received = _parse_time(c.get("received_at"))
        features = c["features"]
        amount = features.get("amount")
        orders = ", ".join(features.get("order_ids") or []) or "your order"
        ticket = f"T-{c['email_id']}"
        first_line = next((ln.strip() for ln in str(c["body"]).splitlines() if ln.strip()), "")
        quote = f'\n\nYou wrote: "{first_line[:160]}"'
        text = _REPLIES.get(c["intent"], "Thanks for writing.").format(
            answer="see our help centre", amount=f"{amount:.2f}" if amount else "the amount",
            orders=orders, ticket=ticket,
        ) + quote  # fmt: skip
        steps: list[dict[str, Any]] = []
        if action == "reply":
            steps.append({"tool": "reply", "to": c["sender"], "text": text})
        elif action == "ticket":
            steps.append({"tool": "ticket", "id": ticket, "intent": c["intent"]})
            steps.append({"tool": "reply", "to": c["sender"], "text": text})
        elif action == "escalate":
            steps.append({"tool": "escalate", "queue": "humans", "why": c["intent"]})
        plan: dict[str, Any] = {
            "email_id": c["email_id"],
            "sender": c["sender"],
            "intent": c["intent"],
            "confidence": c["confidence"],
            "action": action,
            "amount": amount,
            "steps": steps,
            "pii": features.get("pii", []),
        }
        if received is not None:
            sla = received + timedelta(hours=SLA_HOURS.get(c["intent"], 24))
            plan["sla_due"] = sla.isoformat()
            if action in ("ticket", "escalate"):
                plan["follow_up_at"] = (received + timedelta(hours=FOLLOW_UP_HOURS)).isoformat()
        await self.emit("plan.proposed", plan)
        if "follow_up_at" in plan:
            await self.emit(
                "plan.followup.scheduled",
                {"email_id": c["email_id"], "at": plan["follow_up_at"], "sla_due": plan["sla_due"]},
            )


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
