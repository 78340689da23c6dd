"""Fault windows (``faults.agents.<name>.from/until``) and redrive outcomes, on real recorded
runs of ``scenarios/flaky_actor.yaml``: its fault is an incident that passes, so a redrive
of its dead letters gets through; the same fault without a window fails them again, and
``pantheon dlq redrive`` says so and exits 1."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from approval_run import WAIT, spawn, stop, wait_for
from typer.testing import CliRunner

from agents import Fault, FaultMark, input_ordinal
from pantheon.cli import app
from pantheon.scenario import ScenarioError, parse_scenario
from pantheon.sessions import SessionStore
from pantheon.sessions._codec import decode

ROOT = Path(__file__).resolve().parents[2]
FLAKY = ROOT / "scenarios" / "flaky_actor.yaml"
WINDOW = "until: {messages: 400}"


def _run(runner: CliRunner, scenario: Path, store: Path) -> str:
    result = runner.invoke(app, ["run", str(scenario), "--store", str(store)])
    assert result.exit_code == 0, result.output
    with SessionStore(store, create=False) as st:
        return st.sessions()[0].id


def _window_verdicts(store: Path, sid: str) -> list[bool]:
    with SessionStore(store, create=False) as st:
        return [decode(e.result) for e in st.effects(sid) if e.name == "fault.window"]


def test_flaky_actors_dead_letters_redrive_once_the_incident_is_over(tmp_path: Path) -> None:
    runner = CliRunner()
    store = tmp_path / "sessions.db"
    sid = _run(runner, FLAKY, store)
    with SessionStore(store, create=False) as st:
        letters = st.dead_letters(sid)
    assert letters, "the incident dead-letters some emails"
    # The verdicts are recorded, and the window is the first 400 emails in input order:
    # every dead letter comes from one of them.
    verdicts = _window_verdicts(store, sid)
    assert True in verdicts and False in verdicts
    with SessionStore(store, create=False) as st:
        envelopes = {e.id: e for e in st.envelopes(sid)}
    emails = [
        e.payload["id"] for e in envelopes.values() if e.topic == "observation.email.received"
    ]
    first = set(emails[:400])
    assert all(envelopes[d.envelope_id].payload["email_id"] in first for d in letters)

    result = runner.invoke(app, ["dlq", "redrive", sid, "--store", str(store)])
    assert result.exit_code == 0, result.output
    n = len(letters)
    assert f"{n} of {n} redriven, 0 failed again" in result.output
    with SessionStore(store, create=False) as st:
        assert all(d.redriven for d in st.dead_letters(sid))
        redrive = next(s for s in st.sessions() if s.kind == "redrive")
        assert redrive.summary["redrive"]["ok"] is True
    # The redrive continued the run's timeline: every verdict there is "outside the window".
    assert _window_verdicts(store, redrive.id) == [False] * n

    # The window verdicts are effects, so the run replays exactly.
    result = runner.invoke(app, ["replay", sid, "--store", str(store)])
    assert result.exit_code == 0, result.output
    # The replay fed every email under the number it had (a live verdict would agree).
    with SessionStore(store, create=False) as st:
        replay = next(s for s in st.sessions() if s.replay_of == sid and s.kind != "redrive")
        numbers = {
            session: [
                input_ordinal(e.id)
                for e in st.envelopes(session)
                if e.topic == "observation.email.received" and e.causation_id is None
            ]
            for session in (sid, replay.id)
        }
    assert numbers[sid] == numbers[replay.id] == list(range(len(emails)))


def test_a_redrive_that_fails_again_says_so_and_exits_1(tmp_path: Path) -> None:
    text = FLAKY.read_text(encoding="utf-8")
    assert WINDOW in text
    scenario = tmp_path / "flaky_forever.yaml"
    scenario.write_text(
        text.replace(", " + WINDOW, "").replace("path: data/", f"path: {FLAKY.parent}/data/"),
        encoding="utf-8",
    )
    runner = CliRunner()
    store = tmp_path / "sessions.db"
    sid = _run(runner, scenario, store)
    assert _window_verdicts(store, sid) == []  # no window: no verdict recorded, as before

    result = runner.invoke(app, ["dlq", "redrive", sid, "--store", str(store), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)  # stderr named the redrive's session
    m = report["attempted"]
    failed = len(report["failed"])
    assert m > 0 and failed > 0 and report["ok"] is False
    assert len(report["redriven"]) + failed == m
    assert report["outcome"] == f"{m - failed} of {m} redriven, {failed} failed again"

    result = runner.invoke(app, ["dlq", "redrive", sid, "--store", str(store)])
    assert result.exit_code == 1
    assert "failed again" in result.output


def test_fault_marks_bound_the_window() -> None:
    fault = Fault(0.5, start=FaultMark(messages=10), until=FaultMark(seconds=2.0))
    assert not fault.applies(0.0, 9)
    assert fault.applies(1.9, 10)
    assert not fault.applies(2.0, 11)
    assert Fault(0.5).applies(1e9, 10**9) and not Fault(0.5).windowed
    with pytest.raises(ValueError, match="exactly one"):
        FaultMark(seconds=1.0, messages=1)


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ("until: {seconds: 1, messages: 2}", "exactly one"),
        ("until: {}", "exactly one"),
        ("from: {messages: 5}, until: {messages: 5}", "must come before"),
        ("until: {minutes: 1}", "minutes"),
    ],
)
def test_scenario_fault_windows_are_checked(window: str, message: str) -> None:
    text = FLAKY.read_text(encoding="utf-8").replace(WINDOW, window)
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(text, base_dir=FLAKY.parent)


def test_scenario_fault_window_reaches_the_agent() -> None:
    scenario = parse_scenario(FLAKY.read_text(encoding="utf-8"), base_dir=FLAKY.parent)
    fault = scenario.faults.agents["actor"]
    assert fault.from_ is None and fault.until is not None and fault.until.messages == 400


def test_a_resumed_run_numbers_its_inputs_on_from_the_recorded_ones(tmp_path: Path) -> None:
    """A run SIGKILLed mid-input, then ``pantheon resume``: the recorded inputs are fed
    again under their numbers and the Observer goes on from there, so every input of the
    resumed session has the number it would have had in one uninterrupted run (a
    ``messages`` window splits them the same way)."""
    (tmp_path / "slow_mod.py").write_text("async def route(env, agent):\n    pass\n")
    (tmp_path / "tickets.jsonl").write_text(
        "".join(json.dumps({"id": f"t{i}"}) + "\n" for i in range(20)), encoding="utf-8"
    )
    (tmp_path / "slow.yaml").write_text(
        "version: 1\nname: slow\n"
        "input: {kind: jsonl, path: tickets.jsonl, topic: ticket.new, rate: 10}\n"
        'agents:\n  router: {handler: "slow_mod:route", subscribe: [ticket.new]}\n',
        encoding="utf-8",
    )
    store = tmp_path / "s.db"
    run = spawn("run", "slow.yaml", store=store, cwd=tmp_path)

    def numbers(session: str | None = None) -> list[int | None]:
        if not store.exists():
            return []
        with SessionStore(store, create=False) as st:
            sessions = st.sessions()
            if not sessions:
                return []
            sid = session or sessions[0].id  # the newest
            return [input_ordinal(e.id) for e in st.envelopes(sid) if e.topic == "ticket.new"]

    try:
        wait_for("some inputs in the recording", lambda: len(numbers()) >= 3, run)
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=WAIT)
    finally:
        stop(run)
    with SessionStore(store) as st:  # opening the store finds the process gone
        (original,) = st.sessions()
    recorded = numbers(original.id)
    assert 3 <= len(recorded) < 20 and recorded == list(range(len(recorded)))
    resumed = spawn("resume", original.id, store=store, cwd=tmp_path)
    try:
        out, err = resumed.communicate(timeout=WAIT)
    finally:
        stop(resumed)
    assert resumed.returncode == 0, err
    assert numbers(json.loads(out)["session_id"]) == list(range(20))
