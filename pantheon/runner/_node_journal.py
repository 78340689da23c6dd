"""How a multi-process run's nodes get their part of the record to the session.

Every node records its bus with a :class:`~pantheon.sessions.ShippingRecorder`; what
differs per transport is the link its shipments take (``RECORD.md`` §2):

* **ZeroMQ**: ``journal`` lines on the node's control link to its driver (the pipe
  ``pantheon run`` spawned it with): ordered, and a blocking write slows the node's writer
  rather than dropping anything. Shipments the driver had not committed when it died are
  lost with it, so a ZeroMQ run is not resumable.
* **NATS**: the team's JetStream stream (``bus.backends.nats._journal``): each shipment is
  on the server once acknowledged, so a driver that dies loses nothing its nodes shipped;
  the driver follows the journal subjects while the run goes on, and ``pantheon resume``
  reads what it had not stored yet (:func:`~pantheon.runner._multiprocess.import_from_stream`,
  beside the NATS settings it connects with).

The driver's recorder ingests each shipment (``Recorder.ingest``) whichever way it came.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from pantheon.telemetry import get_logger

__all__ = ["JetStreamShipper", "JournalFollower"]

log = get_logger("pantheon.cluster")

#: Seconds a node goes on sending a shipment the stream has not acknowledged: well inside
#: the stream's duplicate window (120 s by default), so a part stored by an attempt whose
#: acknowledgement was lost is not stored again.
RETRY_FOR = 60.0
_FIRST_PAUSE = 0.05
_MAX_PAUSE = 2.0


class JetStreamShipper:
    """A node's shipments onto the team's stream, in order, from the recorder's writer
    thread (``__call__``) through one task on the node's loop (the NATS client lives there).

    Nothing is dropped: a shipment waits in the queue until the server acknowledged the one
    before. A shipment the server did not acknowledge (an ack past the client's timeout on a
    loaded machine, a connection that was being re-established) is sent again, with the same
    message ids, so the stream stores it once, for up to ``retry_for`` seconds: one slow
    acknowledgement used to end the node's journal there. :meth:`drain` returns once every
    shipment handed over is stored; ``failed`` holds the error that stopped shipping, if one
    did (the driver then sees this node's journal end early, as for a node that died)."""

    def __init__(self, transport: Any, session: str, retry_for: float = RETRY_FOR) -> None:
        self._transport = transport
        self._session = session
        self.retry_for = retry_for
        #: Shipments sent more than once before the server acknowledged them.
        self.retried = 0
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, bytes, bool] | None] = asyncio.Queue()
        self._task = self._loop.create_task(self._run(), name=f"journal:{session}")
        self.failed: BaseException | None = None

    def __call__(self, seq: int, data: bytes, end: bool) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (seq, data, end))

    async def _run(self) -> None:
        while (item := await self._queue.get()) is not None:
            try:
                await self._ship(*item)
            except Exception as exc:
                self.failed = exc
                log.error("journal shipping stopped", session=self._session, error=repr(exc))
                return

    async def _ship(self, seq: int, data: bytes, end: bool) -> None:
        give_up = self._loop.time() + self.retry_for
        pause = _FIRST_PAUSE
        while True:
            try:
                await self._transport.journal_append(self._session, seq, data, end)
                return
            except Exception as exc:
                if self._loop.time() + pause > give_up:
                    raise
                self.retried += 1
                log.warning(
                    "journal shipment not acknowledged; sending it again",
                    session=self._session, seq=seq, error=repr(exc),
                )  # fmt: skip
                await asyncio.sleep(pause)
                pause = min(pause * 2, _MAX_PAUSE)

    async def drain(self) -> None:
        """Ship what is queued (the recorder finished: nothing more comes), then stop."""
        self._queue.put_nowait(None)
        await self._task


class JournalFollower:
    """The driver's reader of its nodes' journals on a NATS run: hands every shipment to
    ``ingest(node, data)`` as it arrives, and at the end waits for each node that left
    cleanly to have its end mark read."""

    def __init__(self, transport: Any, session: str, ingest: Callable[[str, bytes], None]) -> None:
        self.reader = transport.journal_reader(
            session, lambda node, _seq, data, _end: ingest(node, data)
        )
        self._task = asyncio.get_running_loop().create_task(
            self.reader.follow(), name=f"journal-follow:{session}"
        )

    async def finish(self, ended: set[str], timeout: float) -> set[str]:
        """Wait (up to ``timeout``) for the end marks of ``ended`` (nodes that reported),
        then stop reading; returns those whose mark did not come."""
        reader = self.reader
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not ended <= reader.ended and not self._task.done():
                    reader.progress.clear()
                    waiter = asyncio.ensure_future(reader.progress.wait())
                    await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
        await self.abandon()
        return ended - reader.ended

    async def abandon(self) -> None:
        """Stop reading now (also once finished: then a no-op). On a failed run, what the
        reader ended with (a closed connection above all) is the failure's consequence,
        not news: it is not raised, nor left to asyncio's "never retrieved" log."""
        self.reader.stop()
        with contextlib.suppress(Exception):
            await self._task
