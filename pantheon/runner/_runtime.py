"""Runs a scenario in this process: builds the team, wires it to a bus, feeds the input,
judges the outcome. A ZeroMQ scenario is handed to :mod:`pantheon.runner._multiprocess`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents import LiveEffects, Observer
from bus import Bus, Priority
from pantheon._errors import PantheonError
from pantheon.runner._build import Team, build_team
from pantheon.runner._inputs import count_inputs, run_flood
from pantheon.runner._report import RunSummary, local_report, summarize
from pantheon.scenario import Scenario

if TYPE_CHECKING:
    from pantheon.approvals import StoreDesk
    from pantheon.live import PartsBoard

__all__ = ["RunStuck", "drain_progressing", "run_scenario"]


class RunStuck(PantheonError, TimeoutError):
    """The team stopped finishing messages before its bus went quiet: nothing was handled,
    dead-lettered or published anywhere on it for the drain timeout. The message names the
    subscriptions that still held work."""


async def drain_progressing(bus: Bus, idle: float) -> None:
    """Wait until ``bus`` is quiet for as long as its team keeps finishing messages: a team
    whose agents are slow (model calls of seconds, a backlog behind them) is working, not
    stuck. :class:`RunStuck` once nothing moved for ``idle`` seconds (a fixed deadline
    used to end such runs with a bare ``TimeoutError`` and a traceback)."""
    last = _progress(bus)
    while True:
        try:
            await bus.drain(timeout=idle)
            return
        except TimeoutError:
            now = _progress(bus)
            if now != last:
                last = now
                continue
        stats = bus.stats().subscribers
        busy = ", ".join(
            f"{name} ({s.in_flight} in flight, {s.queued} queued)"
            for name, s in sorted(stats.items())
            if s.in_flight or s.queued
        )
        raise RunStuck(
            f"the team finished nothing for {idle:g} s and still holds work: "
            f"{busy or f'{bus.outstanding} messages outstanding'}"
        )


def _progress(bus: Bus) -> tuple[int, ...]:
    """What moves while a team works: messages published, and each subscription's settled."""
    stats = bus.stats()
    settled = sum(
        s.delivered + s.dead_lettered + s.shed + s.released for s in stats.subscribers.values()
    )
    return (stats.published, settled)


async def run_scenario(
    scenario: Scenario,
    *,
    seed: int | None = None,
    outbox_dir: Path | None = None,
    on_progress: Callable[[int, int | None], None] | None = None,
    bus: Bus | None = None,
    attach: Callable[[Bus], Awaitable[Any]] | None = None,
    drain_timeout: float = 60.0,
    on_team: Callable[[Team], None] | None = None,
    hold: Callable[[], Awaitable[Any]] | None = None,
    desk: StoreDesk | None = None,
    journal: Callable[[str, bytes], None] | None = None,
    board: PartsBoard | None = None,
) -> RunSummary:
    """Run the scenario to completion and judge its expectations.

    ``attach(bus)`` runs after the team is wired and before input flows (the session
    recorder hooks in there); ``on_progress(done, total)`` is called as inputs go out.
    ``on_team(team)`` sees the team of this process once it is built, before ``attach``
    (the live feed reads its agents' model usage from there). ``hold()``, once the input
    has ended, keeps the team running until it returns (``pantheon serve`` waits there for
    Ctrl-C, so the gateway goes on taking messages after a file input is read).
    ``desk`` is where the team's approval requests go: every agent of this process gets
    it, and in a multi-process run the nodes' agents ask it through the driver.

    A scenario with ``transport.kind: zmq`` (or ``nats``) runs as a broker (or NATS server)
    and node processes (:func:`pantheon.runner._multiprocess.run_cluster`); ``bus``, if
    given, must then
    be on its broker; ``journal(node, shipment)`` takes the nodes' records (the run's
    recorder's ``ingest``) and ``board`` their live parts (the run's live feed's).
    """
    if scenario.transport.kind in ("zmq", "nats"):
        from pantheon.runner._multiprocess import run_cluster

        return await run_cluster(
            scenario,
            seed=seed,
            outbox_dir=outbox_dir,
            on_progress=on_progress,
            bus=bus,
            attach=attach,
            drain_timeout=drain_timeout,
            on_team=on_team,
            desk=desk,
            journal=journal,
            board=board,
        )
    seed = scenario.seed if seed is None else seed
    bus = bus or Bus()
    if bus.context is None:
        bus.context = LiveEffects(seed)
    team = build_team(
        scenario,
        seed=seed,
        outbox_path=(outbox_dir / f"{bus.session_id or 'run'}.jsonl") if outbox_dir else None,
    )
    if on_team is not None:
        on_team(team)
    if desk is not None:
        desk.serve(team)
    observers: list[Observer] = team.of_role(Observer)
    total = count_inputs(scenario)
    started = time.perf_counter()
    async with contextlib.AsyncExitStack() as closing:
        closing.push_async_callback(team.aclose)  # last, once the bus is closed and quiet
        await closing.enter_async_context(bus)
        await team.attach(bus)
        if attach is not None:
            await attach(bus)
        await team.check_model()
        await team.start()
        flood = scenario.faults.flood
        flood_task = None
        if flood is not None:
            flood_task = asyncio.get_running_loop().create_task(
                run_flood(
                    bus, flood.topic, flood.rate, flood.count, Priority[flood.priority.upper()]
                )
            )
        while True:
            # Read ``done`` before the counts: the report made after the last input went
            # out is the one that says so, before the drain, however long that takes (the
            # bar used to sit at 599/600 through it).
            done = all(o.done.is_set() for o in observers)
            if on_progress is not None:
                on_progress(sum(o.emitted + o.malformed for o in observers), total)
            if done:
                break
            await asyncio.sleep(0.05)
        if hold is not None:
            await hold()
        if flood_task is not None:
            await flood_task
        await drain_progressing(bus, drain_timeout)
        await team.stop()
        await drain_progressing(bus, drain_timeout)
        elapsed = time.perf_counter() - started
        if on_progress is not None:
            on_progress(sum(o.emitted + o.malformed for o in observers), total)
        summary = summarize(
            scenario,
            [local_report(bus, team)],
            seed=seed,
            elapsed=elapsed,
            session_id=bus.session_id,
        )
    return summary
