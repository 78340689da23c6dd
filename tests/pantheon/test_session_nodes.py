"""The node of each hop of a multi-process session, on sessions really recorded by
``pantheon run`` on ZeroMQ nodes: the read model, ``sessions show`` (and ``--json``),
``pantheon diff``, ``dlq list`` and ``export``."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from cli_run import pantheon
from node_session import NodeSessions

from pantheon import readmodel
from pantheon.scenario import DRIVER_NODE as SCENARIO_DRIVER
from pantheon.sessions import DRIVER_NODE, SessionStore


def _placed(summary: dict[str, Any]) -> dict[str, str]:
    """Agent -> the process the run's summary says hosts it."""
    return {a: node for node, d in summary["nodes"].items() for a in d["agents"]}


def test_the_read_model_gives_each_hop_and_dead_letter_its_node(
    node_sessions: NodeSessions,
) -> None:
    s = node_sessions
    placed = _placed(s.summaries["nodes3"])
    with SessionStore(s.store, create=False) as store:
        letters = readmodel.dead_letters(store, s.three)
        requests = readmodel.requests(store, s.three)
        bars = [b for r in requests for b in readmodel.waterfall(store, s.three, r.correlation_id)]
        breakers = readmodel.breaker_timeline(store, s.three)
        alone_letters = readmodel.dead_letters(store, s.alone)
        alone_bars = readmodel.waterfall(
            store, s.alone, readmodel.requests(store, s.alone)[0].correlation_id
        )
        assert readmodel.nodes(store, s.alone) == ()
    # Every ticket failed on the Actor, which runs on node action: its dead letters are there.
    assert letters and {d.node for d in letters} == {"action"}
    assert breakers and {b.node for b in breakers} == {"action"}
    # Each handling ran where its agent is placed; the driver's (the Learner) say so too.
    nodes = Counter(b.node for b in bars)
    assert set(nodes) == {"driver", "perception", "cognition", "action"}
    for b in bars:
        assert b.node == placed[b.agent.partition(":")[0]], b
    # A single-process session's records have no node.
    assert alone_letters and {d.node for d in alone_letters} == {None}
    assert {b.node for b in alone_bars} == {None}


def test_sessions_show_says_how_each_node_ended_and_where_its_journal_ends(
    node_sessions: NodeSessions,
) -> None:
    s = node_sessions
    with SessionStore(s.store, create=False) as store:
        journals = store.node_journals(s.three)
        cut = store.node_journals(s.killed)
    out = pantheon("sessions", "show", s.three, "--store", str(s.store), cwd=s.store.parent)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("node ")]
    j = {n: (journals[n].shipments, journals[n].records) for n in journals}
    assert lines == [
        "node driver: observer, learner; ok; records the session itself",
        f"node perception: sensor, monitor; ok; {j['perception'][0]} shipments, "
        f"{j['perception'][1]:,} records, journal complete",
        f"node cognition: reasoner, memory, planner; ok; {j['cognition'][0]} shipments, "
        f"{j['cognition'][1]:,} records, journal complete",
        f"node action: guardian, actor; ok; {j['action'][0]} shipments, "
        f"{j['action'][1]:,} records, journal complete",
    ]

    # The killed node: when, and where its records stop.
    out = pantheon("sessions", "show", s.killed, "--store", str(s.store), cwd=s.store.parent)
    assert out.returncode == 0, out.stderr
    killed_at = s.summaries["killed"]["nodes"]["work2"]["killed_at_s"]  # type: ignore[index]
    (work2,) = [line for line in out.stdout.splitlines() if line.startswith("node work2")]
    if "work2" in cut:
        w = cut["work2"]
        assert not w.ended
        # A node killed early may have shipped once: "1 shipment", as English has it.
        records = f"{w.records:,} record{'' if w.records == 1 else 's'}"
        shipments = f"{w.shipments} shipment{'' if w.shipments == 1 else 's'}"
        assert work2 == (
            f"node work2: reasoner; killed at {killed_at:.2f} s; journal ends after "
            f"{records} in {shipments} (its last records died with it)"
        )
    else:  # killed before its first shipment
        assert work2 == (
            f"node work2: reasoner; killed at {killed_at:.2f} s; shipped no records "
            "(they died with it)"
        )
    assert re.search(r"^node work1: reasoner; ok; .* journal complete$", out.stdout, re.M)

    # --json: the same, per field, and the line.
    out = pantheon(
        "sessions", "show", s.killed, "--json", "--store", str(s.store), cwd=s.store.parent
    )
    doc = json.loads(out.stdout)
    by_name = {n["name"]: n for n in doc["nodes"]}
    assert list(by_name) == ["driver", "keep", "work1", "work2"]
    assert by_name["work2"]["status"] == "killed"
    assert by_name["work2"]["ended"] is False
    assert by_name["work2"]["text"] == work2
    assert by_name["work1"]["ended"] is True
    assert by_name["driver"]["shipments"] is None


def test_a_single_process_session_shows_as_before(node_sessions: NodeSessions) -> None:
    s = node_sessions
    out = pantheon("sessions", "show", s.alone, "--store", str(s.store), cwd=s.store.parent)
    assert out.returncode == 0, out.stderr
    assert not [line for line in out.stdout.splitlines() if line.startswith("node ")]
    out = pantheon(
        "sessions", "show", s.alone, "--json", "--store", str(s.store), cwd=s.store.parent
    )
    assert "nodes" not in json.loads(out.stdout)


