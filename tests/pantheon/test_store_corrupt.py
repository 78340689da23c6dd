"""A damaged store, through every CLI command that reads one (issue #14, item 9).

Each case prints one line naming the file and what is wrong and exits 2, never a traceback;
a command that can still do its job for the other sessions does it (exit 0), pinned per
case. Stores are damaged with sqlite3 directly, as a disk or a stray tool would.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sessions_team import email, make_setup
from typer.testing import CliRunner

from bus import Bus
from pantheon.cli import app
from pantheon.sessions import SCHEMA_VERSION, Recorder, SessionStore

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = str(ROOT / "scenarios" / "flaky_actor.yaml")
TEAM = str(Path(__file__).with_name("sessions_team.py")) + ":team_setup"


async def _record(store: SessionStore, sid: str) -> None:
    recorder = Recorder(store, session_id=sid, scenario="emails", scenario_text="base", seed=3)
    async with Bus() as bus:
        recorder.attach(bus)
        await make_setup("base")(bus)
        for i in range(5):
            await bus.emit("email.received", email(i))
        await bus.drain()
    await recorder.finish("completed", {"emails": 5})
    store.materialize(sid)


@pytest.fixture
async def store(tmp_path: Path) -> Path:
    """A store with two sessions, ``good`` and ``bad``; the tests damage ``bad``."""
    path = tmp_path / "sessions.db"
    with SessionStore(path) as st:
        await _record(st, "good")
        await _record(st, "bad")
    return path


DAMAGE = {
    "schema version": "UPDATE meta SET value = '99' WHERE key = 'schema_version'",
    "table dropped": "DROP TABLE envelopes",
    "summary not json": "UPDATE sessions SET summary = 'not json' WHERE id = 'bad'",
    "payload not msgpack": "UPDATE envelopes SET payload = x'fffe' "
    "WHERE session = 'bad' AND seq = (SELECT min(seq) FROM envelopes WHERE session = 'bad')",
    "payload not utf-8": "UPDATE envelopes SET payload = x'a2fffe' "
    "WHERE session = 'bad' AND seq = (SELECT min(seq) FROM envelopes WHERE session = 'bad')",
    "topic not utf-8": "UPDATE envelopes SET topic = CAST(x'fffe' AS TEXT) "
    "WHERE session = 'bad' AND seq = (SELECT min(seq) FROM envelopes WHERE session = 'bad')",
    "effect result not msgpack": "UPDATE effects SET result = x'c1' "
    "WHERE session = 'bad' AND seq = (SELECT min(seq) FROM effects WHERE session = 'bad')",
    "metrics not json": "INSERT INTO metrics VALUES ('bad', 999, 0, '{oops')",
}


def _damage(path: Path, kind: str, session: str = "bad") -> None:
    sql = DAMAGE[kind].replace("'bad'", f"'{session}'")
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(sql)
    conn.close()


COMMANDS = {
    "sessions list": ["sessions", "list"],
    "sessions list --json": ["sessions", "list", "--json"],
    "sessions show": ["sessions", "show", "bad"],
    "sessions show other": ["sessions", "show", "good"],
    "replay": ["replay", "bad", "--setup", TEAM],
    "replay other": ["replay", "good", "--setup", TEAM],
    "diff": ["diff", "good", "bad"],
    "dlq list": ["dlq", "list", "bad"],
    "dlq redrive": ["dlq", "redrive", "bad", "--setup", TEAM],
    "export": ["export", "bad"],
    "export other": ["export", "good"],
    "monitor": ["monitor", "bad", "--setup", TEAM],
    # Commands and options added after this file was first written: every command of
    # `pantheon --help` that takes --store is here, or in the what-if and run tests below.
    "replay --from": ["replay", "bad", "--setup", TEAM, "--from", "0.001"],
    "replay --json": ["replay", "bad", "--setup", TEAM, "--json"],
    "replay --live-effects": ["replay", "bad", "--setup", TEAM, "--live-effects"],
    "diff other way": ["diff", "bad", "good"],
    "dashboard": ["dashboard", "--port", "1"],
}
STORE_WIDE = ("schema version", "table dropped")
ROW_LEVEL = (
    "summary not json",
    "payload not msgpack",
    "payload not utf-8",
    "topic not utf-8",
    "effect result not msgpack",
    "metrics not json",
)
#: (command, row-level corruption) -> exit code, where it is not 2: the command does its
#: job, because the damage is in a part of the record it does not read (or in another
#: session). Monitor is only run where it must refuse (it would open the TUI otherwise).
STILL_WORKS = {
    **{(c, k): 0 for c in ("sessions list", "sessions list --json") for k in ROW_LEVEL},
    **{("sessions show other", k): 0 for k in ROW_LEVEL},
    **{("replay other", k): 0 for k in ROW_LEVEL},
    ("replay --from", "metrics not json"): 0,
    ("replay --json", "metrics not json"): 0,
    # Live effects answer differently from the record: a divergence, reported (exit 1).
    ("replay --live-effects", "metrics not json"): 1,
    ("diff other way", "metrics not json"): 0,
    **{("export other", k): 0 for k in ROW_LEVEL},
    # show reads counts, usage and the summary, not payloads or metrics.
    **{("sessions show", k): 0 for k in ROW_LEVEL if k != "summary not json"},
    # redrive does its job: the entry fails again, as it does in the sessions_team.
    ("dlq redrive", "metrics not json"): 1,
    ("dlq list", "summary not json"): 0,
    ("export", "summary not json"): 0,
    ("export", "metrics not json"): 0,
    ("dlq list", "metrics not json"): 0,
    ("replay", "metrics not json"): 0,
    ("diff", "metrics not json"): 0,
    # Neither lists nor exports an effect's result.
    ("dlq list", "effect result not msgpack"): 0,
    ("dlq redrive", "effect result not msgpack"): 1,
    ("export", "effect result not msgpack"): 0,
}
SKIP = {("monitor", k) for k in (*ROW_LEVEL, "table dropped") if k != "summary not json"}
# The dashboard checks the store before it serves; past that it would serve it (on a port).
SKIP |= {("dashboard", k) for k in ROW_LEVEL}
CASES = [
    (c, k)
    for k in (*STORE_WIDE, *ROW_LEVEL)
    for c in COMMANDS
    if (c, k) not in SKIP and not (k in STORE_WIDE and c.endswith(" other"))
]


@pytest.mark.parametrize(("command", "kind"), CASES)
def test_every_command_on_a_damaged_store(store: Path, command: str, kind: str) -> None:
    _damage(store, kind)
    result = CliRunner().invoke(app, [*COMMANDS[command], "--store", str(store)])
    out = result.output
    assert "Traceback" not in out
    expected = STILL_WORKS.get((command, kind), 2)
    assert result.exit_code == expected, out
    if expected == 2:
        assert isinstance(result.exception, SystemExit), result.exception
        lines = [line for line in out.splitlines() if line.strip()]
        assert len(lines) == 1, out
        assert lines[0].startswith("error: ") and str(store) in lines[0], out
        if kind not in STORE_WIDE:
            assert "'bad'" in lines[0] or " bad" in lines[0], out


@pytest.mark.parametrize("kind", ROW_LEVEL)
def test_sessions_list_marks_the_damaged_row_and_lists_the_others(store: Path, kind: str) -> None:
    _damage(store, kind)
    result = CliRunner().invoke(app, ["sessions", "list", "--json", "--store", str(store)])
    assert result.exit_code == 0, result.output
    import json

    rows = {r["id"]: r for r in json.loads(result.output)}
    assert rows["good"]["summary"] == {"emails": 5} and rows["good"]["corrupt"] is None
    if kind == "summary not json":
        assert rows["bad"]["corrupt"].startswith("its summary is not valid JSON")
        table = CliRunner().invoke(
            app, ["sessions", "list", "--store", str(store)], terminal_width=200
        )
        assert table.exit_code == 0
        bad = next(line for line in table.output.splitlines() if "bad" in line)
        assert "corrupt" in bad


def test_schema_version_lines(store: Path) -> None:
    _damage(store, "schema version")
    result = CliRunner().invoke(app, ["sessions", "list", "--store", str(store)])
    assert result.output.strip() == (
        f"error: session store {store} has schema version 99, but this Pantheon reads schema "
        f"version {SCHEMA_VERSION}; it was written by a newer Pantheon: upgrade pantheon to read it"
    )


@pytest.mark.parametrize("kind", STORE_WIDE)
def test_run_on_a_damaged_store(store: Path, kind: str) -> None:
    _damage(store, kind)
    result = CliRunner().invoke(app, ["run", SCENARIO, "--store", str(store)])
    assert "Traceback" not in result.output
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(store) in lines[0], (
        result.output
    )


def test_a_dropped_table_is_refused_at_open(store: Path) -> None:
    _damage(store, "table dropped")
    result = CliRunner().invoke(app, ["sessions", "list", "--store", str(store)])
    assert result.output.strip() == (
        f"error: {store} is a damaged session store: table envelopes is missing"
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A store with two real runs of a scenario: a what-if replay needs the scenario a
    session recorded, which the sessions above do not have. (store, good id, bad id)"""
    path = tmp_path_factory.mktemp("runs") / "runs.db"
    for _ in range(2):
        result = CliRunner().invoke(app, ["run", SCENARIO, "--store", str(path)])
        assert result.exit_code == 0, result.output
    with SessionStore(path) as st:
        bad, good = (s.id for s in st.sessions())  # newest first
    return path, good, bad


