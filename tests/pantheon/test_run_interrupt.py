"""Ctrl-C of ``pantheon run``, on the on-call team, in one process and on three ZeroMQ
processes: the first SIGINT stops the input and lets the run finish what is in flight; the
session is recorded ``aborted`` with the signal in its summary, replays whole, and
``pantheon resume`` finishes the input. With the Observer placed on a node (ZeroMQ, NATS)
the driver relays the stop to it, and the run ends the same way. A second SIGINT
interrupts at once, still ``aborted``, without an error about the input. Real ``pantheon``
processes and a real SQLite store; the signal goes to the driver alone, as a terminal's
Ctrl-C does (a multi-process run's other processes have sessions of their own)."""

from __future__ import annotations

import collections
import json
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_run import pantheon as cli
from interrupting import run_and_interrupt
from oncall_asking import node_pids
from untimed import copy_untimed

from bus.backends.nats import NatsServer
from pantheon.sessions import SessionStore

COUNT = 200
ZMQ = (
    "transport:\n  kind: zmq\n  broker: tcp://127.0.0.1:0\n  nodes:\n"
    "    triage: [dedup, correlator, decider]\n    action: [guardian, actor]\n"
)


def scenario(tmp_path: Path, transport: str = "") -> str:
    """The on-call team's first 200 alerts at 50 a second (4 s of input)."""
    scenarios = copy_untimed(tmp_path)
    text = (scenarios / "oncall.yaml").read_text(encoding="utf-8")
    assert "  rate: 2000 " in text
    text = text.replace("  rate: 2000 ", f"  count: {COUNT}\n  rate: 50 ", 1)
    text = text.replace("\nagents:\n", f"\n{transport}\nagents:\n", 1)
    (scenarios / "paced.yaml").write_text(text, encoding="utf-8")
    return "scenarios/paced.yaml"


def acted(workdir: Path) -> int:
    """Tool calls the team's Actor made so far (its outbox files, whichever process it runs
    in): the run is under way. The store is no gauge: its rows reach their tables only
    when the run's loop is idle."""
    return sum(
        len(path.read_text(encoding="utf-8").splitlines())
        for path in (workdir / "outbox").glob("*.jsonl")
    )