def test_diff_names_the_node_where_the_first_difference_ran(node_sessions: NodeSessions) -> None:
    s = node_sessions
    placed = _placed(s.summaries["nodes3"])
    out = pantheon("diff", s.alone, s.three, "--json", "--store", str(s.store), cwd=s.store.parent)
    div = json.loads(out.stdout)["divergence"]
    assert div is not None, out.stdout
    agent = div["agent"].partition(":")[0]
    # A is single-process: no node; B ran the hop where its agent is placed.
    assert div["node_a"] is None
    assert div["node_b"] == placed[agent]
    assert f"from agent {div['agent']!r} (node {placed[agent]} in B)" in div["message"]

    # The other way round the node is A's, and the text says it too. The first difference
    # is the first in A's order, so it may be another hop than above (a loaded run once
    # differed first in a payload elsewhere): the node is that hop's.
    out = pantheon("diff", s.three, s.alone, "--json", "--store", str(s.store), cwd=s.store.parent)
    back = json.loads(out.stdout)["divergence"]
    assert back is not None, out.stdout
    agent = back["agent"].partition(":")[0]
    assert back["node_a"] == placed[agent] and back["node_b"] is None
    out = pantheon("diff", s.three, s.alone, "--store", str(s.store), cwd=s.store.parent)
    assert f"(node {placed[agent]} in A)" in out.stdout, out.stdout


def test_dlq_list_says_which_node_dead_lettered_each_entry(node_sessions: NodeSessions) -> None:
    """``pantheon dlq list`` of a multi-process session names each entry's node (its
    tickets fail on the Actor, on node ``action``); a single-process one's name none."""
    s = node_sessions
    out = pantheon("dlq", "list", s.three, "--store", str(s.store), cwd=s.store.parent)
    assert out.returncode == 0, out.stderr
    heads = [line for line in out.stdout.splitlines() if line.startswith("#")]
    assert heads and all(re.match(r"#\d+ actor \(node action\) on ", h) for h in heads), heads
    out = pantheon("dlq", "list", s.alone, "--store", str(s.store), cwd=s.store.parent)
    assert out.returncode == 0, out.stderr
    heads = [line for line in out.stdout.splitlines() if line.startswith("#")]
    assert heads and not [h for h in heads if "(node " in h], heads


def test_export_names_each_message_s_process_as_sessions_show_does(
    node_sessions: NodeSessions,
) -> None:
    """``pantheon export`` of a multi-process session gives every message the process that
    published it, the driver's as ``driver`` (the name ``sessions show`` and ``dlq list``
    give it; the store keeps ``None`` for the recording process); a single-process
    session's messages have none."""
    s = node_sessions
    placed = _placed(s.summaries["nodes3"])
    out = pantheon("export", s.three, "--store", str(s.store), cwd=s.store.parent)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(records) == s.summaries["nodes3"]["messages"]
    # The inputs: published by the Observer, on the driver.
    inputs = [r for r in records if r["source"] is None]
    assert inputs and {r["node"] for r in inputs} == {"driver"}
    for r in records:
        if r["source"] is not None:
            assert r["node"] == placed[r["source"].partition(":")[0]], r
    assert {r["node"] for r in records} == set(s.summaries["nodes3"]["nodes"])  # type: ignore[arg-type]
    shown = pantheon("sessions", "show", s.three, "--store", str(s.store), cwd=s.store.parent)
    assert "node driver: observer, learner; " in shown.stdout
    assert readmodel.DRIVER == DRIVER_NODE == SCENARIO_DRIVER == "driver"

    out = pantheon("export", s.alone, "--store", str(s.store), cwd=s.store.parent)
    assert out.returncode == 0, out.stderr
    assert {json.loads(line)["node"] for line in out.stdout.splitlines()} == {None}

    # dlq list --json names the node as its text does (node action: every ticket failed).
    out = pantheon("dlq", "list", s.three, "--json", "--store", str(s.store), cwd=s.store.parent)
    letters = json.loads(out.stdout)
    assert letters and {d["node"] for d in letters} == {"action"}


def test_the_store_counts_and_lists_each_processs_dead_letters(
    node_sessions: NodeSessions,
) -> None:
    """What a multi-process run's summary reads of a process that ended without its report:
    the dead letters per process and reason (a ``GROUP BY``), and the listed ones of some
    processes only, none shed, up to a limit."""
    s = node_sessions
    with SessionStore(s.store, create=False) as store:
        every = store.dead_letters(s.three)
        counts = store.dead_letter_counts(s.three)
        action = store.dead_letters(s.three, nodes=["action"], shed=False, limit=3)
        assert store.dead_letters(s.three, nodes=[]) == []
    by_node: dict[str | None, Counter[str]] = {}
    for d in every:
        by_node.setdefault(d.node, Counter())[d.reason] += 1
    assert counts == {node: dict(c) for node, c in by_node.items()}
    assert len(action) == 3
    assert action == [d for d in every if d.node == "action" and d.reason != "shed"][:3]
