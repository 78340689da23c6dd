"""The driver's end of remote approvals (``DeskRelay``) over a real desk and SQLite store:
what it writes for a node's request, what it answers, what it refuses, and what a lost
node's requests become, including one that arrives after its node was lost (a race the
process tests cannot aim at). The node processes' end is tested in
``tests/cluster/test_remote_approvals.py``."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from agents import ApprovalUnavailable
from pantheon.approvals._desk import StoreDesk
from pantheon.approvals._relay import LOST_BY, MAX_REQUEST, DeskRelay, NodeDesk
from pantheon.scenario import ApprovalsConfig
from pantheon.sessions import Approval, ApprovalBook, SessionStore

#: Seconds a test waits for the relay to get somewhere before it fails.
WAIT = 60.0
SESSION = "s-remote"


class Sent:
    """The commands the relay writes to one node (its ``_Child.send``)."""

    def __init__(self) -> None:
        self.commands: list[Mapping[str, Any]] = []

    async def __call__(self, command: Mapping[str, Any]) -> bool:
        self.commands.append(command)
        return True


@pytest.fixture
async def relay(tmp_path: Path) -> AsyncIterator[DeskRelay]:
    SessionStore(tmp_path / "s.db").close()
    desk = StoreDesk(tmp_path / "s.db", SESSION, ApprovalsConfig(timeout=120, poll=0.01))
    relay = DeskRelay(desk, {"action": ("guardian",), "other": ("actor",)})
    try:
        yield relay
    finally:
        await relay.aclose()
        await desk.aclose()


def rows(relay: DeskRelay) -> dict[str, Approval]:
    assert relay.desk is not None
    with SessionStore(relay.desk.store_path, create=False) as st:
        return {a.summary: a for a in ApprovalBook(st).entries(SESSION)}


async def until(what: str, check: Callable[[], Any]) -> Any:
    try:
        async with asyncio.timeout(WAIT):
            while not (got := check()):  # noqa: ASYNC110 - polling the SQLite file
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")
    return got


def ask(rid: Any, summary: str, agent: str = "guardian") -> dict[str, Any]:
    return {"event": "approval", "id": rid, "agent": agent, "request": {"summary": summary}}


async def test_a_nodes_request_is_written_with_its_node_and_answered_once(
    relay: DeskRelay, tmp_path: Path
) -> None:
    sent = Sent()
    relay.on_request("action", sent)(ask(7, "refund 450"))
    row = (await until("the row", lambda: rows(relay)))["refund 450"]
    assert (row.agent, row.node, row.session, row.status) == ("guardian", "action", SESSION,
                                                             "pending")  # fmt: skip
    assert sent.commands == []  # nothing until someone decides
    with SessionStore(tmp_path / "s.db") as st:
        ApprovalBook(st).decide(SESSION, row.id, approved=True, note="ok", by="ann")
    await until("the answer", lambda: sent.commands)
    [answer] = sent.commands
    assert (answer["cmd"], answer["id"]) == ("decided", 7)
    assert {k: answer["decision"][k] for k in ("id", "approved", "note", "by")} == {
        "id": row.id, "approved": True, "note": "ok", "by": "ann"
    }  # fmt: skip


async def test_requests_it_cannot_ask_are_answered_with_the_reason(relay: DeskRelay) -> None:
    sent = Sent()
    handle = relay.on_request("action", sent)
    handle({"event": "approval", "agent": "guardian", "request": {"summary": "no id"}})
    handle(ask(1, "refund 450", agent="actor"))  # the Actor is on node "other"
    handle({"event": "approval", "id": 2, "agent": "guardian", "request": {"amount": 450}})
    await until("two answers", lambda: len(sent.commands) == 2)
    errors = {c["id"]: c["error"] for c in sent.commands}
    assert "decision" not in sent.commands[0] and "decision" not in sent.commands[1]
    assert (
        "node 'action' asked for approval for agent 'actor', which it does not host" in (errors[1])
    )
    assert "needs a 'summary'" in errors[2]
    assert rows(relay) == {}  # nothing refused reached the store


async def test_a_lost_nodes_pending_requests_are_rejected_by_node_lost(relay: DeskRelay) -> None:
    action, other = Sent(), Sent()
    relay.on_request("action", action)(ask(1, "refund 450"))
    relay.on_request("action", action)(ask(2, "refund 600"))
    relay.on_request("other", other)(ask(1, "refund 700", agent="actor"))
    await until("three rows", lambda: len(rows(relay)) == 3)
    await relay.lost("action")
    # A row the store shows may still be on its way to the relay's books (its put returned,
    # its task not yet resumed): that task cancels it as soon as it resumes.
    await until(
        "the lost node's rows decided",
        lambda: not any(rows(relay)[s].pending for s in ("refund 450", "refund 600")),
    )
    got = rows(relay)
    for summary in ("refund 450", "refund 600"):
        assert (got[summary].status, got[summary].decided_by) == ("rejected", LOST_BY)
        assert "node 'action' ended before a decision reached it" in got[summary].note
    assert got["refund 700"].pending  # another node's request waits on
    # Asked by the lost node after the loss was seen (its last lines, read late): written,
    # then cancelled at once; nobody is left to answer.
    relay.on_request("action", action)(ask(3, "refund 800"))
    late = await until("the late row decided", lambda: (r := rows(relay).get("refund 800"))
                       and not r.pending and r)  # fmt: skip
    assert (late.status, late.decided_by, late.node) == ("rejected", LOST_BY, "action")
    await asyncio.sleep(0)  # let the answered waiters' tasks finish
    assert action.commands == [] and other.commands == []


async def test_an_interrupted_run_leaves_its_stopped_nodes_requests_pending(
    relay: DeskRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut short (a second Ctrl-C), the driver ends its nodes itself: none died, and nobody
    decided what they wait on, so nothing is cancelled; a request read after the node ended
    is written and left pending too."""
    action = Sent()
    relay.on_request("action", action)(ask(1, "refund 450"))
    relay.on_request("action", action)(ask(2, "refund 600"))
    await until("two rows", lambda: len(rows(relay)) == 2)
    relay.interrupted()
    await relay.lost("action")
    relay.on_request("action", action)(ask(3, "refund 800"))
    await until("the late row", lambda: "refund 800" in rows(relay))
    await until("every request's fate said", lambda: caplog.text.count("left pending") == 3)
    got = rows(relay)
    assert {s: (a.status, a.decided_by, a.note) for s, a in got.items()} == {
        s: ("pending", None, "") for s in ("refund 450", "refund 600", "refund 800")
    }
    assert (
        f"approval {got['refund 450'].id} left pending: the run was interrupted before a "
        "decision reached node 'action'; nobody decided it"
    ) in caplog.text
    assert action.commands == []


