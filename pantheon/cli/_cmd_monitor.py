"""``pantheon monitor [SESSION]`` and ``pantheon run FILE --tui``: the Textual monitor.

``monitor`` without a session attaches to the newest running session's live feed, and says
so and exits 2 when none is running (it used to open the newest record, which looked like a
frozen live run); with one, it attaches live while that session runs with a feed and shows
its record otherwise. Both need the ``tui`` extra;
``dashboard`` is imported inside the commands only.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from pantheon.cli._common import SetupOpt, StoreOpt, fail, load_setup
from pantheon.live import (
    FeedNotFound,
    ProtocolError,
    connect,
    connect_url,
    live_sessions,
    socket_path,
)
from pantheon.sessions import SessionError, SessionInfo, SessionStore, Setup, resolve_store_path

if TYPE_CHECKING:
    from dashboard.tui import Source

__all__ = ["register", "run_tui"]

#: Seconds between looks at the store while ``run --tui`` waits for its child's session.
_POLL = 0.05
_TUI_MISSING = "the monitor needs Textual: pip install 'pantheon[tui]' ({exc})"


def _tui() -> Any:
    try:
        import dashboard.tui as tui
    except ImportError as exc:
        raise fail(_TUI_MISSING.format(exc=exc)) from None
    return tui


def register(app: typer.Typer) -> None:
    """Add ``monitor`` to ``app``."""

    @app.command()
    def monitor(
        session: Annotated[
            str | None,
            typer.Argument(
                help="Session id, unique prefix or latest (default: the newest running session).",
                show_default=False,
            ),
        ] = None,
        store: StoreOpt = None,
        setup: SetupOpt = None,
        url: Annotated[
            str | None,
            typer.Option(
                help="Watch a run on another machine through its gateway "
                "(ws://host:8787/v1/live) instead of a local store.",
                show_default=False,
            ),
        ] = None,
        token_env: Annotated[
            str | None,
            typer.Option(
                help="Environment variable holding the gateway token for --url.",
                show_default=False,
            ),
        ] = None,
    ) -> None:
        """Watch a session in the terminal: live while it runs, its record once it ended.

        Keys: 1-8 panels, enter open, r redrive, a approve, x reject, t timeline, esc back,
        q quit."""
        tui = _tui()
        if url is not None:
            token = None
            if token_env is not None:
                token = os.environ.get(token_env)
                if not token:
                    raise fail(f"--token-env: ${token_env} is not set")
            asyncio.run(_remote(tui, url, token))
            return
        path = resolve_store_path(store)
        try:
            st = SessionStore(path, create=False, access="read")
        except SessionError as exc:
            raise fail(str(exc)) from None
        try:
            target, feed = _pick(st, session)
            info = st.session(target)
            team = load_setup(
                setup, info.scenario_text, info.scenario_dir, session=f"session {info.id} in {path}"
            )
        except SessionError as exc:
            raise fail(str(exc)) from None
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
        hint = f" (newest: {newest[0].id})" if newest else ""
        raise SessionError(
            f"no session is running in {store.path}; "
            f"`pantheon monitor SESSION` opens a recorded one{hint}"
        )
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


async def _remote(tui: Any, url: str, token: str | None) -> None:
    """``monitor --url``: the feed through a gateway; when it ends, its last snapshot stays
    on screen (the record is in the other machine's store)."""
    try:
        client = await connect_url(url, token=token)
    except (FeedNotFound, ProtocolError, ImportError) as exc:
        raise fail(str(exc)) from None
    source = tui.LiveSource(client)
    try:
        await tui.MonitorApp(source).run_async()
    finally:
        await source.aclose()


def run_tui(
    file: Path,
    *,
    seed: int | None,
    store: Path | None,
    record: bool,
    as_json: bool,
    strict_timing: bool = False,
) -> int:
    """``pantheon run FILE --tui``: the run in a child process, the monitor attached to its
    feed in this one; the run's own output is printed once the monitor closes. Returns the
    run's exit code.

    A child, not the same event loop: the monitor's rendering would otherwise stall the
    bus between messages and show up in the very latencies it displays (a p99 expectation
    of the support scenario failed that way). Quitting the monitor early lets the run
    finish; ctrl+c then stops it."""
    tui = _tui()
    if not record:
        raise fail("--tui watches the run through its session store: drop --no-record")
    path = resolve_store_path(store)
    if path.exists():  # else the run creates it
        try:
            SessionStore(path, create=False).close()
        except SessionError as exc:
            raise fail(str(exc)) from None
    args = [sys.executable, "-m", "pantheon.cli", "run", str(file), "--store", str(path)]
    args += [] if seed is None else ["--seed", str(seed)]
    args += ["--json"] if as_json else []
    args += ["--strict-timing"] if strict_timing else []
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        # A session of its own: a Ctrl-C at the terminal reaches this process alone, which
        # passes it on once. Reaching the run directly too, it arrived twice, and the second
        # stops the run at once instead of letting it finish what is in flight.
        child = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
        )
        try:
            found = _child_session(child, path)
            if found is not None:
                sid, feed, info = found
                team = load_setup(None, info.scenario_text, info.scenario_dir)
                asyncio.run(_monitor(tui, path, sid, feed, team))
            if child.poll() is None:
                Console(stderr=True).print("monitor closed; waiting for the run to finish...")
            code = child.wait()
        except KeyboardInterrupt:
            child.send_signal(signal.SIGINT)
            try:
                code = child.wait()
            except KeyboardInterrupt:  # again: the run stops at once (still resumable)
                child.send_signal(signal.SIGINT)
                code = child.wait()
        for stream, sink in ((out, sys.stdout), (err, sys.stderr)):
            stream.seek(0)
            sink.write(stream.read().decode(errors="replace"))
            sink.flush()
    return code


def _child_session(
    child: subprocess.Popen[bytes], store: Path
) -> tuple[str, Path | None, SessionInfo] | None:
    """Wait for the child's session to appear in ``store`` and for its feed socket (the
    recorder names the session just before the bus starts); None if the child exits
    first. Polls the store file: the child owns it, this process only reads."""
    sid = None
    while child.poll() is None:
        if store.exists():
            with SessionStore(store, create=False, access="read") as st:
                mine = [s for s in st.sessions(limit=20) if s.pid == child.pid]
                if mine:
                    info = mine[0]
                    sock = socket_path(store, info.id)
                    if sock.exists() or info.status != "running":
                        return info.id, sock if sock.exists() else None, info
                    sid = info.id
        time.sleep(_POLL)
    if sid is None:
        return None
    with SessionStore(store, create=False, access="read") as st:
        return sid, None, st.session(sid)
