"""``pantheon run`` of ZeroMQ scenarios: a broker and real node processes on loopback.

Each test runs the real command in a subprocess, which starts the broker and one process per
node, as a user's run does."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cli_run import pantheon
from decisions import moved_by_timing, outcomes
from rich.console import Console
from untimed import copy_untimed

from pantheon.cli._summary_text import print_nodes
from pantheon.sessions import SessionStore

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The scenarios without their timing bounds: a run's verdict here is about what it did
    on several processes, never about how fast a loaded machine let it go."""
    copy_untimed(tmp_path)
    return tmp_path


def run_json(workdir: Path, scenario: str, *extra: str) -> tuple[int, dict[str, Any]]:
    proc = pantheon("run", scenario, "--json", "--store", "s.db", *extra, cwd=workdir)
    assert proc.stdout.strip(), f"exit {proc.returncode}, no summary; stderr: {proc.stderr}"
    summary = json.loads(proc.stdout)
    assert proc.returncode == (0 if summary["passed"] else 1), proc.stderr
    return proc.returncode, summary


def test_three_nodes_decide_every_email_as_in_process(workdir: Path) -> None:
    code_alone, alone = run_json(workdir, "scenarios/support_email.yaml")
    code_three, three = run_json(workdir, "scenarios/support_email_3node.yaml")
    assert (code_alone, code_three) == (0, 0)

    # Same decision and action per email id, same seed: only the transport differed, except
    # where an answer depends on timing, which the diff must say for each.
    moved = moved_by_timing(workdir, "s.db", alone["session_id"], three["session_id"])
    for key in ("inputs", "malformed", "seed") + (
        () if moved else ("decisions", "outbox", "accuracy")
    ):
        assert three[key] == alone[key], key

    # Per-topic counts too: a message is counted once, however many processes it reached
    # (the Monitor's sampled alerts depend on timing, not on the transport).
    def team_topics(s: dict[str, Any]) -> dict[str, int]:
        return {t: n for t, n in s["topics"].items() if not t.startswith(("monitor.", "system."))}

    def unmoved(topics: dict[str, int]) -> dict[str, int]:
        """A moved decision also moves what the Learner publishes of it."""
        return {t: n for t, n in topics.items() if not (moved and t.startswith("learner."))}

    assert unmoved(team_topics(three)) == unmoved(team_topics(alone))
    assert three["topics"]["observation.email.received"] == 591

    # Nothing lost on any bus, and every expectation holds (the latency bounds were taken
    # out: they are the machine's business, and say nothing about correctness).
    assert three["accounting_ok"] is True
    assert [(e["name"], e["passed"]) for e in three["expectations"]] == [
        ("zero lost", True),
        ("dead letters other than shed <= 10", True),
        ("accuracy >= 0.7", True),
        ("every node ran to the end (or was killed by the scenario)", True),
    ]

    nodes = three["nodes"]
    assert set(nodes) == {"driver", "perception", "cognition", "action"}
    assert all(n["status"] == "ok" and n["exit_code"] in (0, None) for n in nodes.values())
    assert nodes["cognition"]["agents"] == ["reasoner", "memory", "planner"]
    assert len({n["pid"] for n in nodes.values()}) == 4
    # The hops of agents on other processes are in the summary.
    assert {"sensor", "reasoner", "guardian", "actor", "learner"} <= set(three["hops"])
    # Each node's Actor outbox is its own file beside the store.
    outbox = workdir / "outbox" / f"{three['session_id']}.action.jsonl"
    assert len(outbox.read_text().splitlines()) == sum(three["outbox"].values())

    # Every node shipped its part of the record, ended cleanly, and tagged its hops: the
    # session replays in this one process with every effect served from the record.
    with SessionStore(workdir / "s.db") as store:
        journals = store.node_journals(three["session_id"])
        assert set(journals) == {"perception", "cognition", "action"}
        assert all(j.ended and j.records > 0 for j in journals.values())
        where = {(d.subscriber, d.node) for d in store.deliveries(three["session_id"])}
        envelopes = store.envelopes(three["session_id"])
    assert {("sensor", "perception"), ("reasoner", "cognition"), ("actor", "action")} <= where
    assert ("learner", None) in where  # the driver's own hops
    # Each message once, however many processes it reached.
    assert len({e.id for e in envelopes}) == len(envelopes)
    proc = pantheon("replay", three["session_id"], "--store", "s.db", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["matched"] is True
    assert report["effects_called"] == 0 and report["effects_served"] > 0

    # A what-if on the 3-node session changes the same emails the same way as on the
    # in-process one: both re-run in one process from their records.
    (workdir / "limit.yaml").write_text("policy:\n  refund_limit: 50.0\n")

    def whatif(session: str) -> list[tuple[str, str, str]]:
        proc = pantheon("replay", session, "--with", "limit.yaml", "--store", "s.db", "--json",
                        cwd=workdir)  # fmt: skip
        report = json.loads(proc.stdout)
        assert report["effects_called"] < report["effects_served"]
        return [(c["item"], c["before"], c["after"]) for c in report["decisions"]["changes"]]

    changed = whatif(three["session_id"])
    assert [c for c in changed if c[0] not in moved] == [
        c for c in whatif(alone["session_id"]) if c[0] not in moved
    ]
    assert len(changed) > 10 and {(b, a) for _, b, a in changed} == {("reply", "escalate")}


KILL = """
faults:
  agents:
    reasoner: {latency_ms: 5}
  kill_node: {node: work2, at: 0.15}
"""


def test_sigkilled_node_loses_nothing(workdir: Path) -> None:
    path = workdir / "scenarios" / "kill.yaml"
    text = (workdir / "scenarios" / "support_email_3node.yaml").read_text()
    placement = """  nodes:
    perception: [sensor, monitor]
    cognition: [reasoner, memory, planner]
    action: [guardian, actor]
"""
    assert placement in text
    # Heartbeats every 0.2 s, but a node is lost only after 2 s of silence: on a loaded
    # machine a live node's loop can stall past 0.6 s (liveness 3), and the broker then
    # counted two nodes lost. The SIGKILLed one is still found 2 s after its kill.
    text = text.replace(
        placement,
        """  heartbeat: 0.2
  liveness: 10
  nodes:
    keep: [sensor, memory, planner, monitor, guardian, actor]
    work1: [reasoner]
    work2: [reasoner]
""",
    ).replace("name: support_email_3node", "name: kill_one")
    text = text.replace("  rate: 1000 ", "  count: 300\n  rate: 1000 ")
    path.write_text(text + KILL)

    _, summary = run_json(workdir, "scenarios/kill.yaml")
    nodes = summary["nodes"]
    assert nodes["work2"]["status"] == "killed"
    assert nodes["work2"]["killed_at_s"] is not None
    assert nodes["work1"]["status"] == nodes["keep"]["status"] == "ok"

    # published = delivered + dead-lettered (+ shed) on every surviving bus, nothing still
    # outstanding or in flight: what was in flight to the dead node was redelivered to
    # work1 or dead-lettered as node_lost, never dropped.
    assert summary["accounting_ok"] is True
    assert list(summary["unverified"]) == ["work2"]
    broker = nodes["driver"]["broker"]
    assert broker["nodes_lost"] == 1
    links = nodes["driver"]["links"]
    lost = summary["dlq"].get("node_lost", 0)
    assert links["node_lost"] == lost
    assert links["redelivered"] + lost > 0, links

    # Every well-formed email either reached the end (action.executed crossed to the
    # driver's Learner) or is in a dead-letter queue by id. Each hop is at-least-once:
    # here every hop out of work2 crosses the wire, sent before the DONE that settles its
    # cause. (Work a killed node had settled but still held in its own mailboxes, a chain
    # of agents inside one node, dies with it: docs/design.md.)
    done = outcomes(workdir / "s.db", summary["session_id"])
    dead = {d["email_id"] for d in summary["dead_letters"]}
    assert summary["inputs"] == 300 - summary["malformed"]
    with SessionStore(workdir / "s.db") as s:
        ids = {
            e.payload["id"]
            for e in s.envelopes(summary["session_id"])
            if e.topic == "observation.email.received"
        }
    assert len(ids) == summary["inputs"]
    assert ids <= set(done) | dead
    # The session says whose records end where: the survivors' journals are whole, the
    # killed node's stops before its end mark. Replay in this one process reproduces the
    # run up to there: every input but the ones work2 was in the middle of (those are not
    # replayed, and counted as skipped) matches hop for hop, with no effect called.
    with SessionStore(workdir / "s.db") as s:
        journals = s.node_journals(summary["session_id"])
    # work2's journal stops before its end mark; on a loaded machine the kill can come
    # before its first shipment, and then it has none at all.
    assert {n: j.ended for n, j in journals.items() if n != "work2"} == {
        "keep": True,
        "work1": True,
    }
    assert "work2" not in journals or journals["work2"].ended is False
    proc = pantheon("replay", summary["session_id"], "--store", "s.db", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    replay = json.loads(proc.stdout)
    assert replay["matched"] is True and replay["effects_called"] == 0
    assert list(replay["cut"]) == ["work2"]
    if "work2" in journals:
        assert f"after {journals['work2'].records} in" in replay["cut"]["work2"]
    else:
        assert replay["cut"]["work2"] == "shipped no records"
    assert replay["inputs_skipped"] == replay["cut_inputs"] < replay["inputs_replayed"]
    assert replay["inputs_replayed"] + replay["inputs_skipped"] == 300

    # The human summary says which node was killed, and when.
    console = Console(record=True, width=200)
    print_nodes(console, SimpleNamespace(nodes=nodes))
    text = console.export_text()
    assert f"node work2 (pid {nodes['work2']['pid']}): killed (SIGKILL) at " in text
    assert f"publishers redelivered {links['redelivered']}, dead-lettered node_lost {lost}" in text


def test_zero_lost_does_not_pass_on_a_killed_nodes_silence(workdir: Path) -> None:
    # The case: the Reasoner on "cognition" hands reasoning.intent.classified to the
    # Planner beside it, a message no other process ever sees. SIGKILLed mid-run, the node
    # takes that chain with it (2 of 591 emails vanished with seed 2) and its report, so
    # the survivors' books balancing says nothing about it: "zero lost" must not PASS.
    path = workdir / "scenarios" / "kill_cognition.yaml"
    text = (workdir / "scenarios" / "support_email_3node.yaml").read_text()
    assert "\nexpect:\n  zero_lost: true\n" in text
    path.write_text(text + "\nfaults:\n  kill_node: {node: cognition, at: 0.3}\n")

    code, summary = run_json(workdir, "scenarios/kill_cognition.yaml", "--seed", "2")
    assert code == 1
    assert summary["nodes"]["cognition"]["status"] == "killed"
    (check,) = [e for e in summary["expectations"] if e["name"] == "zero lost"]
    assert check["passed"] is False
    # The survivors' own books still balance: that part is checked and true.
    assert summary["accounting_ok"] is True
    settled = summary["unverified"]["cognition"]
    assert list(summary["unverified"]) == ["cognition"]
    # Every sensor.email.enriched the perception node sent there and saw settled is in it.
    assert settled >= summary["hops"]["sensor"]["handled"] - summary["dlq"]["node_lost"]
    assert check["actual"] == (
        f"unknown: node 'cognition' ended without its accounting after settling {settled:,} "
        "messages"
    )

    # The human summary says the same, and never "PASS zero lost".
    proc = pantheon(
        "run", "scenarios/kill_cognition.yaml", "--seed", "2", "--store", "s.db", cwd=workdir
    )
    assert proc.returncode == 1, proc.stderr
    assert "PASS zero lost" not in proc.stdout
    assert "FAIL zero lost (actual unknown: node 'cognition' ended without" in proc.stdout
    assert "accounting ok on the processes that reported (not on 'cognition')" in proc.stdout


def test_observer_on_a_node_publishes_the_inputs_there(workdir: Path) -> None:
    path = workdir / "scenarios" / "support_email_3node.yaml"
    text = path.read_text()
    assert "perception: [sensor, monitor]" in text
    path.write_text(text.replace("perception: [sensor, monitor]", "perception: [observer, sensor]"))

    code, summary = run_json(workdir, "scenarios/support_email_3node.yaml")
    assert code == 0, summary["expectations"]
    # The driver waited for the node's Observer to finish before looking for quiet.
    assert (summary["inputs"], summary["malformed"]) == (591, 9)
    assert summary["accounting_ok"] is True
    assert summary["accuracy"]["scored"] == 598  # as in-process: 2 records carry no label
    assert summary["nodes"]["driver"]["agents"] == ["monitor", "learner"]
    assert summary["nodes"]["perception"]["agents"] == ["observer", "sensor"]
