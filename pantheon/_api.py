"""The Python face of ``pantheon run`` and ``pantheon replay``: the same composition of
transport, session recording and live feed the CLI uses, for scripts, notebooks and tests."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus import Bus
from pantheon.runner import RunSummary, check_model
from pantheon.scenario import GatewayConfig, Scenario, load_scenario

if TYPE_CHECKING:
    from pantheon.approvals import OnWaiting
    from pantheon.gateway import Gateway, Tokens
    from pantheon.runner._build import RemoteInput

__all__ = ["Session", "replay", "run"]

#: Seconds a run waits for its bus to go quiet at the end, besides any approval's timeout.
DRAIN_TIMEOUT = 60.0


async def run(
    scenario: Scenario | str | Path,
    *,
    seed: int | None = None,
    store: str | Path | None = None,
    record: bool = True,
    on_progress: Callable[[int, int | None], None] | None = None,
    on_bus: Callable[[Bus], None] | None = None,
    gateway: GatewayConfig | None = None,
    serve: bool = False,
    on_gateway: Callable[[Gateway], None] | None = None,
    on_approvals: OnWaiting | None = None,
) -> RunSummary:
    """Run ``scenario`` (a loaded one or a file path) to the end and judge its expectations.

    With a gateway (``gateway``, else the scenario's ``gateway:`` section; ``serve`` uses
    the defaults when neither is given) the run's bus is served over HTTP and WebSocket
    while it runs, and ``on_gateway`` sees it once it listens. ``serve`` keeps the team
    running after its input has ended, until SIGINT or SIGTERM; the first such signal (in
    any run with a gateway) ends an ``http`` input and lets the run finish and be
    recorded, a second one interrupts. In a run that does not ``serve``, the first SIGINT
    or SIGTERM (Ctrl-C) stops the input where it is: the run finishes what is in flight,
    its summary says ``interrupted``, and its session is recorded ``aborted``, which
    ``pantheon resume`` finishes; a second signal interrupts at once (still ``aborted``).

    Recorded in ``store`` (default ``.pantheon/sessions.db`` or ``$PANTHEON_STORE``) unless
    ``record`` is false, with the live feed ``pantheon monitor`` attaches to. ``on_bus`` sees
    the run's bus before anything flows (telemetry hooks in there). ``on_approvals`` hears
    of approval requests nobody has decided for a second (the run waits on them: see
    :class:`pantheon.approvals.StoreDesk`), with those still waiting. The summary says whether
    the expectations held (``summary.passed``); a failing one is not an exception. A model
    server that cannot be reached raises ``agents.ProviderUnavailable`` before anything runs.
    """
    from pantheon.approvals import approval_desk
    from pantheon.live import PartsBoard, live_run
    from pantheon.runner import cluster_transport, count_own_topics, recording, run_scenario

    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    await check_model(scenario)  # a dead model server stops the run before it starts
    store_path = None if store is None else Path(store)
    gw_config = gateway if gateway is not None else scenario.gateway
    if serve and gw_config is None:
        gw_config = GatewayConfig()
    tokens = None
    if gw_config is not None:  # a bad tokens document stops the run before it starts
        from pantheon.gateway import load_tokens

        tokens = load_tokens(gw_config.tokens_file, gw_config.tokens_env)
    # A multi-process run's live feed is whole: every node's part joins the driver's.
    nodes = scenario.nodes()
    board = PartsBoard(nodes) if nodes and record else None
    async with (
        cluster_transport(scenario) as transport,  # None unless transport.kind is zmq
        recording(scenario, store_path, seed, enabled=record, transport=transport) as rec,
        live_run(
            rec,
            scenario.name,
            enabled=record,
            board=board,
            own_topics=None if board is None else functools.partial(count_own_topics, rec.bus),
        ) as live,
        _served(gw_config, tokens, on_gateway, lambda: live.feed, serve) as served,
        approval_desk(
            scenario, rec.store_path, rec.bus.session_id, on_waiting=on_approvals
        ) as desk,
    ):
        if on_bus is not None:
            on_bus(rec.bus)

        def on_team(team: Any) -> None:
            live.watch(team)
            served.watch(team)

        async def attach(bus: Bus) -> None:
            await live.attach(bus)
            await served.attach(bus)

        summary = await run_scenario(
            scenario,
            seed=seed,
            on_progress=on_progress,
            bus=rec.bus,
            attach=attach,
            outbox_dir=rec.outbox_dir,
            on_team=on_team,
            hold=served.hold if serve else None,
            journal=rec.journal,
            board=board,
            # A handler may be waiting for a person: the drain waits out its timeout too.
            drain_timeout=DRAIN_TIMEOUT + scenario.approvals.timeout,
            desk=desk,  # every agent's, on whichever process it runs
        )
        if served.interrupted is not None:
            summary.interrupted = served.interrupted
        if summary.nodes and rec.recorder is not None:
            await _score_from_record(scenario, summary, rec.recorder)
        base = scenario.base_dir
        source = None if base is None else str(base / Path(scenario.source).name)
        served.finishing = True
        await rec.finish(summary, source=source)
        await live.close(rec.status(summary))
        # Last: a monitor attached through the gateway gets the feed's final snapshot.
        await served.aclose()
    return summary


async def _score_from_record(scenario: Scenario, summary: RunSummary, recorder: Any) -> None:
    """Score and count a multi-process run from its session record (see
    :func:`pantheon.runner.score_from_record`), once every node's journal and the driver's
    own records are committed: its messages, and the dead letters of the processes that
    ended without their report. An in-process run's summary is scored and counted already,
    from all its one bus saw."""
    from pantheon.rerun import session_outcomes
    from pantheon.runner import MAX_LISTED_DEAD_LETTERS, score_from_record

    silent = list(summary.unverified)

    def read_record() -> tuple[Any, dict[str, int], dict[str, int], list[Any]]:
        store, sid = recorder.store, recorder.session_id
        dlq: Counter[str] = Counter()
        listed = []
        if silent:
            by_node = store.dead_letter_counts(sid)
            for node in silent:
                dlq.update(by_node.get(node, {}))
            listed = store.dead_letters(
                sid, nodes=silent, shed=False, limit=MAX_LISTED_DEAD_LETTERS
            )
        return session_outcomes(store, sid), store.topic_counts(sid), dict(dlq), listed

    try:
        await recorder.flush()
        read, topics, dlq, listed = await asyncio.to_thread(read_record)
    except Exception:
        # The run is over and its session must still be closed with its summary: keep the
        # processes' own score, and say why the record's is missing.
        logging.getLogger("pantheon").exception(
            "session %s: scoring from the record failed", recorder.session_id
        )
        return
    score_from_record(scenario, summary, read.score, topics=topics, dlq=dlq, dead_letters=listed)


class _Served:
    """The gateway of one run: started once the team is wired, stopped after the run;
    SIGINT/SIGTERM end its ``http`` inputs (and ``hold``) instead of killing the run. In a
    run that does not ``serve`` the same first signal ends every other Observer's input,
    this process's and, in a multi-process run, the nodes' (``Team.remote_input``: the
    driver relays it), so ``pantheon run``'s Ctrl-C finishes what is in flight and records
    it wherever the input is read."""

    def __init__(
        self,
        config: GatewayConfig | None,
        tokens: Tokens | None,
        on_gateway: Callable[[Gateway], None] | None,
        live: Callable[[], Any],
        serving: bool,
    ) -> None:
        self.config = config
        self.tokens = tokens
        self.on_gateway = on_gateway
        self.live = live
        self.gateway: Gateway | None = None
        self.inboxes: dict[str, Any] = {}
        self.stop = asyncio.Event()
        self.observers: list[Any] = []
        #: The input other processes read (a multi-process run's nodes), if any.
        self.remote: RemoteInput | None = None
        #: Set once the run is over and its session being closed (a signal then waits).
        self.finishing = False
        self._task: asyncio.Task[Any] | None = None
        #: ``pantheon serve``: the first signal ends the run as its normal end.
        self.serving = serving
        #: The signal that ended the input early (its name), if one did.
        self.interrupted: str | None = None
        self._signals: list[int] = []

    def watch(self, team: Any) -> None:
        from agents import Observer
        from pantheon.runner import HttpSource

        self.observers = team.of_role(Observer)
        self.remote = team.remote_input
        for agent in self.observers:
            if isinstance(agent.source, HttpSource):
                self.inboxes[agent.name] = agent.source

    async def attach(self, bus: Bus) -> None:
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        for sig in (signal.SIGINT, signal.SIGTERM):
            # Not on Windows, nor off the main thread (a test's loop): Ctrl-C then interrupts
            # as usual instead of finishing the run, which is all this handler adds.
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self._stopping, sig)
                self._signals.append(sig)
        if self.config is None:
            return
        from pantheon.gateway import Gateway

        self.gateway = Gateway(
            bus, self.config, inboxes=self.inboxes, tokens=self.tokens, live=self.live
        )
        await self.gateway.start()
        if self.on_gateway is not None:
            self.on_gateway(self.gateway)

    def _stopping(self, sig: int) -> None:
        name = signal.Signals(sig).name
        loop = asyncio.get_running_loop()
        for other in self._signals:  # the next one interrupts (see _again)
            loop.add_signal_handler(other, self._again, other)
        self.stop.set()
        for source in self.inboxes.values():
            source.close()
        log = logging.getLogger("pantheon")
        if self.serving:  # ``pantheon serve``: a signal is how its run ends
            log.info("%s: finishing the run (again to interrupt)", name)
            return
        unread = [o for o in self.observers if not o.done.is_set() and o.name not in self.inboxes]
        # Read before ending anything: which Observers this signal stops, here and on nodes.
        remote = [] if self.remote is None else self.remote.reading()
        if not unread and not remote:
            if self.inboxes:  # its http inputs, closed above, were all it read
                log.info("%s: finishing the run (again to interrupt)", name)
            else:
                log.warning(
                    "%s: no input left to stop (it ended): finishing the run (again to "
                    "interrupt at once)",
                    name,
                )
            return
        log.warning(
            "%s: input stopped%s, finishing what is in flight (again to interrupt at once); "
            "the session is recorded as aborted: pantheon resume finishes it",
            name,
            f" ({'here and ' if unread else ''}at {', '.join(remote)})" if remote else "",
        )
        self.interrupted = name
        for observer in unread:
            observer.end_input()
        if remote and self.remote is not None:
            self.remote.end_input()

    def _again(self, sig: int) -> None:
        """A second signal: stop at once, by cancelling the run (its session is recorded
        ``aborted``, resumable as after a crash), unless the run is writing its session's
        end already: cut there, the session would be left ``running``."""
        name = signal.Signals(sig).name
        if self.finishing:
            logging.getLogger("pantheon").warning(
                "%s: the run is over and its session being closed; a moment", name
            )
            return
        self._restore()
        if self._task is not None:
            self._task.cancel()

    def _restore(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._signals:
            loop.remove_signal_handler(sig)
        self._signals.clear()

    async def hold(self) -> None:
        await self.stop.wait()

    async def aclose(self) -> None:
        if self._signals:
            self._restore()
        if self.gateway is not None:
            gateway, self.gateway = self.gateway, None
            await gateway.aclose()


@contextlib.asynccontextmanager
async def _served(
    config: GatewayConfig | None,
    tokens: Tokens | None,
    on_gateway: Callable[[Gateway], None] | None,
    live: Callable[[], Any],
    serving: bool,
) -> AsyncIterator[_Served]:
    served = _Served(config, tokens, on_gateway, live, serving)
    try:
        yield served
    finally:
        await served.aclose()


@dataclass(frozen=True, slots=True)
class Session:
    """A recorded session, opened by id (a unique prefix, or ``latest`` / ``-1`` for the
    newest) from a session store.

    A value: what the store held when it was opened. ``envelopes()``, ``dead_letters()`` and
    ``effects()`` read the store again each time, so a running session can be followed.
    """

    id: str
    status: str
    scenario: str | None
    summary: dict[str, Any]
    store: Path

    @classmethod
    def open(cls, ref: str, store: str | Path | None = None) -> Session:
        from pantheon.sessions import SessionStore

        with SessionStore(None if store is None else Path(store), access="read") as st:
            info = st.session(ref)
            return cls(info.id, info.status, info.scenario, info.summary, st.path)

    def envelopes(self) -> list[Any]:
        """Every message of the session, in publish order."""
        return self._read(lambda st: st.envelopes(self.id))

    def dead_letters(self) -> list[Any]:
        """Every dead letter, with payload, reason and traceback."""
        return self._read(lambda st: st.dead_letters(self.id))

    def effects(self) -> list[Any]:
        """Every recorded effect (model and tool calls, clock, randomness)."""
        return self._read(lambda st: st.effects(self.id))

    def _read(self, what: Callable[[Any], list[Any]]) -> list[Any]:
        from pantheon.sessions import SessionStore

        with SessionStore(self.store, access="read") as st:
            return what(st)


async def replay(
    session: str | Session,
    *,
    store: str | Path | None = None,
    live_effects: bool = False,
    with_: str | Path | None = None,
) -> Any:
    """Re-run a recorded session on a fresh bus, effects served from the record, and compare
    it hop by hop with the original; returns a :class:`pantheon.rerun.ReplayReport`
    (``report.matched``, ``report.divergence``). The replay is recorded as a new session.

    ``with_`` makes it a what-if replay (``pantheon replay --with``): the recorded inputs
    through the team changed by an overlay (a :class:`~pathlib.Path` to its YAML file, or
    the YAML text itself; see ``docs/what-if.md``), effects served only where a call is the
    recorded one. It returns a ``WhatIfReport`` (``report.decisions`` names every item
    decided differently); an invalid overlay raises :class:`ScenarioError` before anything
    runs."""
    from pantheon.rerun import replay_session
    from pantheon.runner import team_setup
    from pantheon.sessions import SessionStore

    ref = session.id if isinstance(session, Session) else session
    path = session.store if isinstance(session, Session) else store
    with SessionStore(None if path is None else Path(path)) as st:
        info = st.session(ref)
        if with_ is not None:
            from pantheon.rerun import read_overlay, whatif_replay

            if live_effects:
                raise ValueError("a what-if replay (with_) serves unchanged calls: no live_effects")
            if isinstance(with_, Path):
                return await whatif_replay(st, info.id, read_overlay(with_), source=str(with_))
            return await whatif_replay(st, info.id, with_)
        setup = team_setup(
            info.scenario_text or "",
            base_dir=None if info.scenario_dir is None else Path(info.scenario_dir),
        )
        return await replay_session(st, info.id, setup, live_effects=live_effects)
