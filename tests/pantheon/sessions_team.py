"""A small team of plain bus handlers for the session tests (agents are not needed).

``make_setup(variant)`` returns the ``setup(bus)`` replay and redrive call; ``team_setup``
has the runtime's signature (scenario text -> setup) for the CLI's ``--setup`` option, and
reads the variant from the scenario text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bus import Bus, Envelope

#: Real calls of the effect function, across the process (the tests reset it).
CALLS = {"classify": 0}


def classify_text(text: str) -> str:
    """The "model call": counted, so a test can prove a replay made none."""
    CALLS["classify"] += 1
    return "spam" if "buy" in text else "ham"


def make_setup(variant: str = "base") -> Callable[[Bus], Awaitable[None]]:
    """``base``: classifier -> actor -> sink, the actor fails on message 3.
    ``changed``: the classifier labels message 2 differently.
    ``fixed``: the actor no longer fails."""

    async def setup(bus: Bus) -> None:
        @bus.on("email.received", name="classifier")
        async def classify(env: Envelope) -> None:
            label = await env.context.effect("llm.classify", classify_text, env.payload["text"])
            if variant == "changed" and env.payload["n"] == 2:
                label = "urgent"
            await bus.emit("email.classified", {"n": env.payload["n"], "label": label})

        @bus.on("email.classified", name="actor")
        async def act(env: Envelope) -> None:
            stamp = await env.context.now()
            if env.payload["n"] == 3 and variant != "fixed":
                raise ValueError("cannot act on message 3")
            await bus.emit("action.done", {"n": env.payload["n"], "at": stamp})

        @bus.on("action.done", name="sink")
        async def sink(env: Envelope) -> None:
            return None

    return setup


def team_setup(scenario_text: str | None) -> Callable[[Bus], Awaitable[None]]:
    return make_setup((scenario_text or "base").strip() or "base")


def email(n: int) -> dict[str, Any]:
    return {"n": n, "text": f"buy now #{n}" if n % 2 else f"hello #{n}"}


def fixed_team(scenario_text: str | None) -> Callable[[Bus], Awaitable[None]]:
    return make_setup("fixed")


def changed_team(scenario_text: str | None) -> Callable[[Bus], Awaitable[None]]:
    return make_setup("changed")
