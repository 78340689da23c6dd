"""The support desk's question: which kind of email is this, and what each kind calls for.

:func:`classify` asks it of any chat model (the scenario's rules provider, or a real model
over HTTP) with one prompt and one JSON schema, so answers from different models are
comparable and held to the same rules. The built-in Reasoner asks it through its
``question`` setting (``"support.intents:classify"``) and proposes the action
:data:`ACTION_FOR_INTENT` gives (its ``actions`` setting).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from agents import ProviderResponseError, SupportsChat

__all__ = ["ACTION_FOR_INTENT", "INTENTS", "classify"]

#: Every intent, in the order a tie between two of them is broken (the first wins).
INTENTS = ("question", "complaint", "refund", "bug", "spam", "outage")

#: The support desk's standing policy: what each intent calls for, before the Guardian.
ACTION_FOR_INTENT = {
    "question": "reply",
    "complaint": "ticket",
    "refund": "reply",
    "bug": "ticket",
    "spam": "ignore",
    "outage": "escalate",
}

#: Characters of an unusable answer quoted in an error.
EXCERPT = 200

_PROMPT = (
    "You classify customer support emails. Answer with one JSON object only: "
    '{"intent": one of ' + ", ".join(INTENTS) + ', "confidence": number between 0 and 1}.'
)

_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "email_intent",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {
                "intent": {"type": "string", "enum": list(INTENTS)},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["intent", "confidence"],
            "additionalProperties": False,
        },
    },
}


async def classify(model: SupportsChat, subject: str, body: str) -> dict[str, Any]:
    """Ask ``model`` which of :data:`INTENTS` an email is, and check the answer.

    The email is sent as ``Subject: <subject>``, a blank line, then the body: the shape the
    rules provider reads a title from. Returns ``{"intent", "confidence" (clamped to
    [0, 1]), "scores", "usage", "model"}``; ``scores`` are the provider's per-intent shares
    when it gives them, else the winner's confidence. Raises
    :class:`agents.ProviderResponseError` for an answer without a known intent.
    """
    result = await model.chat(
        [
            {"role": "system", "content": _PROMPT},
            {"role": "user", "content": f"Subject: {subject}\n\n{body}"},
        ],
        response_format=_FORMAT,
        temperature=0.0,
    )
    who = result.model or "the model"
    answer = result.data
    if not isinstance(answer, Mapping) or "intent" not in answer:
        raise ProviderResponseError(f"{who} gave no intent: {result.content!r:.{EXCERPT}}")
    intent = str(answer["intent"]).strip().lower()
    if intent not in INTENTS:
        raise ProviderResponseError(f"{who} answered unknown intent {intent!r}")
    try:
        confidence = float(answer.get("confidence", 0.5))
    except (TypeError, ValueError):
        confidence = math.nan
    if not math.isfinite(confidence):
        raise ProviderResponseError(f"{who} gave no usable confidence: {answer!r:.{EXCERPT}}")
    confidence = min(max(confidence, 0.0), 1.0)
    scores = answer.get("scores")
    return {
        "intent": intent,
        "confidence": confidence,
        "scores": dict(scores) if isinstance(scores, Mapping) else {intent: confidence},
        "usage": result.usage.to_dict(),
        "model": result.model,
    }
