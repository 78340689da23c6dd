"""Handlers of the gateway tests' team (imported from the scenario's folder)."""

from __future__ import annotations

import asyncio
from typing import Any

from bus import Envelope


async def echo(env: Envelope) -> Any:
    return {"echo": env.payload, "topic": env.topic}


async def fail(env: Envelope) -> Any:
    raise ValueError("this service always fails")


async def silent(env: Envelope) -> Any:
    return None  # never answers: a request times out


async def slow(env: Envelope) -> Any:
    await asyncio.sleep(3)
    return None


async def sink(env: Envelope) -> Any:
    return None
