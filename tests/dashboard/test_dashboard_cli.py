"""``pantheon dashboard``'s arguments (the served app itself is the browser test's)."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.testing import CliRunner

from dashboard.web import APP
from pantheon.cli._cmd_dashboard import register, streamlit_command


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:  # a second command keeps "dashboard" a subcommand
        return None

    return app


def test_streamlit_runs_headless_on_the_loopback_by_default() -> None:
    cmd = streamlit_command(APP, 8501, "127.0.0.1")
    flags = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert cmd[2:5] == ["streamlit", "run", str(APP)] and Path(cmd[4]).is_file()
    assert flags["--server.address"] == "127.0.0.1" and flags["--server.port"] == "8501"
    assert flags["--server.headless"] == "true"
    assert flags["--browser.gatherUsageStats"] == "false"
    result = CliRunner().invoke(_app(), ["dashboard", "--help"])
    assert result.exit_code == 0
    assert "127.0.0.1" in result.output and "8501" in result.output


def test_a_bad_port_is_refused_before_anything_starts() -> None:
    result = CliRunner().invoke(_app(), ["dashboard", "--port", "70000"])
    assert result.exit_code == 2
    assert "70000 is not a TCP port" in result.output
