"""``pantheon dashboard``: the Streamlit web dashboard over the session store."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from pantheon.cli._common import fail
from pantheon.sessions import STORE_ENV, SessionError, SessionStore, resolve_store_path

__all__ = ["register", "streamlit_command"]


def streamlit_command(app: Path, port: int, address: str) -> list[str]:
    """``streamlit run APP`` headless on ``address:port``: no browser opened, no usage
    statistics sent, no file watcher (the app is installed code, not a script being
    edited), no telemetry prompts."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.port",
        str(port),
        "--server.address",
        address,
        "--server.headless",
        "true",
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--browser.gatherUsageStats",
        "false",
        "--global.developmentMode",
        "false",
        "--client.toolbarMode",
        "minimal",
    ]


def register(app: typer.Typer) -> None:
    """Add ``dashboard`` to ``app``."""

    @app.command("dashboard")
    def dashboard(
        port: Annotated[int, typer.Option(help="Port to serve on.")] = 8501,
        store: Annotated[
            Path | None,
            typer.Option(
                "--store",
                envvar=STORE_ENV,
                help="Session store file (default .pantheon/sessions.db under the current "
                "directory).",
                show_default=False,
            ),
        ] = None,
        address: Annotated[
            str,
            typer.Option(
                help="Address to bind. The default serves this machine only; the dashboard "
                "can start replays and redrives, so think before exposing it."
            ),
        ] = "127.0.0.1",
    ) -> None:
        """Serve the web dashboard: sessions, timelines, dead letters, replays."""
        if not 0 < port < 65536:
            raise typer.BadParameter(f"{port} is not a TCP port", param_hint="--port")
        if (
            importlib.util.find_spec("streamlit") is None
            or importlib.util.find_spec("altair") is None
        ):
            raise fail("the dashboard needs Streamlit and Altair: pip install 'pantheon[web]'")
        from dashboard.web import APP

        path = resolve_store_path(store).resolve()
        if path.exists() or store is not None:
            # A store named but missing, a directory, unreadable, not SQLite: say so here,
            # not in a page behind a server. Only the default store may be missing.
            try:
                SessionStore(path, create=False, access="read").close()
            except SessionError as exc:
                raise fail(str(exc)) from None
        else:
            typer.echo(f"warning: no session store at {path} yet; the page will say so", err=True)
        typer.echo(f"Pantheon dashboard on http://{address}:{port} (store {path})", err=True)
        env = dict(os.environ, **{STORE_ENV: str(path)})
        sys.stdout.flush()
        sys.stderr.flush()
        # Become the server (exec, not a child): Ctrl-C and a supervisor's SIGTERM reach
        # Streamlit directly and no orphan is left behind.
        os.execve(sys.executable, streamlit_command(APP, port, address), env)
