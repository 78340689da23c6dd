"""A bad ``--store`` or scenario path: one line naming the path and what is wrong, exit 2,
never a traceback (issue #13, item 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pantheon.cli import app
from pantheon.sessions import _store

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = str(ROOT / "scenarios" / "flaky_actor.yaml")

#: Every command that reads a store, with the arguments it needs besides ``--store``.
READERS = {
    "sessions list": ["sessions", "list"],
    "sessions show": ["sessions", "show", "x"],
    "replay": ["replay", "x"],
    "diff": ["diff", "a", "b"],
    "dlq list": ["dlq", "list", "x"],
    "dlq redrive": ["dlq", "redrive", "x", "1"],
    "export": ["export", "x"],
    "monitor": ["monitor"],
    "dashboard": ["dashboard"],
}


def _bad_stores(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path, the one line the CLI prints for it, after ``error: ``)."""
    directory = tmp / "dir"
    directory.mkdir()
    garbage = tmp / "garbage.db"
    garbage.write_text("not a database, not even close\n")
    return {
        "missing": (tmp / "missing.db", f"no session store at {tmp / 'missing.db'}"),
        "directory": (directory, f"{directory} is a directory, not a session store file"),
        "not sqlite": (
            garbage,
            f"{garbage} is not a usable session store: file is not a database",
        ),
    }


def _one_error_line(output: str, expected: str) -> None:
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines == [f"error: {expected}"], output


@pytest.mark.parametrize("kind", ["missing", "directory", "not sqlite"])
@pytest.mark.parametrize("command", list(READERS))
def test_read_commands_refuse_a_bad_store(tmp_path: Path, command: str, kind: str) -> None:
    path, expected = _bad_stores(tmp_path)[kind]
    result = CliRunner().invoke(app, [*READERS[command], "--store", str(path)])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    _one_error_line(result.output, expected)
    assert not (tmp_path / "missing.db").exists(), "a read command created a store"


@pytest.mark.parametrize("command", list(READERS))
def test_read_commands_refuse_an_unreadable_store(
    tmp_path: Path, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "secret.db"
    store.write_bytes(b"")
    # chmod 000 does not stop root (the CI container's user), so the OS's answer is faked.
    # The store asks access() (opening the file would drop this process's SQLite locks).
    monkeypatch.setattr(_store, "_readable", lambda path: Path(path) != store)
    result = CliRunner().invoke(app, [*READERS[command], "--store", str(store)])
    assert result.exit_code == 2, result.output
    _one_error_line(result.output, f"cannot read the session store {store}: Permission denied")


@pytest.mark.parametrize("kind", ["directory", "not sqlite"])
def test_run_refuses_a_bad_store(tmp_path: Path, kind: str) -> None:
    path, expected = _bad_stores(tmp_path)[kind]
    result = CliRunner().invoke(app, ["run", SCENARIO, "--store", str(path)])
    assert result.exit_code == 2, result.output
    _one_error_line(result.output, expected)


def test_run_cannot_create_a_store_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    path = tmp_path / "afile" / "sessions.db"
    result = CliRunner().invoke(app, ["run", SCENARIO, "--store", str(path)])
    assert result.exit_code == 2, result.output
    _one_error_line(
        result.output,
        f"cannot create the session store {path}: a file stands where its directory should be",
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["replay", "x", "--store", "{tmp}/dir"], "error: {tmp}/dir is a directory, not a "
         "session store file"),
        (["run", "--tui", SCENARIO, "--store", "{tmp}/dir"], "error: {tmp}/dir is a "
         "directory, not a session store file"),
        (["validate", "{tmp}/nope.yaml"], "{tmp}/nope.yaml: cannot read the scenario: No such "
         "file or directory"),
        (["run", "{tmp}/dir"], "{tmp}/dir: is a directory, not a scenario file"),
        (["run", "{tmp}/nope.yaml"], "{tmp}/nope.yaml: cannot read the scenario: No such file "
         "or directory"),
        (["validate", "{tmp}/dir"], "{tmp}/dir: is a directory, not a scenario file"),
    ],
)  # fmt: skip
def test_a_real_process_prints_one_line_and_no_traceback(
    tmp_path: Path, args: list[str], line: str
) -> None:
    (tmp_path / "dir").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", *(a.format(tmp=tmp_path) for a in args)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [x for x in (proc.stdout + proc.stderr).splitlines() if x.strip()]
    assert lines == [line.format(tmp=tmp_path)]


def test_an_error_on_line_100_prints_as_text_not_an_emoji(tmp_path: Path) -> None:
    """rich turns ``:100:`` into an emoji and ``[2]`` into markup; scenario errors are text."""
    filler = "".join(f"# line {n}\n" for n in range(3, 100))
    text = f"version: 1\nname: far\n{filler}rules:\n  spam[2]: x\n"
    (tmp_path / "far.yaml").write_text(text, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "validate", "far.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "far.yaml:100:1: rules: unknown key 'rules'" in proc.stderr
    assert "\U0001f4af" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_store_another_process_is_still_creating_opens_once_it_is_done(
    tmp_path: Path,
) -> None:
    """SQLite refuses a journal-mode change with "database is locked" at once, busy timeout
    or not, while another connection is creating the file: ``pantheon approvals`` or the
    dashboard opening the store of a run that was just starting failed that way. Opening
    waits for the creator instead."""
    import sqlite3
    import threading
    import time

    path = tmp_path / "new.db"
    creator = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    creator.execute("PRAGMA page_size=65536")
    creator.execute("BEGIN IMMEDIATE")
    creator.execute("CREATE TABLE half_made (x)")

    def finish_creating() -> None:
        time.sleep(0.3)
        creator.execute("COMMIT")
        creator.execute("PRAGMA journal_mode=WAL")

    done = threading.Thread(target=finish_creating)
    done.start()
    try:
        conn = _store.connect(path)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()
    finally:
        done.join()
        creator.close()