def interrupt(
    tmp_path: Path, path: str, *, times: int, acts: int = 2
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run ``path`` and SIGINT it ``times`` times once its Actor has acted ``acts`` times;
    returns the finished process and its session."""
    done = run_and_interrupt(
        tmp_path, path, lambda: acted(tmp_path) >= acts, "the team's first actions", times=times
    )
    with sqlite3.connect(tmp_path / "s.db") as conn:
        (session,) = conn.execute("SELECT id FROM sessions WHERE kind = 'run'").fetchone()
    return done, str(session)


def status(tmp_path: Path, session: str) -> tuple[str, dict[str, Any]]:
    with sqlite3.connect(tmp_path / "s.db") as conn:
        state, summary = conn.execute(
            "SELECT status, summary FROM sessions WHERE id = ?", (session,)
        ).fetchone()
    return str(state), json.loads(summary or "{}")


#: A gateway beside the file input (``pantheon run``, not ``serve``): its first signal used
#: to close the gateway's http inputs only, and the file went on being read to its end.
GATEWAY = "gateway: {port: 0}\n"


@pytest.mark.parametrize("transport", ["", ZMQ, GATEWAY], ids=["inprocess", "zmq", "gateway"])
def test_ctrl_c_finishes_what_is_in_flight_and_leaves_a_session_resume_finishes(
    tmp_path: Path, transport: str
) -> None:
    proc, session = interrupt(tmp_path, scenario(tmp_path, transport), times=1)
    assert proc.returncode == 130, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["interrupted"] == "SIGINT" and summary["session_id"] == session
    assert f"pantheon resume {session} finishes it" in proc.stderr
    assert "input failed" not in proc.stderr
    # Stopped early, and every alert that went in was decided: nothing left in flight.
    inputs = summary["inputs"] + summary["malformed"]
    assert 2 <= inputs < COUNT
    assert summary["accuracy"]["scored"] + summary["accuracy"]["unlabelled"] == inputs
    assert summary["accounting_ok"] is True
    state, stored = status(tmp_path, session)
    assert (state, stored["interrupted"]) == ("aborted", "SIGINT")
    assert node_pids(session) == []

    # Its record is whole: the replay matches without calling anything, and does not call
    # it incomplete.
    replay = cli("replay", session, "--store", "s.db", cwd=tmp_path)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "matched" in replay.stdout and "incomplete" not in replay.stdout

    resumed = cli("resume", session, "--store", "s.db", "--json", cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    whole = json.loads(resumed.stdout)
    assert whole["inputs"] + whole["malformed"] == COUNT
    assert whole["resume"]["effects_served"] > 0


@pytest.mark.parametrize("transport", ["", ZMQ], ids=["inprocess", "zmq"])
def test_a_second_ctrl_c_interrupts_at_once_and_says_whether_the_session_resumes(
    tmp_path: Path, transport: str
) -> None:
    """In one process the session stays resumable, as after a crash; a ZeroMQ run's nodes
    were cut off with their records, so the message says resume cannot finish it (and
    resume refuses it), where it used to promise that it would."""
    # An Actor slow enough at first that the first Ctrl-C's finishing is still under way.
    path = scenario(tmp_path, transport)
    slow = "\nfaults:\n  agents:\n    actor: {latency_ms: 400, until: {messages: 20}}\n"
    (tmp_path / path).write_text((tmp_path / path).read_text() + slow)
    # At the first action: the input (4 s) goes on, and a slow Actor holds work in flight.
    proc, session = interrupt(tmp_path, path, times=2, acts=1)
    assert proc.returncode == 130 and proc.stdout == ""
    # The Observer's input ended because the bus closed under it: no error, no traceback.
    assert '"level": "error"' not in proc.stderr and "Traceback" not in proc.stderr
    state, stored = status(tmp_path, session)
    assert state == "aborted" and stored["error"].startswith("interrupted ("), stored
    replay = cli("replay", session, "--store", "s.db", cwd=tmp_path)
    assert "(aborted: interrupted at once (a second Ctrl-C) before the run finished)" in (
        replay.stdout
    ), replay.stdout
    resumed = cli("resume", session, "--store", "s.db", "--json", cwd=tmp_path, timeout=300)
    if transport:
        assert "a ZeroMQ run cut short cannot be resumed" in proc.stderr, proc.stderr
        assert f"pantheon replay {session} shows what it did" in proc.stderr, proc.stderr
        assert resumed.returncode == 2 and "is a ZeroMQ run" in resumed.stderr, resumed.stderr
        return
    # The command to type, with the session's id (it used to say SESSION).
    assert f"(pantheon resume {session} finishes it)" in proc.stderr, proc.stderr
    assert resumed.returncode == 0, resumed.stderr
    whole = json.loads(resumed.stdout)
    assert whole["inputs"] + whole["malformed"] == COUNT


#: The Observer on a node of its own with the triage agents: the driver reads no input.
OBSERVER_ON_A_NODE = (
    "  nodes:\n    triage: [observer, dedup, correlator, decider]\n    action: [guardian, actor]\n"
)


@pytest.fixture
def nats_url() -> Iterator[str]:
    """A ``nats-server -js`` of this test's own on a free loopback port (never the
    machine's), up for the resume too: it deletes the session's consumer groups there."""
    server = NatsServer().start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["zmq", "nats"])
def test_ctrl_c_reaches_an_observer_placed_on_a_node(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    # The driver hosts no Observer: only the relayed end_input can stop the input.
    if kind == "zmq":
        transport = "transport:\n  kind: zmq\n  broker: tcp://127.0.0.1:0\n"
    else:
        url = request.getfixturevalue("nats_url")
        transport = f"transport:\n  kind: nats\n  url: {url}\n"
    proc, session = interrupt(tmp_path, scenario(tmp_path, transport + OBSERVER_ON_A_NODE), times=1)
    assert proc.returncode == 130, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["interrupted"] == "SIGINT" and summary["session_id"] == session
    assert summary["nodes"]["triage"]["agents"][0] == "observer"
    assert "observer" not in summary["nodes"]["driver"]["agents"]
    assert "input stopped (at observer@triage)" in proc.stderr
    inputs = summary["inputs"] + summary["malformed"]
    assert 2 <= inputs < COUNT
    assert f"interrupted (SIGINT) after {inputs} inputs" in proc.stderr
    assert f"pantheon resume {session} finishes it" in proc.stderr
    assert "input failed" not in proc.stderr
    # What went in was decided, on whichever process: nothing left in flight.
    assert summary["accuracy"]["scored"] + summary["accuracy"]["unlabelled"] == inputs
    assert summary["accounting_ok"] is True
    assert all(n["status"] == "ok" for n in summary["nodes"].values()), summary["nodes"]
    state, stored = status(tmp_path, session)
    assert (state, stored["interrupted"]) == ("aborted", "SIGINT")
    assert node_pids(session) == []
    with SessionStore(tmp_path / "s.db") as store:
        journals = store.node_journals(session)
    assert {n: j.ended for n, j in journals.items()} == {"triage": True, "action": True}

    replay = cli("replay", session, "--store", "s.db", cwd=tmp_path)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "matched" in replay.stdout and "incomplete" not in replay.stdout
    assert f" {inputs} inputs " in replay.stdout, replay.stdout

    resumed = cli("resume", session, "--store", "s.db", "--json", cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    whole = json.loads(resumed.stdout)
    assert whole["inputs"] + whole["malformed"] == COUNT
    assert whole["resume"]["inputs_replayed"] == inputs
    assert whole["resume"]["effects_served"] > 0
    # Every alert decided once in the whole story (the interrupted part served, the rest
    # live), and no tool call made twice across the run's nodes and the resume.
    with SessionStore(tmp_path / "s.db") as store:
        envelopes = store.envelopes(whole["session_id"])
    decided = collections.Counter(
        e.payload["alert_id"] for e in envelopes if e.topic == "action.executed"
    )
    assert len(decided) == whole["inputs"] and set(decided.values()) == {1}
    calls = collections.Counter(
        (call["alert_id"], call["step"], call["tool"])
        for path in (tmp_path / "outbox").glob("*.jsonl")
        for call in map(json.loads, path.read_text(encoding="utf-8").splitlines())
    )
    assert [c for c, n in calls.items() if n > 1] == []
