"""Waiting on a Textual app under its test pilot: the monitor reads its store and its feed in
threads and tasks, so a test lets the app run until what it checks has arrived."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot

__all__ = ["DEADLINE", "until"]

#: Seconds a test waits for something the app shows before it fails, saying what.
DEADLINE = 30.0


async def until(
    pilot: Pilot[Any], check: Callable[[], bool], what: str, deadline: float = DEADLINE
) -> None:
    """Let the app run until ``check()`` holds; ``AssertionError`` naming ``what`` after
    ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)