def test_an_approvals_table_made_before_nodes_gets_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    SessionStore(path).close()
    with sqlite3.connect(path) as conn:  # the table as stores made before this change hold it
        conn.execute(
            "CREATE TABLE approvals (origin TEXT NOT NULL, id INTEGER NOT NULL, key TEXT NOT "
            "NULL, session TEXT NOT NULL, agent TEXT NOT NULL, summary TEXT NOT NULL, request "
            "TEXT NOT NULL, asked REAL NOT NULL, deadline REAL NOT NULL, default_approve "
            "INTEGER NOT NULL, status TEXT NOT NULL CHECK (status IN ('pending', 'approved', "
            "'rejected')), note TEXT NOT NULL DEFAULT '', decided_by TEXT, decided REAL, "
            "PRIMARY KEY (origin, id), UNIQUE (origin, key))"
        )
        conn.execute(
            "INSERT INTO approvals VALUES ('o', 1, 'k', 'o', 'guardian', 'old one', "
            "'{\"summary\": \"old one\"}', 1.0, 2.0, 0, 'pending', '', NULL, NULL)"
        )
    conn.close()
    with SessionStore(path) as st:
        book = ApprovalBook(st)
        [old] = book.entries("o")
        assert (old.summary, old.node, old.corrupt) == ("old one", None, None)
        new = book.ask(origin="o", session="o", agent="guardian", key="k2",
                       request={"summary": "new one"}, timeout=5, default_approve=False,
                       node="action")  # fmt: skip
        assert (new.id, new.node, new.asker, old.asker) == (2, "action", "guardian@action",
                                                            "guardian")  # fmt: skip
        assert book.get("o", 2).to_dict()["node"] == "action"


async def test_a_node_refuses_a_request_too_long_for_the_control_pipe() -> None:
    said: list[tuple[Any, ...]] = []
    desk = NodeDesk("action", lambda *args, **fields: said.append((args, fields)))
    big = {"summary": "refund 450", "details": "x" * MAX_REQUEST}
    with pytest.raises(ApprovalUnavailable, match=f"at most {MAX_REQUEST} characters"):
        await desk.ask("guardian", big)
    assert said == []  # nothing went to the driver
