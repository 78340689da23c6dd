"""``pantheon monitor`` picking its session, without drawing the monitor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from pantheon.cli import _cmd_monitor as _cli_monitor
from pantheon.sessions import SessionStore

pytest.importorskip("textual")  # the command checks for the monitor's extra first


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Path | None]]:
    """The sessions the monitor would have opened (session id, feed), instead of opening."""
    seen: list[tuple[str, Path | None]] = []

    async def fake(tui: Any, store: Path, sid: str, feed: Path | None, team: Any) -> None:
        seen.append((sid, feed))

    monkeypatch.setattr(_cli_monitor, "_monitor", fake)
    monkeypatch.setattr(_cli_monitor, "load_setup", lambda *args, **kwargs: None)
    return seen


def test_monitor_with_nothing_running_says_so(
    tmp_path: Path, opened: list[tuple[str, Path | None]]
) -> None:
    """It used to open the newest finished session as if it were live."""
    app = typer.Typer()
    _cli_monitor.register(app)
    app.command("other")(lambda: None)  # a group, as in the real CLI
    path = tmp_path / "s.db"
    with SessionStore(path) as store:
        sid = store.begin_session(scenario="done", seed=1)
        store.end_session(sid, "completed", {})
    result = CliRunner().invoke(app, ["monitor", "--store", str(path)])
    assert result.exit_code == 2, result.output
    assert opened == []
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "no session is running" in lines[0] and sid in lines[0]

    # Named, a finished session still opens, on its record.
    result = CliRunner().invoke(app, ["monitor", sid[:15], "--store", str(path)])
    assert result.exit_code == 0, result.output
    assert opened == [(sid, None)]
