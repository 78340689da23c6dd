"""A node's side of a multi-process run's live feed (see :mod:`pantheon.live._parts`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from pantheon.live._feed import LiveFeed
from pantheon.live._parts import encode_part
from pantheon.live._run import outcome_tally
from pantheon.readmodel import SessionUsage

__all__ = ["LIVE_EVENT", "REDRIVEN_EVENT", "NodeParts"]

log = logging.getLogger("pantheon.live")

#: A node's part (a control line to the driver) and its answer to a ``redrive`` command: the
#: names ``pantheon.runner`` routes them by (its ``LIVE_EVENT`` and ``REDRIVEN_EVENT``).
LIVE_EVENT = "live"
REDRIVEN_EVENT = "redriven"


class NodeParts:
    """A feed of one node's bus, with no socket, whose part goes to the driver each tick
    through ``say(event, **fields)`` (the node's control channel); the driver's
    ``redrive`` commands are this feed's redrives, answered ``redriven``.

    ``host`` is the node (``pantheon.runner.NodeHost``): its bus, name, placement
    (``placed``: agent -> node), own per-topic counts and team (model usage and its
    ``tally`` of the decisions this node published)."""

    def __init__(self, host: Any, say: Callable[..., None]) -> None:
        team = host.team
        own: Mapping[str, int] = host.own_topics
        self.say = say
        self.node: str = host.node
        self.feed = LiveFeed(
            host.bus,
            nodes=host.placed,
            here=host.node,
            own_topics=lambda: own,
            usage=lambda: SessionUsage.of(team.usage_by_agent()),
            outcomes=lambda: outcome_tally(team.tally),
            ticking=False,
        )
        #: Whether anyone watches the driver's feed (its ``watch`` commands say).
        self.watched = False
        self._ticker: asyncio.Task[None] | None = None
        #: Redrives and sends under way, cancelled if the node leaves without a report.
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.feed.start()
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.feed.interval)
            if self.watched:
                await self.send()

    def watch(self, command: Mapping[str, Any]) -> None:
        """The driver's ``watch`` command: someone watches its feed (``on``), or nobody."""
        was, self.watched = self.watched, bool(command.get("on"))
        if self.watched and not was:
            self._spawn(self.send())

    async def send(self) -> None:
        """Build a part (on the loop: it reads the bus) and send it from a thread: encoding
        and writing ~134 KB to a pipe the driver may be slow to read must not hold up the
        node's agents. Whatever goes wrong (a closed pipe: the driver is gone), the node's
        work goes on."""
        try:
            part = self.feed.part()
            await asyncio.to_thread(self._say_part, part)
        except Exception as exc:
            log.warning("node %s: live part not sent: %r", self.node, exc)

    def _say_part(self, part: Any) -> None:
        self.say(LIVE_EVENT, data=encode_part(part))

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def redrive(self, command: Mapping[str, Any]) -> None:
        """The driver's ``redrive`` command (taken as it arrives): redrive this node's own
        dead letter ``entry`` and answer ``redriven`` with the command's ``id``."""

        async def run() -> None:
            entry = command.get("entry")
            result = await self.feed.redrive(entry if isinstance(entry, int) else -1)
            try:
                self.say(REDRIVEN_EVENT, id=command.get("id"), ok=result.ok, detail=result.detail)
            except Exception as exc:
                log.warning("node %s: redrive answer not sent: %r", self.node, exc)

        self._spawn(run())

    async def aclose(self) -> None:
        """Send the last part (the agents are done), then stop the feed."""
        await self.cancel()
        await self.send()
        await self.feed.aclose()

    async def cancel(self) -> None:
        """Stop sending (a node leaving without a report: nobody reads any more)."""
        tasks = [t for t in (self._ticker, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._ticker = None
