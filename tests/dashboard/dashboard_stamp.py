"""A handler agent for the dashboard tests' failing team: it stamps each email with the
clock, read as a recorded effect. An exact replay serves the recorded time and matches; a
replay with live effects reads the clock again, so it diverges at the first stamp whatever
the timing of the rest of the run. That makes the divergence view testable without
depending on how a run's concurrency happens to interleave."""

from __future__ import annotations

from typing import Any

from bus import Envelope


async def stamp(env: Envelope, agent: Any) -> None:
    await agent.emit(
        "audit.stamped", {"email_id": env.payload.get("email_id"), "at": await agent.now()}
    )
