"""A live feed for one ``pantheon run``: the socket beside the store, redrives recorded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from agents import BudgetState, Outcomes
from bus import Bus
from pantheon.live._feed import LiveFeed
from pantheon.live._snapshot import MAX_TALLIED, OutcomeTally
from pantheon.live._wire import socket_path
from pantheon.readmodel import SessionUsage, placement

if TYPE_CHECKING:
    from pantheon.runner import Team

__all__ = ["LiveRun", "live_run", "outcome_tally"]


class LiveRun:
    """Wraps a run's ``attach(bus)`` so the feed starts once the recorder has named the
    session. ``feed`` is None until then, and stays None when the run is not live. Pass
    :meth:`watch` as the run's ``on_team`` for the feed to show the team's model usage."""

    def __init__(
        self,
        recording: Any,
        scenario: str | None,
        *,
        enabled: bool = True,
        serve: bool = True,
        **options: Any,
    ) -> None:
        self._recording = recording
        self._scenario = scenario
        self._enabled = enabled
        self._serve = serve
        self._options = options
        self._team: Team | None = None
        self.feed: LiveFeed | None = None

    def watch(self, team: Team) -> None:
        """The run's ``on_team``: snapshots carry the model usage its agents count and what
        the team has decided."""
        self._team = team

    def _outcomes(self) -> OutcomeTally:
        team = self._team
        return outcome_tally(None if team is None else team.outcomes or team.tally)

    def _usage(self) -> SessionUsage:
        return (
            SessionUsage() if self._team is None else SessionUsage.of(self._team.usage_by_agent())
        )

    def _budget(self) -> tuple[BudgetState, ...]:
        if self._team is None:
            return ()
        return tuple(ledger.state() for ledger in self._team.budgets)

    async def attach(self, bus: Bus) -> None:
        """The run's ``attach``: the recording's, then the feed."""
        await self._recording.attach(bus)
        if not self._enabled:
            return
        recorder = getattr(self._recording, "recorder", None)
        path = None
        nodes: dict[str, str] = {}
        if recorder is not None:
            if self._serve:
                path = socket_path(recorder.store.path, recorder.session_id)
            # Where a multi-process run's agents run, from the scenario it recorded.
            info = recorder.store.session(recorder.session_id)
            nodes = placement(info.scenario_text)
        feed = LiveFeed(
            bus,
            scenario=self._scenario,
            path=path,
            usage=self._usage,
            budget=self._budget,
            outcomes=self._outcomes,
            **{"nodes": nodes, **self._options},
        )
        if recorder is not None:
            feed.on_redrive.append(_marker(recorder))
        await feed.start()
        self.feed = feed

    async def close(self, status: str) -> None:
        """Publish the final snapshot with the session's ``status`` and stop the feed."""
        if self.feed is not None:
            await self.feed.aclose(status)


def outcome_tally(outcomes: Outcomes | None) -> OutcomeTally:
    """What ``outcomes`` has followed so far, as a snapshot carries it (empty for a team
    that declares no outcome: its default one is read at the end)."""
    if outcomes is None or not outcomes.spec.declared:
        return OutcomeTally()
    decided, scored, right = outcomes.live()
    return OutcomeTally(
        noun=outcomes.spec.noun,
        decided=decided,
        scored=scored,
        right=right,
        counts=tuple(outcomes.tally.most_common(MAX_TALLIED)),
    )


def _marker(recorder: Any) -> Callable[[int], Awaitable[None]]:
    """Mark a dead letter redriven live in the session's own record, once its row is in."""

    async def mark(entry_id: int) -> None:
        await recorder.flush()
        await asyncio.to_thread(
            recorder.store.mark_redriven, recorder.session_id, entry_id, recorder.session_id
        )

    return mark


@asynccontextmanager
async def live_run(
    recording: Any, scenario: str | None, *, enabled: bool = True, **options: Any
) -> AsyncIterator[LiveRun]:
    """``async with live_run(rec, name) as live``: pass ``live.attach`` as the run's attach
    and call ``await live.close(status)`` at the end; a block that raises closes the feed
    as ``failed``. ``enabled=False`` attaches the recording only."""
    live = LiveRun(recording, scenario, enabled=enabled, **options)
    try:
        yield live
    except BaseException:
        await live.close("failed")
        raise
    await live.close("completed")
