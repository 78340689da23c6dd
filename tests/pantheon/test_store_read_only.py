"""A session store that cannot be written (an archived run, a CI artifact, a folder mounted
read-only) is read as it is, and whatever must write to it says the store is read-only.

The stores are real: recorded by ``pantheon run``. Each command runs as a user runs it (a
``pantheon`` child process) on a view of the store's folder that the kernel refuses to
write, so a test cannot pass by SQLite writing after all:

* a **read-only bind mount** of the folder, made in a private user and mount namespace
  (``unshare --user --map-root-user --mount``) that exists only for that one command. No
  privilege is needed and root is bound by it too (EROFS is not a permission check);
* else, for a user other than root, the folder ``chmod 0o555`` and the store ``0o444``;
* else (root, where chmod stops nothing, and no ``unshare``) the tests are skipped, rather
  than pass on a store that was writable all along.

On the code before the fix every reading command failed with ``... is not a usable session
store: unable to open database file`` (``connect()`` always switched to WAL and set the page
size), and the writing ones said the same instead of "read-only"."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tripping import run_json, tripping
from untimed import copy_untimed

#: Run in a private user and mount namespace: the folder $1 bound read-only onto $2, then
#: the command.
_MOUNT = 'mount --bind -o ro "$1" "$2" && shift 2 && exec "$@"'
_UNSHARE = ["unshare", "--user", "--map-root-user", "--mount"]

ReadOnly = Callable[..., subprocess.CompletedProcess[str]]


def _can_mount(tmp: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    # Bound, and the kernel refuses a write through the view.
    check = 'mount --bind -o ro "$1" "$2" && ! touch "$2/x" 2>/dev/null'
    probe = subprocess.run(
        [*_UNSHARE, "sh", "-c", check, "sh", tmp / "a", tmp / "b"],
        capture_output=True,
        check=False,
        timeout=30,
    )
    return probe.returncode == 0 and not (tmp / "a" / "x").exists()


@pytest.fixture(scope="module")
def mechanism(tmp_path_factory: pytest.TempPathFactory) -> str:
    if _can_mount(tmp_path_factory.mktemp("probe")):
        return "mount"
    if os.geteuid() != 0:
        return "chmod"
    pytest.skip("root without unshare: no way to make a folder read-only for this process")


def read_only(folder: Path, mechanism: str) -> ReadOnly:
    """``run(*args)``: ``pantheon ARGS`` with ``{store}`` in them standing for the store in
    a read-only view of ``folder``."""
    view = folder.parent / f"{folder.name}-ro"
    view.mkdir(exist_ok=True)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        where = view if mechanism == "mount" else folder
        argv = [a.replace("{store}", str(where / "sessions.db")) for a in args]
        cmd = [sys.executable, "-m", "pantheon.cli", *argv]
        if mechanism == "mount":
            cmd = [*_UNSHARE, "sh", "-c", _MOUNT, "sh", str(folder), str(view), *cmd]
        else:
            for p in folder.iterdir():
                p.chmod(0o444)
            folder.chmod(0o555)
        try:
            return subprocess.run(
                cmd,
                cwd=folder.parent,
                capture_output=True,
                text=True,
                timeout=180,
                env={**os.environ, "COLUMNS": "250"},
                check=False,
            )
        finally:
            if mechanism == "chmod":
                folder.chmod(0o755)
                for p in folder.iterdir():
                    p.chmod(0o644)

    return run


def _fingerprint(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, object]]]:
    """Two runs of the same small scenario in ``store/sessions.db``, and their summaries."""
    work = tmp_path_factory.mktemp("ro")
    # A small support run whose tickets all fail on the Actor: dead letters to list, and
    # a breaker that opens (a ``system.breaker.actor`` message).
    scenario = tripping(copy_untimed(work), "small")
    (work / "store").mkdir()
    summaries = [run_json(work, scenario, "store/sessions.db") for _ in range(2)]
    # The last writer closed cleanly: no -wal, no -shm, as a store is archived or mounted.
    assert sorted(p.name for p in (work / "store").iterdir()) == ["live", "outbox", "sessions.db"]
    return work / "store", summaries


@pytest.fixture
def store(recorded: tuple[Path, list[dict[str, object]]], tmp_path: Path) -> Iterator[Path]:
    """A copy of the recorded folder (with its store only) for one test."""
    folder = tmp_path / "store"
    folder.mkdir()
    shutil.copy2(recorded[0] / "sessions.db", folder / "sessions.db")
    yield folder


def test_reading_commands_read_a_store_that_cannot_be_written(
    store: Path, recorded: tuple[Path, list[dict[str, object]]], mechanism: str
) -> None:
    summaries = recorded[1]
    run = read_only(store, mechanism)
    before = _fingerprint(store)

    out = run("sessions", "list", "--json", "--store", "{store}")
    assert out.returncode == 0, out.stderr
    listed = {s["id"]: s["messages"] for s in json.loads(out.stdout)}
    assert listed == {s["session_id"]: s["messages"] for s in summaries}

    out = run("sessions", "show", "latest", "--store", "{store}")
    assert out.returncode == 0, out.stderr
    assert str(summaries[1]["session_id"]) in out.stdout

    out = run("export", "latest", "--store", "{store}")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == summaries[1]["messages"]

    out = run("dlq", "list", "latest", "--store", "{store}")
    assert out.returncode == 0, out.stderr
    assert "dead letters of " in out.stdout and "#1 actor on " in out.stdout

    out = run("diff", "-2", "-1", "--store", "{store}")
    # 1 exactly when the runs differ (timing may make them); the store being read-only
    # changes neither.
    assert out.returncode == (0 if "no difference" in out.stdout else 1), out.stdout + out.stderr
    assert " hops compared (" in out.stdout

    out = run("approvals", "latest", "--store", "{store}")
    assert out.returncode == 0, out.stderr
    assert "no approvals" in out.stdout

    assert _fingerprint(store) == before  # nothing written, nothing left beside it


def test_writing_commands_say_the_store_is_read_only(
    store: Path, recorded: tuple[Path, list[dict[str, object]]], mechanism: str
) -> None:
    run = read_only(store, mechanism)
    before = _fingerprint(store)
    small = recorded[0].parent / "scenarios" / "small.yaml"
    for args in (
        ("replay", "latest"),
        ("dlq", "redrive", "latest"),
        ("approve", "latest", "1"),
        ("run", str(small)),
    ):
        out = run(*args, "--store", "{store}")
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        err = " ".join(out.stderr.split())
        assert "is read-only (" in err and "needs to write to it" in err, (args, err)
        assert "not a usable session store" not in err, (args, err)
    assert _fingerprint(store) == before


def test_an_older_store_is_not_migrated_through_a_read_only_view(
    store: Path, mechanism: str
) -> None:
    """A store of schema version 3 is migrated in place when opened, which a read-only
    store cannot be: the error says so, and the file is left as it was."""
    conn = sqlite3.connect(store / "sessions.db", isolation_level=None)
    conn.execute("ALTER TABLE effects DROP COLUMN digest")
    conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    conn.close()
    before = _fingerprint(store)
    out = read_only(store, mechanism)("sessions", "list", "--store", "{store}")
    assert out.returncode == 2, out.stdout
    err = " ".join(out.stderr.split())
    assert "needs migrating from schema version 3 to 4" in err and "read-only" in err, err
    assert _fingerprint(store) == before


def _hold_commit(folder: Path) -> sqlite3.Connection:
    """A writer with a session committed to the -wal only (no checkpoint): its -wal and
    -shm stand beside the store while it is open, as while a run records."""
    conn = sqlite3.connect(folder / "sessions.db", isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute(
        "INSERT INTO sessions (id, kind, started, status, summary) "
        "VALUES ('29990101-000000-beef', 'run', 32503680000, 'completed', '{}')"
    )
    assert (folder / "sessions.db-wal").stat().st_size > 0
    return conn


def test_a_store_being_written_is_read_with_its_log(store: Path, mechanism: str) -> None:
    """The -wal and -shm are there (a writer has it open): the read-only view reads the
    commits still in the log (opening the file ``immutable`` would not see them)."""
    conn = _hold_commit(store)
    try:
        out = read_only(store, mechanism)("sessions", "list", "--json", "--store", "{store}")
    finally:
        conn.close()
    assert out.returncode == 0, out.stderr
    assert "29990101-000000-beef" in {s["id"] for s in json.loads(out.stdout)}


def test_a_log_left_without_its_index_is_refused(
    store: Path, tmp_path: Path, mechanism: str
) -> None:
    """A -wal with commits but no -shm, in a folder nobody can write: SQLite cannot read the
    log, and reading the file alone would silently drop those commits: refused, saying so."""
    conn = _hold_commit(store)
    left = tmp_path / "left"
    left.mkdir()
    try:
        for name in ("sessions.db", "sessions.db-wal"):
            shutil.copy2(store / name, left / name)
    finally:
        conn.close()
    out = read_only(left, mechanism)("sessions", "list", "--store", "{store}")
    assert out.returncode == 2, out.stdout
    err = " ".join(out.stderr.split())
    assert "its last commits are in sessions.db-wal" in err, err
