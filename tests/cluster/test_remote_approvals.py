"""Approvals from a node process: the Guardian runs on node ``action`` of a ZeroMQ or NATS
run, its requests land in the driver's session store naming the node, a person decides
them with ``pantheon approve`` in another process, and the decisions reach the Guardian.

Every process is real: ``pantheon run`` (the driver) in a subprocess, which starts the node
(and the ZeroMQ broker); the NATS server is started here on a free port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from approval_run import REFUNDS, WAIT, pending, scenario, spawn, stop, wait_for
from cli_run import pantheon

from bus.backends.nats import NatsServer
from pantheon._remote_approvals import LOST_BY
from pantheon.sessions import ApprovalBook, SessionStore

#: The node hosting the Guardian; every other agent stays on the driver, so the Actor
#: there records the Guardian's decisions in the session.
PLACEMENT = "  nodes:\n    action: [guardian]\n"


@pytest.fixture(params=["zmq", "nats"])
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """The scenario's ``transport:`` section: a ZeroMQ broker the run starts, or this
    test's own ``nats-server -js``."""
    if request.param == "zmq":
        yield f"transport:\n  kind: zmq\n  broker: tcp://127.0.0.1:0\n{PLACEMENT}"
        return
    server = NatsServer().start()
    try:
        yield f"transport:\n  kind: nats\n  url: {server.url}\n{PLACEMENT}"
    finally:
        server.stop()


def remote_scenario(tmp_path: Path, transport: str, approvals: str) -> Path:
    """The approvals scenario on ``transport``. Its input names a malformed topic: the
    placement expects the Learner's class subscriptions (which include it), and a node
    waits for every route the placement expects before it reports ready."""
    path = scenario(tmp_path, approvals)
    text = path.read_text(encoding="utf-8")
    topic = "  topic: observation.email.received\n"
    assert "\nseed: 3\n" in text and topic in text
    text = text.replace("\nseed: 3\n", f"\nseed: 3\n\n{transport}\n")
    text = text.replace(topic, f"{topic}  malformed_topic: observation.email.malformed\n")
    path.write_text(text, encoding="utf-8")
    return path


