"""Wraps one ``pantheon run`` in a recorded session (or not, with ``--no-record``)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bus import Bus, Transport
from pantheon.scenario import Scenario

__all__ = ["Recording", "recording"]


class Recording:
    """The bus a run uses, and how its session is hooked in and closed."""

    def __init__(self, bus: Bus, recorder: Any = None, outbox_dir: Path | None = None) -> None:
        self.bus = bus
        self.recorder = recorder
        self.outbox_dir = outbox_dir

    @property
    def store_path(self) -> Path | None:
        """The session store's file, when the run is recorded."""
        return None if self.recorder is None else Path(self.recorder.store.path)

    @property
    def journal(self) -> Callable[[str, bytes], None] | None:
        """Where a multi-process run's nodes ship their records (None: not recorded)."""
        return None if self.recorder is None else self.recorder.ingest

    async def attach(self, bus: Bus) -> None:
        if self.recorder is not None:
            self.recorder.attach(bus)

    @staticmethod
    def status(summary: Any) -> str:
        """How the session of a run that ended with ``summary`` ends: ``aborted`` (its input
        stopped by a signal: resumable), else ``completed`` or ``failed`` by its checks."""
        if summary.interrupted is not None:
            return "aborted"
        return "completed" if summary.passed else "failed"

    async def finish(self, summary: Any, *, source: str | None = None) -> None:
        if self.recorder is None:
            return
        data = dataclasses.asdict(summary) | {"passed": summary.passed, "scenario_path": source}
        await self.recorder.finish(self.status(summary), data)


@asynccontextmanager
async def recording(
    scenario: Scenario,
    store: Path | None,
    seed: int | None,
    *,
    enabled: bool = True,
    transport: Transport | None = None,
) -> AsyncIterator[Recording]:
    """Yield a :class:`Recording`; a run that raises is closed as ``failed`` with the error.

    ``transport`` connects the run's bus to others (a ZeroMQ run's driver)."""
    if not enabled:
        yield Recording(Bus(transport=transport))
        return
    from pantheon.sessions import Recorder, SessionStore

    with SessionStore(store) as session_store:
        recorder = Recorder(
            session_store,
            scenario=scenario.name,
            scenario_text=scenario.text,
            scenario_dir=None if scenario.base_dir is None else str(scenario.base_dir),
            seed=scenario.seed if seed is None else seed,
            # A multi-process run's nodes, each of which ships its part of the record.
            nodes=scenario.nodes(),
        )
        bus = Bus(session_id=recorder.session_id, transport=transport)
        rec = Recording(bus, recorder, session_store.path.parent / "outbox")
        try:
            yield rec
        except (asyncio.CancelledError, KeyboardInterrupt) as exc:
            # Interrupted (a second Ctrl-C): what was recorded stays, and the session is
            # one `pantheon resume` finishes, as after SIGKILL, not a failure of the team.
            await recorder.finish("aborted", {"error": f"interrupted ({type(exc).__name__})"})
            raise
        except BaseException as exc:
            await recorder.finish("failed", {"error": f"{type(exc).__name__}: {exc}"})
            raise
