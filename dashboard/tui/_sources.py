"""Where the monitor's snapshots come from: a running session's feed, or the store.

Every source yields :class:`~pantheon.live.Snapshot` values and answers the two questions
the app asks besides: one request's waterfall, and "redrive this dead letter". A live
source becomes a store source when its feed ends, so a run watched to its end shows the
finished session's exact numbers (the feed's are the bus's sampled histograms).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Protocol

from pantheon.approvals import redrive_desk
from pantheon.live import (
    FeedClosed,
    HopBar,
    LiveClient,
    RedriveResult,
    Snapshot,
    Trace,
    snapshot_from_store,
    trace_from_store,
)
from pantheon.sessions import DEFAULT_REPLAY_TIMEOUT, SessionStore, Setup, redrive

__all__ = ["LiveSource", "Source", "StoreSource"]

#: Seconds between re-reads of a session that is running without a feed.
STORE_POLL = 1.0


class Source(Protocol):
    """What :class:`~dashboard.tui.MonitorApp` reads."""

    #: Shown in the header: where the numbers come from.
    origin: str

    def snapshots(self) -> AsyncIterator[Snapshot]:
        """Snapshots, newest first-come; ends when there will be no more."""
        ...

    async def waterfall(self, trace: Trace) -> tuple[HopBar, ...]: ...

    async def redrive(self, entry_id: int) -> str:
        """Redrive one dead letter; a line saying what happened (raises on refusal)."""
        ...

    async def aclose(self) -> None:
        """Let go of the store and the feed connection."""
        ...


class StoreSource:
    """A session from the store. A finished one is read once (again after a redrive); a
    running one without a feed is re-read every :data:`STORE_POLL` seconds.

    ``setup`` builds the team a redrive delivers to (``pantheon dlq redrive`` semantics: a
    new session of kind ``redrive``; the entry is marked redriven when delivered). Without
    it, redrive is refused with a message."""

    def __init__(
        self,
        store: str | Path,
        session_id: str,
        *,
        setup: Callable[[str | None], Setup] | None = None,
    ) -> None:
        self.store_path = Path(store)
        self._store = SessionStore(self.store_path, create=False, access="read")
        self.session_id = self._store.resolve(session_id)
        self._setup = setup
        self._changed = asyncio.Event()
        self.origin = f"store {self.store_path}"

    async def aclose(self) -> None:
        self._store.close()

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        while True:
            self._changed.clear()
            snap = await asyncio.to_thread(snapshot_from_store, self._store, self.session_id)
            yield snap
            if snap.status == "running":
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), STORE_POLL)
            else:
                await self._changed.wait()

    async def waterfall(self, trace: Trace) -> tuple[HopBar, ...]:
        return await asyncio.to_thread(
            trace_from_store, self._store, self.session_id, trace.correlation_id
        )

    async def redrive(self, entry_id: int) -> str:
        if self._setup is None:
            raise RuntimeError("no team to redrive to: start the monitor with --setup")
        info = await asyncio.to_thread(self._store.session, self.session_id)
        setup = self._setup(info.scenario_text)
        # The team asks for approval as under ``pantheon run`` and ``pantheon dlq redrive``.
        desk, waits = redrive_desk(info, Path(self._store.path))
        report = await redrive(
            self._store,
            self.session_id,
            setup,
            [entry_id],
            timeout=DEFAULT_REPLAY_TIMEOUT + waits,
            desk=desk,
        )
        self._changed.set()
        outcome = report.outcomes.get(entry_id, "not redriven")
        return f"entry {entry_id}: {outcome} (redrive session {report.new_session_id})"


class LiveSource:
    """A running session's feed through its socket (:class:`~pantheon.live.LiveClient`),
    then, once the feed ends, the finished session from ``store`` (when given)."""

    def __init__(self, client: LiveClient, store: StoreSource | None = None) -> None:
        self._client = client
        self._store = store
        self.origin = f"live feed of {client.session_id}"
        self._last: Snapshot | None = None
        #: Where the session's approvals are read and decided (None: no store given).
        self.store_path = None if store is None else store.store_path
        self.session_id = client.session_id

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        async for snap in self._client:
            self._last = snap
            yield snap
        if self._store is not None:
            self.origin = self._store.origin
            async for snap in self._store.snapshots():
                self._last = snap
                yield snap

    async def waterfall(self, trace: Trace) -> tuple[HopBar, ...]:
        return await _waterfall(trace, self._last, self._store)

    async def redrive(self, entry_id: int) -> str:
        if self._last is not None and not self._last.live and self._store is not None:
            return await self._store.redrive(entry_id)
        try:
            result = await self._client.redrive(entry_id)
        except FeedClosed:
            if self._store is None:
                raise
            return await self._store.redrive(entry_id)
        return _said(result)

    async def aclose(self) -> None:
        await self._client.aclose()
        if self._store is not None:
            await self._store.aclose()


async def _waterfall(
    trace: Trace, last: Snapshot | None, store: StoreSource | None
) -> tuple[HopBar, ...]:
    if trace.hops is not None:
        return trace.hops
    if store is None or last is None or last.live:
        return ()
    return await store.waterfall(trace)


def _said(result: RedriveResult) -> str:
    if not result.ok:
        raise RuntimeError(f"entry {result.entry_id}: {result.detail}")
    return f"entry {result.entry_id}: {result.detail}"
