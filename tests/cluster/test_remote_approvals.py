"""Approvals from a node process: the Guardian runs on node ``action`` of a ZeroMQ or NATS
run, its requests land in the driver's session store naming the node, a person decides
them with ``pantheon approve`` in another process, and the decisions reach the Guardian.

Every process is real: ``pantheon run`` (the driver) in a subprocess, which starts the node
(and the ZeroMQ broker); the NATS server is started here on a free port."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from approval_run import REFUNDS, WAIT, pending, scenario, spawn, stop, wait_for
from cli_run import pantheon
from transports import transport_section

from agents import Decision
from bus import Bus, Envelope
from bus.backends.nats import NatsServer, NatsTransport
from pantheon.approvals._relay import LOST_BY
from pantheon.sessions import ApprovalBook, SessionStore

#: The node hosting the Guardian; every other agent stays on the driver, so the Actor
#: there records the Guardian's decisions in the session.
PLACEMENT = "  nodes:\n    action: [guardian]\n"


@pytest.fixture(params=["zmq", "nats"])
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """The scenario's ``transport:`` section: a ZeroMQ broker the run starts, or this
    test's own ``nats-server -js``."""
    with transport_section(request.param, PLACEMENT) as section:
        yield section


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
    # The exchange is the Guardian's effect, recorded on its node and shipped to the session.
    with SessionStore(store, create=False) as st:
        effects = [e.value for e in st.effects(sid, name="human.approval")]
    assert sorted((r["id"], r["approved"], r["by"]) for r in effects) == sorted(
        (a.id, a.status == "approved", a.decided_by) for a in recorded.values()
    )
    # Replay in one process serves it: nobody is asked, no request is added.
    replayed = pantheon("replay", sid, "--store", str(store), "--json", cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    report = json.loads(replayed.stdout)
    assert (report["matched"], report["effects_called"]) == (True, 0), report["divergence"]
    assert rows_by_email(store, sid) == recorded
    with SessionStore(store, create=False) as st:
        assert ApprovalBook(st).entries(report["new_session_id"]) == []


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


# -- the control pipe itself: this test is the node's driver -------------------------------------


class Node:
    """``pantheon node --control`` hosting the Guardian on this test's NATS server, with this
    test in the driver's seat: it reads the node's events and writes its commands."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, scenario_path: Path, url: str) -> Node:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pantheon.cli", "node", "--connect", url,
            "--scenario", str(scenario_path), "--node", "action", "--agents", "guardian",
            "--control",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        node = cls(proc)
        assert (await node.next_event())["event"] == "ready"
        return node

    async def next_event(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        async with asyncio.timeout(WAIT):
            line = await self.proc.stdout.readline()
        if not line:
            assert self.proc.stderr is not None
            err = (await self.proc.stderr.read()).decode()
            raise AssertionError(f"the node ended ({await self.proc.wait()}): {err}")
        event: dict[str, Any] = json.loads(line)
        self.events.append(event)
        return event

    async def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self.proc.stdin.drain()

    async def close(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.communicate()


def proposal(email: str, amount: float) -> dict[str, Any]:
    """A Reasoner/Planner proposal the Guardian sends to a person (a refund over 200)."""
    return {
        "email_id": email, "sender": f"{email}@example.com", "intent": "refund",
        "amount": amount, "confidence": 0.9, "action": "reply",
        "steps": [{"tool": "reply", "text": "Your refund is on its way."}],
    }  # fmt: skip


def decided(rid: int, approved: bool, by: str) -> dict[str, Any]:
    decision = Decision(rid, approved, f"note {rid}", by, 1.0).to_dict()
    return {"cmd": "decided", "id": rid, "decision": decision}


@pytest.fixture
async def nats_team(tmp_path: Path) -> AsyncIterator[tuple[Path, str, Bus]]:
    """This test's NATS server, the approvals scenario on it, and a bus of this test in
    the scenario's team (stream ``approvals``)."""
    server = await asyncio.to_thread(NatsServer().start)
    try:
        path = remote_scenario(
            tmp_path, f"transport:\n  kind: nats\n  url: {server.url}\n", "approvals: {}\n"
        )
        bus = Bus(transport=NatsTransport(server.url, team="approvals", node="tester"))
        async with bus:
            yield path, server.url, bus
    finally:
        await asyncio.to_thread(server.stop)


async def test_many_requests_from_a_node_each_answered_once_in_any_order(
    nats_team: tuple[Path, str, Bus],
) -> None:
    path, url, bus = nats_team
    decisions: dict[str, dict[str, Any]] = {}

    @bus.on("guardian.decision", name="tester")
    async def took(env: Envelope) -> None:
        decisions[env.payload["email_id"]] = env.payload

    await bus.transport.sync()  # type: ignore[attr-defined]
    node = await Node.start(path, url)
    try:
        for i, email in enumerate(("p1", "p2", "p3")):
            await bus.emit("plan.proposed", proposal(email, 300.0 + i))
        asked = [await node.next_event() for _ in range(3)]
        # Three requests outstanding at once (the Guardian's concurrency is 4).
        assert {e["event"] for e in asked} == {"approval"}
        assert sorted(e["id"] for e in asked) == [1, 2, 3]
        assert {e["agent"] for e in asked} == {"guardian"}
        ids = {e["request"]["email_id"]: e["id"] for e in asked}
        # Answered in reverse order, one twice, and one nobody asked.
        await node.send(decided(ids["p3"], True, "ann"))
        await node.send(decided(ids["p1"], False, "bob"))
        await node.send(decided(ids["p3"], False, "mallory"))  # ignored: answered before
        await node.send(decided(99, False, "mallory"))  # ignored: nobody asked it
        await node.send(decided(ids["p2"], True, "cy"))
        async with asyncio.timeout(WAIT):
            while len(decisions) < 3:  # noqa: ASYNC110 - filled by the bus's handler
                await asyncio.sleep(0.02)
        # The node's control loop still answers, and took no decision for a command.
        await node.send({"cmd": "status"})
        assert (await node.next_event())["event"] == "status"
    finally:
        await node.close()
    assert [e["event"] for e in node.events if e["event"] == "error"] == []
    assert {k: (d["verdict"], d["reasons"][-1]) for k, d in decisions.items()} == {
        "p1": ("rejected", f"rejected by bob: note {ids['p1']}"),
        "p2": ("approved", f"approved by cy: note {ids['p2']}"),
        "p3": ("approved", f"approved by ann: note {ids['p3']}"),
    }


async def test_a_node_whose_driver_dies_fails_its_waiting_requests(
    nats_team: tuple[Path, str, Bus],
) -> None:
    """The node's stdin closes while its Guardian waits for a decision: ``approve()``
    raises ApprovalUnavailable (then again on each retry), the message is dead-lettered
    with that reason, and the node leaves."""
    path, url, bus = nats_team
    node = await Node.start(path, url)
    try:
        await bus.emit("plan.proposed", proposal("p4", 450.0))
        asked = await node.next_event()
        assert (asked["event"], asked["request"]["email_id"]) == ("approval", "p4")
        assert node.proc.stdin is not None
        node.proc.stdin.close()  # the driver is gone
        async with asyncio.timeout(WAIT):
            code = await node.proc.wait()
    finally:
        await node.close()
    assert code == 0
    transport: NatsTransport = bus.transport  # type: ignore[assignment]
    dead = await transport.dead_letters()
    assert [(d.envelope.payload["email_id"], d.subscriber, d.error_type) for d in dead] == [
        ("p4", "guardian", "ApprovalDriverGone")  # an ApprovalUnavailable, marked DriverGone
    ]
    assert "the driver of the run is gone" in dead[0].error
