"""``pantheon sessions | dlq | export | diff | replay`` through Typer's runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from sessions_team import CALLS, email, make_setup
from typer.testing import CliRunner

from bus import Bus
from pantheon import readmodel as rm
from pantheon.cli._cmd_sessions import register
from pantheon.sessions import Recorder, SessionStore

TEAM = str(Path(__file__).with_name("sessions_team.py")) + ":team_setup"


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


async def _record(path: Path, variant: str = "base") -> str:
    with SessionStore(path) as store:
        recorder = Recorder(store, scenario="emails", scenario_text=variant, seed=3)
        async with Bus() as bus:
            recorder.attach(bus)
            await make_setup(variant)(bus)
            for i in range(5):
                await bus.emit("email.received", email(i))
            await bus.drain()
        await recorder.finish("completed", {"emails": 5})
        return recorder.session_id


@pytest.fixture
async def recorded(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "sessions.db"
    return path, await _record(path)


def test_sessions_list_and_show(app: typer.Typer, runner: CliRunner, recorded) -> None:  # type: ignore[no-untyped-def]
    path, sid = recorded
    result = runner.invoke(app, ["sessions", "list", "--store", str(path), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["id"] == sid and row["status"] == "completed" and row["messages"] == 14

    result = runner.invoke(app, ["sessions", "list", "--store", str(path)])
    assert result.exit_code == 0 and sid in result.output and "completed" in result.output

    result = runner.invoke(app, ["sessions", "show", sid[:18], "--store", str(path), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["id"] == sid and shown["counts"]["envelopes"] == 14
    assert shown["dead_letters"][0]["error_type"] == "ValueError"

    result = runner.invoke(app, ["sessions", "show", sid, "--store", str(path)])
    assert result.exit_code == 0 and "1 dead letters" in result.output
    assert "models    no calls" in result.output


def test_show_has_the_sessions_model_usage(
    app: typer.Typer, runner: CliRunner, model_session: Any
) -> None:
    """Totals and per agent in text, the summary-shaped ``usage`` and every call in JSON,
    all the read model's (which is the run summary's)."""
    store, sid = str(model_session.store), model_session.session_id
    with SessionStore(model_session.store, create=False) as st:
        usage = rm.usage(st, sid)
    result = runner.invoke(app, ["sessions", "show", sid, "--store", store, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["usage"] == usage.as_dict() == model_session.summary["usage"]
    assert [c["seq"] for c in shown["model_calls"]] == [c.seq for c in usage.calls]
    assert shown["model_calls"][0]["cost_usd"] == usage.calls[0].cost_usd

    result = runner.invoke(app, ["sessions", "show", sid, "--store", store])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    t = usage.total
    assert (
        f"models    {t.calls} calls, tokens {t.input_tokens:,} in / "
        f"{t.output_tokens:,} out, cost {rm.usd(t.cost_usd)}"
    ) in lines
    for name, u in usage.by_agent.items():
        assert any(
            line.split() == [name, str(u.calls), "calls,", "tokens", f"{u.input_tokens:,}",
                             "in", "/", f"{u.output_tokens:,}", "out,", "cost",
                             rm.usd(u.cost_usd)]
            for line in lines
        ), (name, lines)  # fmt: skip


def test_show_prints_the_whole_summary_and_failed_expectations_as_lines(
    app: typer.Typer, runner: CliRunner, tmp_path: Path
) -> None:
    """Not a JSON blob cut at 2,000 characters: each failed expectation on a line with what
    was expected and measured, every other field whole; ``--json`` has it all as JSON."""
    path = tmp_path / "s.db"
    hops = {f"agent{i:03}": {"handled": i, "wait_p99_ms": 1.5} for i in range(60)}
    summary = {
        "scenario": "long",
        "expectations": [
            {"name": "dead letters failed <= 0", "passed": False, "expected": {"max": 0},
             "actual": 2},
            {"name": "zero lost", "passed": True, "expected": True, "actual": True},
            {"name": "accuracy >= 0.9", "passed": False, "expected": 0.9, "actual": 0.816},
        ],
        "hops": hops,
        "topics": {"observation.email.received": 591, "observation.email.malformed": 9},
    }  # fmt: skip
    with SessionStore(path) as store:
        sid = store.begin_session(scenario="long", seed=1)
        store.end_session(sid, "failed", summary)
    result = runner.invoke(app, ["sessions", "show", sid, "--store", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "summary   expectations: 1 passed, 2 failed" in lines
    assert '  FAIL dead letters failed <= 0: expected {"max": 0}, actual 2' in lines
    assert "  FAIL accuracy >= 0.9: expected 0.9, actual 0.816" in lines
    assert "  hops:" in lines
    assert '    agent059: {"handled": 59, "wait_p99_ms": 1.5}' in lines
    assert "    observation.email.malformed: 9" not in lines  # a flat mapping stays one line
    assert any(ln.startswith("  topics: {") and ln.endswith('"observation.email.received": 591}')
               for ln in lines)  # fmt: skip
    result = runner.invoke(app, ["sessions", "show", sid, "--store", str(path), "--json"])
    assert json.loads(result.output)["summary"] == summary


def test_errors_exit_2_with_a_message(app: typer.Typer, runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["sessions", "list", "--store", str(tmp_path / "none.db")])
    assert result.exit_code == 2 and "no session store" in result.output
    SessionStore(tmp_path / "s.db").close()
    result = runner.invoke(app, ["sessions", "show", "nope", "--store", str(tmp_path / "s.db")])
    assert result.exit_code == 2 and "no session 'nope'" in result.output


def test_store_from_the_environment(
    app: typer.Typer,
    runner: CliRunner,
    recorded,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    path, sid = recorded
    monkeypatch.setenv("PANTHEON_STORE", str(path))
    result = runner.invoke(app, ["sessions", "list", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)[0]["id"] == sid


def test_dlq_list_and_redrive(app: typer.Typer, runner: CliRunner, recorded) -> None:  # type: ignore[no-untyped-def]
    path, sid = recorded
    result = runner.invoke(app, ["dlq", "list", sid, "--store", str(path), "--json"])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.output)
    assert entry["subscriber"] == "actor" and entry["payload"] == {"n": 3, "label": "spam"}
    assert "Traceback" in entry["traceback"]

    # Without --json: what the help promises, the error, where it was raised and the
    # payload, one line each (the payload cut to the width).
    result = runner.invoke(app, ["dlq", "list", sid, "--store", str(path)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"dead letters of {sid}: 1",
        f"#{entry['entry_id']} actor on email.classified: failed after 1 attempt",
        "    ValueError: cannot act on message 3",
        "    raised at sessions_team.py:42 in act",
        '    payload {"n": 3, "label": "spam"}',
    ]

    # The recorded scenario text says "base": the team still fails, nothing is redriven,
    # and the command says so and exits 1.
    args = ["dlq", "redrive", sid, str(entry["entry_id"]), "--store", str(path)]
    result = runner.invoke(app, [*args, "--setup", TEAM, "--json"])
    assert result.exit_code == 1, result.output
    # stdout is the report; stderr named the redrive's session as it started.
    assert result.stderr.startswith(f"redriving 1 dead letter of {sid} as session ")
    report = json.loads(result.stdout)
    assert report["redriven"] == [] and report["failed"] == [entry["entry_id"]]
    assert report["outcome"] == "0 of 1 redriven, 1 failed again"
    result = runner.invoke(app, [*args, "--setup", TEAM])
    assert result.exit_code == 1 and "0 of 1 redriven, 1 failed again" in result.output

    fixed = str(Path(__file__).with_name("sessions_team.py")) + ":fixed_team"
    result = runner.invoke(app, [*args, "--setup", fixed])
    assert result.exit_code == 0, result.output
    assert "delivered" in result.output and "1 of 1 redriven, 0 failed again" in result.output
    with SessionStore(path) as store:
        assert store.dead_letters(sid)[0].redriven


def test_export_jsonl(app: typer.Typer, runner: CliRunner, recorded, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path, sid = recorded
    out = tmp_path / "out.jsonl"
    result = runner.invoke(
        app, ["export", sid, "--format", "jsonl", "-o", str(out), "--store", str(path)]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 14 and rows[0]["topic"] == "email.received"
    result = runner.invoke(app, ["export", sid, "--store", str(path)])
    assert result.exit_code == 0 and len(result.output.splitlines()) == 14
    result = runner.invoke(app, ["export", sid, "--format", "csv", "--store", str(path)])
    assert result.exit_code == 2


def test_replay_and_diff(  # type: ignore[no-untyped-def]
    app: typer.Typer, runner: CliRunner, recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Wide enough for the latency table's every column, whatever terminal runs the tests.
    monkeypatch.setenv("COLUMNS", "200")
    path, sid = recorded
    CALLS["classify"] = 0
    store_args = ["--store", str(path), "--setup", TEAM]
    result = runner.invoke(app, ["replay", sid, *store_args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["matched"] and report["failures"][0]["error_type"] == "ValueError"
    assert CALLS["classify"] == 0

    result = runner.invoke(app, ["replay", sid, *store_args])
    assert result.exit_code == 0 and "matched" in result.output
    assert "reproduced failure: actor" in result.output

    result = runner.invoke(app, ["replay", sid, *store_args, "--live-effects", "--json"])
    assert result.exit_code == 1  # the live clock changes the stamps
    assert CALLS["classify"] == 5

    changed = str(Path(__file__).with_name("sessions_team.py")) + ":changed_team"
    result = runner.invoke(app, ["replay", sid, "--store", str(path), "--setup", changed])
    assert result.exit_code == 1
    assert "diverged" in result.output and "classifier" in result.output
    assert "payload.label: 'ham' -> 'urgent'" in result.output
    with SessionStore(path) as store:
        replay_id = store.sessions()[0].id
    # Recorded "completed" (it ran to its end), listed as what it found.
    listed = runner.invoke(app, ["sessions", "list", "--store", str(path)])
    (row,) = [line for line in listed.output.splitlines() if replay_id in line]
    assert "diverged" in row and "completed" not in row, row

    result = runner.invoke(app, ["diff", sid, replay_id, "--store", str(path), "--json"])
    assert result.exit_code == 1
    diff = json.loads(result.output)
    assert diff["divergence"]["field"] == "payload" and diff["divergence"]["agent"] == "classifier"
    assert diff["timing_only"] is False and diff["timing_effects"] == []
    assert diff["divergence"]["message"].startswith("runs differ (payload) at A message")
    result = runner.invoke(app, ["diff", sid, replay_id, "--store", str(path)])
    assert result.exit_code == 1 and "runs diverged: runs differ (payload)" in result.output
    # A diff compares two runs: its wording names them A and B, never a "replay".
    for wording in ("replay diverged", "replay message", "first divergence", "expected"):
        assert wording not in result.output
    # Milliseconds, as `pantheon run` prints: the header says so and the cells agree.
    assert "per-hop latency (ms): p50 / p99" in result.output and "µs" not in result.output
    first = diff["latency"][0]
    row = next(ln for ln in result.output.splitlines() if first["name"] in ln)
    assert f"{first['a']['p99_us'] / 1000:.3f}" in row.split("│")[5]

    result = runner.invoke(
        app, ["replay", sid, "--store", str(path), "--setup", TEAM, "--from", "1000"]
    )
    assert result.exit_code == 0 and "5 skipped" in result.output


def test_replay_without_a_runtime_or_setup_says_so(
    app: typer.Typer,
    runner: CliRunner,
    recorded,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    path, sid = recorded
    result = runner.invoke(app, ["replay", sid, "--store", str(path), "--setup", "nomodule"])
    assert result.exit_code == 2 and "MODULE:FACTORY" in result.output
