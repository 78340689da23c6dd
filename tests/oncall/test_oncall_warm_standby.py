"""The on-call team on NATS with a warm standby of its stateful triage (Dedup, Correlator,
Decider) in a process of its own: real node processes and a throwaway ``nats-server -js``.

A hot standby shares the work from the start, so a stateful agent runs as two instances and
the team decides otherwise (accuracy 0.80 against 0.95 in a run here). A warm one pulls
nothing while its node lives: the run decides as the in-process team does, and replays in
one process. When the node is SIGKILLed, the standby takes over, one instance at a time."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from cli_run import pantheon as cli
from untimed import copy_untimed

TRIAGE = ("dedup", "correlator", "decider")
NODES_ENDED = "every node ran to the end (or was killed by the scenario)"
DEAD_LETTERS = "dead letters other than shed <= 0"


def scenario(scenarios: Path, name: str, *, rate: int, liveness: int, faults: str = "") -> str:
    """The on-call scenario's first 400 alerts on NATS: triage and action nodes, a warm
    standby of the triage on ``spare``, which takes over once the triage node is silent
    for ``liveness`` seconds (a heartbeat a second). A loaded machine can starve a live
    node that long: the default 3 s is the product's, the tests give more."""
    text = (scenarios / "oncall.yaml").read_text(encoding="utf-8")
    assert "  rate: 2000 " in text and "\nagents:\n" in text
    transport = (
        f"transport:\n  kind: nats\n  server: auto\n  ack_wait: 2\n  liveness: {liveness}\n"
        "  nodes:\n"
        f"    triage: [{', '.join(TRIAGE)}]\n    action: [guardian, actor]\n"
        f"  standby:\n    spare: [{', '.join(TRIAGE)}]\n  standby_mode: warm\n"
    )
    text = text.replace("  rate: 2000 ", f"  count: 400\n  rate: {rate} ", 1)
    text = text.replace("\nagents:\n", f"\n{transport}\nagents:\n", 1)
    (scenarios / f"{name}.yaml").write_text(text + faults, encoding="utf-8")
    return f"scenarios/{name}.yaml"


def run(tmp_path: Path, path: str, *, judged: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The run's summary, with every expectation passed (or those named ``judged``)."""
    proc = cli("run", path, "--json", "--store", "s.db", cwd=tmp_path, timeout=300)
    summary: dict[str, Any] = json.loads(proc.stdout)
    failed = [e["name"] for e in summary["expectations"] if e["state"] == "failed"]
    assert proc.returncode == (1 if failed else 0), proc.stderr[-3000:]
    assert [f for f in failed if judged is None or f in judged] == [], proc.stderr[-3000:]
    return summary


def handled(tmp_path: Path, session: str) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(node, subscriber) -> (deliveries, first start, last end) in the session's record."""
    with sqlite3.connect(tmp_path / "s.db") as db:
        rows = db.execute(
            "SELECT node, subscriber, count(*), min(started_ns), max(ended_ns) FROM deliveries"
            " WHERE session = ? GROUP BY node, subscriber",
            (session,),
        ).fetchall()
    return {(node, sub): (n, first, last) for node, sub, n, first, last in rows}


def test_a_warm_standby_leaves_the_team_deciding_as_one_process_and_replaying(
    tmp_path: Path,
) -> None:
    scenarios = copy_untimed(tmp_path)
    text = (scenarios / "oncall.yaml").read_text(encoding="utf-8")
    (scenarios / "alone.yaml").write_text(
        text.replace("  rate: 2000 ", "  count: 400\n  rate: 2000 ")
    )
    reference = cli("run", "scenarios/alone.yaml", "--json", "--store", "ref.db", cwd=tmp_path)
    expected = json.loads(reference.stdout)["accuracy"]

    summary = run(tmp_path, scenario(scenarios, "warm", rate=2000, liveness=10), judged=())
    work = handled(tmp_path, summary["session_id"])
    # The standby took no share: every triage delivery was the triage node's.
    assert [key for key in work if key[0] == "spare"] == [], work
    assert all(work[("triage", agent)][0] > 0 for agent in TRIAGE)
    assert summary["accuracy"] == expected
    assert [e["name"] for e in summary["expectations"] if e["state"] == "failed"] == []

    proc = cli("replay", summary["session_id"], "--store", "s.db", "--json", cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert (proc.returncode, report["matched"], report["effects_called"]) == (0, True, 0)


def test_a_warm_standby_takes_over_a_killed_node_one_instance_at_a_time(tmp_path: Path) -> None:
    kill = "\nfaults:\n  kill_node: {node: triage, at: 1.0}\n"
    path = scenario(copy_untimed(tmp_path), "warm_kill", rate=200, liveness=5, faults=kill)
    # The standby's instances start with fresh state about halfway through the alerts, so
    # some after the takeover are decided otherwise (accuracy 0.927 and a few more false
    # pages here, against 0.952 without a kill): the team's own checks are not judged.
    summary = run(tmp_path, path, judged=("zero lost", NODES_ENDED, DEAD_LETTERS))
    assert summary["nodes"]["triage"]["status"] == "killed"
    stream = summary["stream"]
    assert stream["taken_over"] == {agent: ["spare"] for agent in sorted(TRIAGE)}
    assert (stream["no_live_member"], stream["items"]) == ([], [])
    (lost,) = [e for e in summary["expectations"] if e["name"] == "zero lost"]
    assert lost["state"] == "passed"
    # Every labelled alert was scored, each once: none lost with the node, none twice.
    assert summary["accuracy"]["scored"] + summary["accuracy"]["unlabelled"] == 400
    work = handled(tmp_path, summary["session_id"])
    for agent in TRIAGE:
        before, after = work[("triage", agent)], work[("spare", agent)]
        assert before[0] > 0 and after[0] > 0
        # The standby began after the last handling the dead node recorded: never two at once.
        assert after[1] > before[2], agent
