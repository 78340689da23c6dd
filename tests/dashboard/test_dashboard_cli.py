"""``pantheon dashboard``'s arguments (the served app itself is the browser test's)."""

from __future__ import annotations

from pathlib import Path

import typer
from cli_run import pantheon
from typer.testing import CliRunner

from dashboard.web import APP
from pantheon.cli._cmd_dashboard import register, streamlit_command
from pantheon.sessions import SessionStore

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_named_store_missing_or_damaged_is_refused_as_the_readme_says(tmp_path: Path) -> None:
    """``pantheon dashboard --store`` on a store that is not there or is cut short (a copy
    that stopped half way): one ``error:`` line and exit 2, no server; and the README says
    exactly that rather than promising a page."""
    missing = tmp_path / "none.db"
    whole = tmp_path / "whole.db"
    SessionStore(whole).close()
    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    for path, said in [
        (missing, f"no session store at {missing}"),
        (truncated, f"{truncated} is not a usable session store: database disk image is malformed"),
    ]:
        # Were a server started, the call would not return: the timeout would fail the test.
        proc = pantheon("dashboard", "--store", str(path), "--port", "1", cwd=tmp_path, timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.splitlines() == [f"error: {said}"], proc.stderr
        assert proc.stdout == ""
    assert not missing.exists()
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert (
        "A store named with `--store` (or `$PANTHEON_STORE`) that is missing or not a usable "
        "session store is refused before any server starts, in one line (`error: no session "
        "store at PATH`, `error: PATH is not a usable session store: database disk image is "
        "malformed`; exit 2)"
    ) in readme
    assert "A missing or corrupt store, or an unknown session, gets a page" not in readme