#: What-if (``replay --with``) and ``run`` on a store whose *other* session is damaged:
#: they do their job. Metrics are not read by a what-if replay.
WHATIF_STILL_WORKS = {("damaged", "metrics not json")} | {("other", k) for k in ROW_LEVEL}


@pytest.mark.parametrize(
    ("target", "kind"),
    [("damaged", k) for k in (*STORE_WIDE, *ROW_LEVEL)] + [("other", "payload not msgpack")],
)
def test_whatif_replay_on_a_damaged_store(
    runs: tuple[Path, str, str], tmp_path: Path, target: str, kind: str
) -> None:
    base, good, bad = runs
    store = tmp_path / "copy.db"
    shutil.copy(base, store)
    _damage(store, kind, bad)
    overlay = tmp_path / "changes.yaml"
    overlay.write_text("policy:\n  refund_limit: 100.0\n")
    session = bad if target == "damaged" else good
    result = CliRunner().invoke(
        app, ["replay", session, "--with", str(overlay), "--store", str(store)]
    )
    out = result.output
    assert "Traceback" not in out
    if (target, kind) in WHATIF_STILL_WORKS:
        assert result.exit_code == 0, out
        assert out.startswith(f"what-if replay of {session} with {overlay} recorded as "), out
        return
    assert result.exit_code == 2, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(store) in lines[0], out
    if kind not in STORE_WIDE:
        assert f"session '{bad}'" in lines[0], out


