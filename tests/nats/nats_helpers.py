"""Shared by the NATS fault tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest


async def eventually(predicate: Callable[[], object], timeout: float = 20.0) -> None:
    """Wait for ``predicate`` (a deadline, not a sleep); fail naming it after ``timeout``."""
    try:
        async with asyncio.timeout(timeout):
            while not predicate():  # noqa: ASYNC110 - polling state across processes
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"not reached within {timeout}s")
