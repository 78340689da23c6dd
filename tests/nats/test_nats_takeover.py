"""NATS takeover under ``pantheon run``: SIGKILL of a node mid-run (``faults.kill_node``) with a
standby member of its agents elsewhere, and without one. Real node processes, a throwaway
``nats-server -js`` (``server: auto``) on loopback, the session recorded in a real SQLite
file; each run ends by itself (``run`` has no deadline of its own here but the test's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cli_run import pantheon
from rich.console import Console
from untimed import copy_untimed

from pantheon import readmodel
from pantheon.cli._summary_text import print_stream
from pantheon.sessions import SessionStore

PLACEMENT = (
    "  nodes:\n    perception: [sensor, monitor]\n"
    "    cognition: [reasoner, memory, planner]\n    action: [guardian, actor]\n"
)


# An agent on the driver (which no test kills) writing down every outcome it receives: the
# team's own view of "decided", whatever the record keeps of a process that died.
TALLY = """
from agents import Agent, AgentSettings
from bus import Envelope


class Tally(Agent):
    subscriptions = ("action.executed",)

    class Settings(AgentSettings):
        path: str

    async def handle(self, env: Envelope) -> None:
        with open(self.settings.path, "a", encoding="utf-8") as out:
            out.write(env.payload["email_id"] + "\\n")