def test_run_records_beside_a_damaged_session(runs: tuple[Path, str, str], tmp_path: Path) -> None:
    # The store-wide damage is test_run_on_a_damaged_store's; a damaged row is another
    # session's business: the run records its own and passes.
    base, _, bad = runs
    store = tmp_path / "copy.db"
    shutil.copy(base, store)
    _damage(store, "payload not msgpack", bad)
    result = CliRunner().invoke(app, ["run", SCENARIO, "--store", str(store)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    with SessionStore(store) as st:
        assert len(st.sessions()) == 3


@pytest.mark.parametrize("kind", [*STORE_WIDE, "directory"])
def test_serve_on_a_damaged_store(store: Path, tmp_path: Path, kind: str) -> None:
    # `pantheon serve` (the gateway) checks the store before it listens: with a damaged one
    # it would otherwise serve until Ctrl-C and fail only when it records. A real process,
    # with a timeout, so a regression fails instead of serving forever.
    if kind == "directory":
        target = tmp_path / "adir"
        target.mkdir()
    else:
        _damage(store, kind)
        target = store
    command = ["serve", SCENARIO, "--store", str(target), "--port", "0"]
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", *command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    assert lines[0].startswith(f"{SCENARIO}: nothing ran: ") and str(target) in lines[0], out
