"""Finding a real run's live feed from a test: the run is a ``pantheon run`` child process
recording into ``store``; its feed appears once the session is in the store."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

from pantheon.live import FeedNotFound, LiveClient, connect, live_sessions
from pantheon.sessions import SessionStore

__all__ = ["find_feed", "watch_feed"]


async def find_feed(store: Path, child: subprocess.Popen[bytes], deadline: float) -> Any:
    """(the running session's info, its feed's socket path), once there is one; fails if
    the run ends first or ``deadline`` seconds pass."""
    end = time.monotonic() + deadline
    while True:
        if store.exists():  # noqa: ASYNC240 - a stat per poll
            with SessionStore(store, create=False) as st:
                found = live_sessions(st)
            if found:
                return found[0]
        assert child.poll() is None, "the run ended before its feed was found"
        assert time.monotonic() < end, "no live session appeared"
        await asyncio.sleep(0.02)


async def watch_feed(
    store: Path, child: subprocess.Popen[bytes], deadline: float
) -> tuple[Any, LiveClient]:
    """(the running session's info, a client attached to its feed). A socket that refuses
    is tried again while the run goes on: CI once found the run's socket there but not
    answering yet, a moment after the session appeared, and the watch failed at once."""
    end = time.monotonic() + deadline
    while True:
        info, sock = await find_feed(store, child, max(end - time.monotonic(), 0.0))
        try:
            return info, await connect(sock)
        except FeedNotFound:
            assert child.poll() is None, "the run ended before its feed answered"
            assert time.monotonic() < end, f"the feed at {sock} never answered"
            await asyncio.sleep(0.05)