"""


def scenario(workdir: Path, name: str, transport: str, faults: str, count: int) -> str:
    """The NATS support scenario with ``transport`` lines in place of its placement, the
    first ``count`` emails, ``faults``, and a tally of outcomes on the driver (written to
    ``<workdir>/<name>.tally``); returns its path relative to ``workdir``."""
    path = workdir / "scenarios" / "support_email_nats.yaml"
    text = path.read_text()
    assert PLACEMENT in text and "  rate: 1000 " in text
    agents = text.index("\n", text.index("\nagents:") + 1) + 1
    tally = f"  tally:\n    class: takeover_tally:Tally\n    settings: {{path: {name}.tally}}\n"
    text = (
        (text[:agents] + tally + text[agents:])
        .replace(PLACEMENT, transport)
        .replace("name: support_email_nats", f"name: {name}")
        .replace("  rate: 1000 ", f"  count: {count}\n  rate: 200 ")
    )
    (workdir / "scenarios" / "takeover_tally.py").write_text(TALLY)
    (workdir / "scenarios" / f"{name}.yaml").write_text(text + faults)
    return f"scenarios/{name}.yaml"


def run_json(workdir: Path, path: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", path, "--json", "--store", "s.db"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"COLUMNS": "250"},
    )
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def recorded(workdir: Path, session: str, name: str) -> tuple[list[str], Counter[str]]:
    """The valid emails the driver published (in order, from the session store), and how
    many ``action.executed`` (the team's outcome) each got, from the driver's tally."""
    with SessionStore(workdir / "s.db") as s:
        envelopes = s.envelopes(s.resolve(session))
    inputs = [e.payload["id"] for e in envelopes if e.topic == "observation.email.received"]
    tally = workdir / f"{name}.tally"
    actions = Counter(tally.read_text().split() if tally.exists() else ())
    return inputs, actions


def zero_lost(summary: dict[str, Any]) -> dict[str, Any]:
    (check,) = [e for e in summary["expectations"] if e["name"] == "zero lost"]
    return check


@pytest.mark.parametrize(
    ("standby", "killed", "slow", "agents", "host"),
    [
        # A chain inside one process (reasoner -> planner, with memory asked on the way):
        # a slow Planner has a backlog of the Reasoner's output when the node dies.
        ("    spare: [reasoner, memory, planner]\n", "cognition", ("planner", 30),
         ["reasoner", "memory", "planner"], "spare"),
        # The driver hosts a standby of every agent; the last hop of the chain dies.
        ("driver\n", "action", ("actor", 200), ["guardian", "actor"], "driver"),
        # ... or the first (the Sensor handles one email at a time).
        ("driver\n", "perception", ("sensor", 20), ["sensor", "monitor"], "driver"),
    ],
    ids=["named-standby", "driver-standby-action", "driver-standby-perception"],
)  # fmt: skip
def test_a_standby_takes_over_a_killed_node_and_every_email_is_decided_once(
    tmp_path: Path,
    standby: str,
    killed: str,
    slow: tuple[str, int],
    agents: list[str],
    host: str,
) -> None:
    """A node is SIGKILLed mid-run while a standby of each of its agents runs elsewhere.
    What it held comes back to the standby after ``ack_wait``, what it had published is
    not handled twice, and the run says zero lost although the node never gave its
    accounting."""
    copy_untimed(tmp_path)
    path = scenario(
        tmp_path,
        "takeover",
        PLACEMENT.replace("  nodes:", "  ack_wait: 2\n  nodes:")
        + "  standby:"
        + (" " if standby == "driver\n" else "\n")
        + standby,
        # A slow agent on the node that dies: it holds several emails when it dies,
        # whenever the kill lands in the input.
        f"\nfaults:\n  agents:\n    {slow[0]}: {{latency_ms: {slow[1]}}}\n"
        f"  kill_node: {{node: {killed}, at: 0.4}}\n",
        count=120,
    )
    code, summary = run_json(tmp_path, path)

    nodes = summary["nodes"]
    assert nodes[killed]["status"] == "killed"
    assert {n: d["status"] for n, d in nodes.items() if n != killed} == dict.fromkeys(
        set(nodes) - {killed}, "ok"
    )
    assert set(agents) <= set(nodes[host]["agents"])
    # The standby got what the killed node held: messages delivered a second time.
    assert nodes[host]["transport"]["redelivered"] > 0
    stream = summary["stream"]
    assert stream["killed"] == [killed]
    assert stream["taken_over"] == {agent: [host] for agent in agents}
    assert stream["no_live_member"] == [] and stream["items"] == []
    assert zero_lost(summary)["passed"] is True
    assert code == 0 and summary["passed"] is True, summary["expectations"]

    inputs, actions = recorded(tmp_path, summary["session_id"], "takeover")
    assert len(inputs) == summary["inputs"] == 120 - summary["malformed"]
    # Every email decided, and exactly once: no loss, no duplicate outcome.
    assert actions == Counter(inputs)
    assert summary["dlq"] == {}

    # The record, as for a killed ZeroMQ node (tests/cluster/test_cluster_run.py): every
    # process that lived, a standby's own included, stored its journal to its end, the
    # killed one's stops short, and the session replays in one process up to there.
    with SessionStore(tmp_path / "s.db") as s:
        journals = s.node_journals(summary["session_id"])
    assert {n: j.ended for n, j in journals.items() if n != killed} == dict.fromkeys(
        set(nodes) - {"driver", killed}, True
    )
    assert killed not in journals or journals[killed].ended is False
    if host == "driver":
        # The driver records itself, standbys and all; a replay of these runs would wait
        # out the slow agent's latency again (10 s more for the Actor's).
        return
    proc = pantheon("replay", summary["session_id"], "--store", "s.db", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    replay = json.loads(proc.stdout)
    assert replay["matched"] is True and replay["effects_called"] == 0
    assert list(replay["cut"]) == [killed]


def test_without_a_standby_the_summary_names_the_emails_waiting_in_the_stream(
    tmp_path: Path,
) -> None:
    """The Reasoner alone on ``think``, SIGKILLed mid-run, no standby: the run still ends
    (the driver stops waiting for a group nobody is left to serve), fails zero lost, and
    names exactly the emails that never got past the Reasoner: the ones waiting in the
    stream for it."""
    copy_untimed(tmp_path)
    path = scenario(
        tmp_path,
        "orphan",
        "  ack_wait: 2\n  nodes:\n"
        "    keep: [sensor, monitor, memory, planner, guardian, actor]\n"
        "    think: [reasoner]\n",
        "\nfaults:\n  agents:\n    reasoner: {latency_ms: 200}\n"
        "  kill_node: {node: think, at: 0.4}\n",
        count=60,
    )
    code, summary = run_json(tmp_path, path)

    assert summary["nodes"]["think"]["status"] == "killed"
    inputs, actions = recorded(tmp_path, summary["session_id"], "orphan")
    assert len(inputs) == summary["inputs"] == 60 - summary["malformed"]
    assert max(actions.values()) == 1
    never = sorted(set(inputs) - set(actions))
    assert never  # the kill left work behind
    stream = summary["stream"]
    assert stream["no_live_member"] == ["reasoner"] and stream["taken_over"] == {}
    assert stream["complete"] is True
    assert stream["items"] == stream["waiting"]["reasoner"] == never
    assert stream["handed_over"] == {}  # the Reasoner's input came from other processes
    check = zero_lost(summary)
    assert check["passed"] is False
    assert check["actual"].startswith(f"{len(never):,} items wait in the stream for reasoner")
    assert check["actual"].endswith(", ".join(never))
    assert code == 1 and summary["passed"] is False

    # The printed summary says the same (what `pantheon run` without --json shows).
    out = Console(record=True, width=250)
    print_stream(out, SimpleNamespace(stream=stream))
    text = out.export_text()
    assert "takeover after think: none" in text
    assert (
        f"no live member of reasoner: {stream['messages']:,} messages of {len(never):,} items"
        in text
    )
    assert f"  reasoner: {', '.join(never)}" in text


ONCALL_STANDBY = """
transport:
  kind: nats
  server: auto
  nodes:
    triage: [dedup, correlator, decider]
    act: [guardian, actor]
  standby:
    spare: [guardian, actor]
faults:
  agents:
    guardian: {failure_rate: 0.1}
"""


def test_a_standby_process_records_its_part_and_the_session_replays(tmp_path: Path) -> None:
    """The on-call team with a standby Guardian and Actor in a process of their own
    (``spare``, which ``transport.nodes`` does not name). That process ships its journal
    like any node, and the driver stores it: every process's journal ends, every record
    and dead letter names its process (each letter under an id of its own), and the
    session replays exactly in one process with every effect served. The driver used to
    drop ``spare``'s shipments as from a node the run does not place, and the replay then
    found the deliveries it had made missing.

    The standbys are of agents that keep nothing between messages: a stateful one
    (``dedup``) split between two members decides from two states, which one process
    replaying the session cannot reproduce."""
    copy_untimed(tmp_path)
    text = (tmp_path / "scenarios" / "oncall.yaml").read_text()
    assert "  rate: 2000 " in text and "\ntransport:" not in text
    path = tmp_path / "scenarios" / "oncall_standby.yaml"
    path.write_text(text.replace("  rate: 2000 ", "  count: 200\n  rate: 5000 ") + ONCALL_STANDBY)
    _, summary = run_json(tmp_path, "scenarios/oncall_standby.yaml")
    sid = summary["session_id"]

    assert {n: d["status"] for n, d in summary["nodes"].items()} == dict.fromkeys(
        ("driver", "triage", "act", "spare"), "ok"
    )
    with SessionStore(tmp_path / "s.db") as s:
        journals = {n: j.ended for n, j in s.node_journals(sid).items()}
        nodes = {v.name: (v.agents, v.ended) for v in readmodel.nodes(s, sid)}
        envelopes = s.envelopes(sid)
        handled = {(d.subscriber, d.node) for d in s.deliveries(sid)}
        dead = s.dead_letters(sid)
    assert journals == {"triage": True, "act": True, "spare": True}
    assert nodes["spare"] == (("guardian", "actor"), True)
    assert len(envelopes) == sum(summary["topics"].values())
    # Both members of each group worked, and their records say which did what.
    assert {("guardian", "act"), ("guardian", "spare"), ("actor", "spare")} <= handled
    assert {d.node for d in dead} == {"act", "spare"}
    assert len({d.entry_id for d in dead}) == len(dead) == sum(summary["dlq"].values())

    proc = pantheon("replay", sid, "--store", "s.db", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    replay = json.loads(proc.stdout)
    assert replay["matched"] is True and replay["effects_called"] == 0
    assert replay["cut"] is None
    assert len(replay["failures"]) == len(dead)