def cli(*args: str, store: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return pantheon(*args, "--store", str(store), cwd=cwd, timeout=WAIT)


def rows_by_email(store: Path, session: str) -> dict[str, Any]:
    with SessionStore(store, create=False) as st:
        book = ApprovalBook(st)
        return {a.request["email_id"]: a for a in book.entries(book.origin(session))}


def guardian_decisions(store: Path, session: str) -> dict[str, dict[str, Any]]:
    """The Guardian's decisions as the driver recorded them (its Actor handles them)."""
    with SessionStore(store, create=False) as st:
        return {
            e.payload["email_id"]: e.payload
            for e in st.envelopes(session)
            if e.topic == "guardian.decision"
        }


def test_a_node_agent_asks_and_pantheon_approve_decides(tmp_path: Path, transport: str) -> None:
    store = tmp_path / "s.db"
    path = remote_scenario(tmp_path, transport, "approvals:\n  timeout: 120\n  poll: 0.05\n")
    run = spawn("run", str(path), store=store, cwd=tmp_path)
    try:
        sid, rows = wait_for("two pending approvals", lambda: pending(store), run)
        # Asked on the node, written by the driver into its session, naming the node.
        assert {(a.request["email_id"], a.agent, a.node, a.session) for a in rows} == {
            (email, "guardian", "action", sid) for email in REFUNDS
        }
        assert run.poll() is None  # the node's Guardian waits for a person
        listed = cli("approvals", sid, "--pending", store=store, cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.count("guardian@action") == 2
        ids = {a.request["email_id"]: str(a.id) for a in rows}
        ok = cli("approve", sid, ids["e0081"], "--note", "receipt checked", "--by", "ann",
                 store=store, cwd=tmp_path)  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        assert "guardian@action" in ok.stdout
        no = cli("approve", sid, ids["e0046"], "--reject", "--note", "too much", "--by", "bob",
                 store=store, cwd=tmp_path)  # fmt: skip
        assert no.returncode == 0, no.stderr
        out, err = run.communicate(timeout=3 * WAIT)
    finally:
        stop(run)
    assert run.returncode == 0, err
    summary = json.loads(out)
    assert summary["nodes"]["action"]["status"] == "ok"
    assert summary["nodes"]["action"]["agents"] == ["guardian"]
    # The Guardian on the node counted the person's decisions as its own.
    assert summary["decisions"] == {"approved": 5, "rejected": 1}
    assert summary["outbox"] == {"reply": 5}
    # The decisions are recorded in the store, by whom, with the node that asked.
    recorded = rows_by_email(store, sid)
    assert {k: (a.status, a.decided_by, a.note, a.node) for k, a in recorded.items()} == {
        "e0081": ("approved", "ann", "receipt checked", "action"),
        "e0046": ("rejected", "bob", "too much", "action"),
    }
    # And they reached the asking agent: its decisions carry them.
    decided = guardian_decisions(store, sid)
    assert decided["e0081"]["verdict"] == "approved"
    assert decided["e0081"]["reasons"][-1] == "approved by ann: receipt checked"
    assert decided["e0046"]["verdict"] == "rejected"
    assert decided["e0046"]["action"] == "ignore"
    assert decided["e0046"]["reasons"][-1] == "rejected by bob: too much"


def test_the_scripted_person_and_the_timeout_decide_a_node_agents_requests(
    tmp_path: Path, transport: str
) -> None:
    """Every policy of the ``approvals:`` section applies to a node's requests unchanged."""
    store = tmp_path / "s.db"
    path = remote_scenario(
        tmp_path,
        transport,
        "approvals:\n  timeout: 0.5\n  default: reject\n  poll: 0.05\n",
    )
    proc = pantheon("run", str(path), "--json", "--store", str(store), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["decisions"] == {"approved": 4, "rejected": 2}
    recorded = rows_by_email(store, summary["session_id"])
    assert {k: (a.status, a.decided_by, a.node) for k, a in recorded.items()} == {
        email: ("rejected", "timeout", "action") for email in REFUNDS
    }
    decided = guardian_decisions(store, summary["session_id"])
    assert {decided[e]["verdict"] for e in REFUNDS} == {"rejected"}


def _node_pid(driver: int, node: str) -> int | None:
    """The pid of the ``pantheon node --node NODE`` process ``driver`` started."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == driver and b"node" in cmdline and node.encode() in cmdline:
            return int(proc.name)
    return None


def test_a_lost_node_has_its_pending_requests_cancelled(tmp_path: Path) -> None:
    """The node dies while its requests wait: the driver decides them rejected by
    ``node-lost`` (nobody is left to act on them) and a person can no longer decide them."""
    store = tmp_path / "s.db"
    path = remote_scenario(
        tmp_path,
        f"transport:\n  kind: zmq\n  broker: tcp://127.0.0.1:0\n{PLACEMENT}",
        "approvals:\n  timeout: 120\n  poll: 0.05\n",
    )
    run = spawn("run", str(path), store=store, cwd=tmp_path)
    try:
        sid, rows = wait_for("two pending approvals", lambda: pending(store), run)
        node = wait_for("the node's pid", lambda: _node_pid(run.pid, "action"), run)
        os.kill(node, signal.SIGKILL)

        def cancelled() -> dict[str, Any] | None:
            got = rows_by_email(store, sid)
            return got if all(not a.pending for a in got.values()) else None

        recorded = wait_for("the node's requests cancelled", cancelled, run)
        out, err = run.communicate(timeout=3 * WAIT)
    finally:
        stop(run)
    assert {(k, a.status, a.decided_by) for k, a in recorded.items()} == {
        (email, "rejected", LOST_BY) for email in REFUNDS
    }
    assert all("node 'action' ended" in a.note for a in recorded.values())
    late = cli("approve", sid, str(rows[0].id), "--by", "ann", store=store, cwd=tmp_path)
    assert late.returncode == 1
    assert f"already rejected by {LOST_BY}" in late.stderr
    # The run itself finishes, and says the node died.
    assert run.returncode == 1, err
    summary = json.loads(out)
    assert summary["nodes"]["action"]["status"] == "died"
