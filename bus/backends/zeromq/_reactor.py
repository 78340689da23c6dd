"""The event-loop state every part of a node shares: pending socket drains and background tasks.

A node reads its sockets with plain reader callbacks on their FDs (no task, no future per
wake-up). ZMQ_FD is edge-triggered, so each part that sends or drains a socket must be able
to schedule one more drain of it; one table of pending drains, shared, keeps that to at most
one per FD whichever part asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import zmq

__all__ = ["Reactor"]

_EVENTS = int(zmq.EVENTS)


class Reactor:
    """A node's loop, its pending drains (one per FD) and the tasks teardown cancels."""

    __slots__ = ("drains", "loop", "tasks")

    loop: asyncio.AbstractEventLoop  # set by ``start``: a node is built outside its loop

    def __init__(self) -> None:
        self.drains: dict[int, asyncio.Handle] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def redrain(
        self,
        fd: int | None,
        sock: zmq.Socket[bytes] | None,
        drain: Callable[..., None],
        *args: Any,
    ) -> None:
        """Run ``drain`` for ``fd`` soon, unless it is pending already. With ``sock``, only if
        input waits: ZMQ_FD is edge-triggered, and a send or a drain can consume the edge of
        input that arrived meanwhile, so nothing else would wake the reader for it."""
        if fd is None or fd in self.drains:
            return
        # pyzmq types getsockopt as int | bytes; ZMQ_EVENTS is an int.
        if sock is not None and not sock.getsockopt(_EVENTS) & 1:  # type: ignore[operator]
            return
        self.drains[fd] = self.loop.call_soon(drain, *args)

    def drained(self, fd: int) -> None:
        """The drain for ``fd`` runs now: the next one may be scheduled."""
        self.drains.pop(fd, None)

    def forget(self, fd: int) -> None:
        """``fd`` is closing: its reader and any pending drain go."""
        self.loop.remove_reader(fd)
        handle = self.drains.pop(fd, None)
        if handle is not None:
            handle.cancel()

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task that teardown cancels, forgotten once it is done."""
        task = self.loop.create_task(work)
        self.tasks.append(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        if task in self.tasks:
            self.tasks.remove(task)

    async def stop(self) -> None:
        """Cancel every pending drain and task, and wait for the tasks to end."""
        for handle in self.drains.values():
            handle.cancel()
        self.drains.clear()
        tasks, self.tasks = self.tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
