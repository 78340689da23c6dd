"""The Python face of ``pantheon run`` and ``pantheon replay``: the same composition of
transport, session recording and live feed the CLI uses, for scripts, notebooks and tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bus import Bus
from pantheon._report import RunSummary
from pantheon._team import check_model
from pantheon.scenario import Scenario, load_scenario

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
) -> RunSummary:
    """Run ``scenario`` (a loaded one or a file path) to the end and judge its expectations.

    Recorded in ``store`` (default ``.pantheon/sessions.db`` or ``$PANTHEON_STORE``) unless
    ``record`` is false, with the live feed ``pantheon monitor`` attaches to. ``on_bus`` sees
    the run's bus before anything flows (telemetry hooks in there). The summary says whether
    the expectations held (``summary.passed``); a failing one is not an exception. A model
    server that cannot be reached raises ``agents.ProviderUnavailable`` before anything runs.
    """
    from pantheon._approvals import approval_desk, on_team
    from pantheon._cluster import cluster_transport
    from pantheon._runtime import run_scenario
    from pantheon._session_run import recording
    from pantheon.live import live_run

    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    await check_model(scenario)  # a dead model server stops the run before it starts
    store_path = None if store is None else Path(store)
    async with (
        cluster_transport(scenario) as transport,  # None unless transport.kind is zmq
        recording(scenario, store_path, seed, enabled=record, transport=transport) as rec,
        live_run(rec, scenario.name, enabled=record) as live,
        approval_desk(scenario, rec.store_path, rec.bus.session_id) as desk,
    ):
        if on_bus is not None:
            on_bus(rec.bus)
        summary = await run_scenario(
            scenario,
            seed=seed,
            on_progress=on_progress,
            bus=rec.bus,
            attach=live.attach,
            outbox_dir=rec.outbox_dir,
            on_team=on_team(live.watch, desk.serve),
            # A handler may be waiting for a person: the drain waits out its timeout too.
            drain_timeout=DRAIN_TIMEOUT + scenario.approvals.timeout,
        )
        base = scenario.base_dir
        source = None if base is None else str(base / Path(scenario.source).name)
        await rec.finish(summary, source=source)
        await live.close("completed" if summary.passed else "failed")
    return summary


@dataclass(frozen=True, slots=True)
class Session:
    """A recorded session, opened by id (or a unique prefix) from a session store.

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

        with SessionStore(None if store is None else Path(store)) as st:
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

        with SessionStore(self.store) as st:
            return what(st)


async def replay(
    session: str | Session,
    *,
    store: str | Path | None = None,
    live_effects: bool = False,
) -> Any:
    """Re-run a recorded session on a fresh bus, effects served from the record, and compare
    it hop by hop with the original; returns a :class:`pantheon.sessions.ReplayReport`
    (``report.matched``, ``report.divergence``). The replay is recorded as a new session."""
    from pantheon._team import team_setup
    from pantheon.sessions import SessionStore, replay_session

    ref = session.id if isinstance(session, Session) else session
    path = session.store if isinstance(session, Session) else store
    with SessionStore(None if path is None else Path(path)) as st:
        info = st.session(ref)
        setup = team_setup(
            info.scenario_text or "",
            base_dir=None if info.scenario_dir is None else Path(info.scenario_dir),
        )
        return await replay_session(st, info.id, setup, live_effects=live_effects)
