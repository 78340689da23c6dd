"""Fixtures of the NATS fault tests: every test starts its own ``nats-server -js`` on free
loopback ports with a temporary store, and stops it after; never the machine's own NATS."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bus.backends.nats import NatsServer


@pytest.fixture
async def server() -> AsyncIterator[NatsServer]:
    started = await asyncio.to_thread(NatsServer().start)
    try:
        yield started
    finally:
        await asyncio.to_thread(started.stop)
