"""``pantheon monitor [SESSION]`` and ``pantheon run FILE --tui``: the Textual monitor.

``monitor`` without a session attaches to the newest running session's live feed, or shows
the newest session's record when none is running; with one, it attaches live while that
session runs with a feed and shows its record otherwise. Both need the ``tui`` extra;
``dashboard`` is imported inside the commands only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from pantheon._cli_sessions import SetupOpt, StoreOpt, _load_setup
from pantheon.live import FeedNotFound, LiveRun, connect, live_sessions, socket_path
from pantheon.sessions import SessionError, SessionStore, Setup, resolve_store_path

if TYPE_CHECKING:
    from dashboard.tui import Source

__all__ = ["register", "run_tui"]

_TUI_MISSING = "the monitor needs Textual: pip install 'pantheon[tui]' ({exc})"


def _err(message: str) -> typer.Exit:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/red] {message}")
    return typer.Exit(2)


def _tui() -> Any:
    try:
        import dashboard.tui as tui
    except ImportError as exc:
        raise _err(_TUI_MISSING.format(exc=exc)) from None
    return tui


def register(app: typer.Typer) -> None:
    """Add ``monitor`` to ``app``."""

    @app.command()
    def monitor(
        session: Annotated[
            str | None,
            typer.Argument(
                help="Session id or unique prefix (default: the newest running session, "
                "else the newest session).",
                show_default=False,
            ),
        ] = None,
        store: StoreOpt = None,
        setup: SetupOpt = None,
    ) -> None:
        """Watch a session in the terminal: live while it runs, its record once it ended.
        Keys: 1-5 panels, enter open, r redrive, t timeline, esc back, q quit."""
        tui = _tui()
        path = resolve_store_path(store)
        try:
            st = SessionStore(path, create=False)
        except SessionError as exc:
            raise _err(str(exc)) from None
        try:
            target, feed = _pick(st, session)
            team = _load_setup(setup, st.session(target).scenario_text)
        except SessionError as exc:
            raise _err(str(exc)) from None
        finally:
            st.close()
        asyncio.run(_monitor(tui, path, target, feed, team))


def _pick(store: SessionStore, ref: str | None) -> tuple[str, Path | None]:
    """The session to show and its feed socket, if it is running with one."""
    if ref is None:
        running = live_sessions(store)
        if running:
            info, sock = running[0]
            return info.id, sock
        newest = store.sessions(limit=1)
        if not newest:
            raise SessionError(f"no sessions in {store.path}")
        return newest[0].id, None
    info = store.session(ref)
    sock = socket_path(store.path, info.id)
    return info.id, sock if info.status == "running" and sock.exists() else None


async def _monitor(tui: Any, store: Path, sid: str, feed: Path | None, team: Setup) -> None:
    records = tui.StoreSource(store, sid, setup=lambda _text: team)
    source: Source = records
    if feed is not None:
        try:
            client = await connect(feed)
        except FeedNotFound:
            pass  # it ended (or died) since we looked: its record is all there is
        else:
            source = tui.LiveSource(client, records)
    try:
        await tui.MonitorApp(source).run_async()
    finally:
        await source.aclose()


def run_tui(start: Callable[[Callable[[LiveRun], None]], Awaitable[Any]]) -> Any:
    """Run a scenario with the monitor watching it in this terminal. ``start(on_live)``
    is the run (``pantheon run``'s, which calls ``on_live`` with its :class:`LiveRun`);
    returns its summary once both the run and the monitor are done. Quitting the monitor
    early lets the run finish; ctrl+c then aborts it."""
    tui = _tui()
    return asyncio.run(_run_tui(tui, start))


async def _run_tui(tui: Any, start: Callable[[Callable[[LiveRun], None]], Awaitable[Any]]) -> Any:
    from pantheon._runtime import team_setup

    loop = asyncio.get_running_loop()
    got: asyncio.Future[LiveRun] = loop.create_future()
    run = loop.create_task(start(got.set_result), name="pantheon-run")

    async def first(*aws: Awaitable[Any]) -> None:
        tasks = [asyncio.ensure_future(a) for a in aws]
        await asyncio.wait({*tasks, run}, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()

    async def feed() -> Any:
        await first(asyncio.shield(got))
        if not got.done():
            return None
        live = got.result()
        await first(live.started.wait())
        return live.feed

    def records() -> Any:
        live = got.result() if got.done() else None
        if live is None or live.store_path is None or live.session_id is None:
            return None
        return tui.StoreSource(live.store_path, live.session_id, setup=team_setup)

    source = tui.FeedSource(feed, records)
    app = tui.MonitorApp(source)

    def ended(task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            app.notify(f"the run failed: {task.exception()!r}", severity="error", timeout=30)

    run.add_done_callback(ended)
    try:
        await app.run_async()
    finally:
        await source.aclose()
    if not run.done():
        Console(stderr=True).print("monitor closed; waiting for the run to finish...")
    return await run
