"""Approval as a first-class step: asked by the Guardian, decided from another process, by a
scripted person or by the timeout, recorded as an effect (exact replay, nobody asked), and
still pending after a SIGKILL until ``pantheon resume`` finishes the run."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from approval_run import REFUNDS, WAIT, pending, scenario, spawn, stop, wait_for

import pantheon
from agents import Agent, ApprovalUnavailable, Decision, Guardian
from pantheon.rerun.resume import resumable
from pantheon.scenario import ScenarioError, load_scenario
from pantheon.sessions import (
    AlreadyDecided,
    ApprovalBook,
    ApprovalNotFound,
    SessionInfo,
    SessionStore,
)
from pantheon.sessions._codec import decode


def cli(*args: str, store: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pantheon.cli", *args, "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env=os.environ | {"COLUMNS": "200"},
    )


def approval_effects(
    store: Path, session: str, origin: str | None = None
) -> dict[str, dict[str, Any]]:
    """The session's recorded ``human.approval`` results, by email id (the requests are
    numbered under ``origin``, by default the session's own)."""
    with SessionStore(store, create=False) as st:
        book = ApprovalBook(st)
        rows = book.entries(origin or book.origin(session))
        emails = {a.id: a.request["email_id"] for a in rows}
        effects = st.effects(session, name="human.approval")
    return {emails[r["id"]]: r for r in (decode(e.result) for e in effects)}


# -- deciding from another process -------------------------------------------------------------


def test_a_run_waits_for_pantheon_approve_from_another_process(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    path = scenario(tmp_path, "approvals:\n  timeout: 120\n  poll: 0.05\n")
    run = spawn("run", str(path), store=store, cwd=tmp_path)
    try:
        sid, rows = wait_for("two pending approvals", lambda: pending(store), run)
        assert {a.request["email_id"] for a in rows} == REFUNDS
        assert run.poll() is None  # the run is waiting for a person
        by_email = {a.request["email_id"]: a.id for a in rows}
        ok = cli("approve", sid, str(by_email["e0081"]), "--note", "receipt checked",
                 "--by", "ann", store=store)  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        assert "approved by ann" in ok.stdout
        no = cli("approve", sid[:12], str(by_email["e0046"]), "--reject", "--note", "too much",
                 "--by", "bob", store=store)  # fmt: skip
        assert no.returncode == 0, no.stderr
        out, err = run.communicate(timeout=WAIT)
    finally:
        stop(run)
    assert run.returncode == 0, err
    summary = json.loads(out)
    assert summary["decisions"] == {"approved": 5, "rejected": 1}
    assert summary["outbox"] == {"reply": 5}
    # Deciding twice: the second is refused with who decided, exit 1.
    again = cli("approve", sid, str(by_email["e0046"]), store=store)
    assert again.returncode == 1
    assert "already rejected by bob" in again.stderr
    unknown = cli("approve", sid, "99", store=store)
    assert unknown.returncode == 2
    assert "has no approval 99" in unknown.stderr
    recorded = approval_effects(store, sid)
    assert {k: (v["approved"], v["by"], v["note"]) for k, v in recorded.items()} == {
        "e0081": (True, "ann", "receipt checked"),
        "e0046": (False, "bob", "too much"),
    }
    listed = cli("approvals", sid, "--json", store=store)
    assert {a["id"]: (a["status"], a["decided_by"]) for a in json.loads(listed.stdout)} == {
        by_email["e0081"]: ("approved", "ann"),
        by_email["e0046"]: ("rejected", "bob"),
    }


# -- timeout, scripted person, replay ----------------------------------------------------------


@pytest.mark.parametrize(
    ("default", "decisions"),
    [("approve", {"approved": 6}), ("reject", {"approved": 4, "rejected": 2})],
)
async def test_nobody_answers_and_the_default_applies_after_the_timeout(
    tmp_path: Path, default: str, decisions: dict[str, int]
) -> None:
    store = tmp_path / "s.db"
    path = scenario(tmp_path, f"approvals:\n  timeout: 0.3\n  default: {default}\n  poll: 0.05\n")
    summary = await pantheon.run(path, store=store)
    assert summary.decisions == decisions
    recorded = approval_effects(store, summary.session_id or "")
    assert set(recorded) == REFUNDS
    assert {(r["approved"], r["by"]) for r in recorded.values()} == {(default == "approve",
                                                                     "timeout")}  # fmt: skip
    assert all(f"default {default}" in r["note"] for r in recorded.values())


async def test_a_replay_serves_the_decisions_and_asks_nobody(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    path = scenario(
        tmp_path, "approvals:\n  poll: 0.05\n  auto: {approve_after: 0.1, note: scripted ok}\n"
    )
    summary = await pantheon.run(path, store=store)
    assert summary.decisions == {"approved": 6}
    original = approval_effects(store, summary.session_id or "")
    assert {(r["by"], r["note"]) for r in original.values()} == {("auto", "scripted ok")}
    with SessionStore(store) as st:
        rows_before = ApprovalBook(st).entries(summary.session_id or "")
    report = await pantheon.replay(summary.session_id or "", store=store)
    assert report.matched, report.divergence
    assert report.effects_called == 0  # nothing ran for real: no person was asked
    assert approval_effects(store, report.new_session_id, summary.session_id) == original
    with SessionStore(store) as st:
        book = ApprovalBook(st)
        assert book.entries(summary.session_id or "") == rows_before
        assert book.entries(report.new_session_id) == []


async def test_an_unrecorded_run_is_decided_by_its_scripted_person(tmp_path: Path) -> None:
    path = scenario(tmp_path, "approvals:\n  poll: 0.05\n  auto: {reject_after: 0}\n")
    summary = await pantheon.run(path, record=False)
    assert summary.decisions == {"approved": 4, "rejected": 2}, (
        summary.dlq,
        summary.dead_letters,
        summary.inputs,
        summary.messages,
        summary.outbox,
    )


# -- crash and resume --------------------------------------------------------------------------


def test_sigkill_with_pending_approvals_then_resume_completes_them(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    path = scenario(tmp_path, "approvals:\n  timeout: 120\n  poll: 0.05\n")
    run = spawn("run", str(path), store=store, cwd=tmp_path)
    try:
        sid, rows = wait_for("two pending approvals", lambda: pending(store), run)

        def recorded() -> bool:
            with SessionStore(store, create=False) as st:
                inputs = [e for e in st.envelopes(sid) if e.causation_id is None]
                return len(inputs) == 6 and len(st.effects(sid)) > 0

        wait_for("the inputs in the recording", recorded, run)
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=WAIT)
        assert run.returncode == -signal.SIGKILL
    finally:
        stop(run)
    by_email = {a.request["email_id"]: a for a in rows}
    with SessionStore(store) as st:  # opening the store finds the process gone
        assert st.session(sid).status == "aborted"
    # Decided while no process runs: the resumed run finds it decided.
    early = cli("approve", sid, str(by_email["e0081"].id), "--by", "ann", store=store)
    assert early.returncode == 0, early.stderr
    resumed = spawn("resume", sid, store=store, cwd=tmp_path)
    try:

        def waiting_again() -> str | None:
            with SessionStore(store, create=False) as st:
                book = ApprovalBook(st)
                late = book.get(sid, by_email["e0046"].id)
                # Taken over by the resumed session: it is asking for it again.
                return late.session if late.session != sid and late.pending else None

        new_sid = wait_for("the resumed run to wait on approval 2", waiting_again, resumed)
        assert resumed.poll() is None
        # Named through the resumed session's id: the two share their approvals.
        late = cli("approve", new_sid, str(by_email["e0046"].id), "--by", "bob", store=store)
        assert late.returncode == 0, late.stderr
        out, err = resumed.communicate(timeout=WAIT)
    finally:
        stop(resumed)
    assert resumed.returncode == 0, err
    result = json.loads(out)
    assert result["session_id"] == new_sid
    assert result["resume"]["original_session_id"] == sid
    assert result["resume"]["inputs_replayed"] == 6
    assert result["resume"]["effects_served"] > 0
    assert result["inputs"] == 6
    assert result["decisions"] == {"approved": 6}
    recorded = approval_effects(store, new_sid)
    assert {k: (v["approved"], v["by"]) for k, v in recorded.items()} == {
        "e0081": (True, "ann"),
        "e0046": (True, "bob"),
    }
    with SessionStore(store) as st:
        info = st.session(new_sid)
        assert (info.kind, info.replay_of, info.status) == ("resume", sid, "completed")
        # The same two requests, never a third: the resumed run found them by their key.
        assert len(ApprovalBook(st).entries(sid)) == 2
    # The resumed session replays exactly too, asking nobody.
    report = asyncio.run(pantheon.replay(new_sid, store=store))
    assert (report.matched, report.effects_called) == (True, 0), report.divergence
    # Resumed once, and only once.
    again = cli("resume", sid, store=store)
    assert again.returncode == 2
    assert f"session {sid} was resumed already, as {new_sid} (completed)" in again.stderr


@pytest.mark.parametrize(
    ("kind", "status", "why"),
    [
        ("run", "aborted", None),
        ("resume", "aborted", None),
        ("run", "running", "is still running (pid 7 on h); only a run whose process died"),
        ("run", "failed", "ended (failed); only a run whose process died (aborted)"),
        ("replay", "aborted", "is a replay, not a run: replay its original instead"),
    ],
)
def test_what_can_be_resumed(kind: str, status: str, why: str | None) -> None:
    info = SessionInfo("s1", kind, "x", "", 0, 0.0, None, status, {}, None, 7, "h")
    said = resumable(info)
    if why is None:
        assert said is None
    else:
        assert said is not None and said.startswith(f"session s1 {why}"), said


@pytest.mark.parametrize(
    ("stream", "why"),
    [
        # A node died with items waiting for agents nobody else hosted: not finished.
        ({"killed": ["think"], "items": ["e1"], "handed_over": {}}, None),
        ({"killed": ["think"], "items": [], "handed_over": {"planner": ["e2"]}}, None),
        # A node died, its standby took everything over: finished, and failed otherwise.
        ({"killed": ["think"], "items": [], "handed_over": {}}, "ended (failed)"),
        ({}, "ended (failed)"),
    ],
)
def test_a_run_that_left_items_in_the_stream_can_be_resumed(
    stream: dict[str, object], why: str | None
) -> None:
    summary = {"stream": stream}
    info = SessionInfo("s1", "run", "x", "", 0, 0.0, None, "failed", summary, None, 7, "h")
    said = resumable(info)
    assert said is None if why is None else said is not None and why in said, said
    # A run that did not expect zero_lost passed its checks, and left the items all the same.
    passed = dataclasses.replace(info, status="completed")
    assert (resumable(passed) is None) is (why is None)


def test_resume_refuses_a_session_that_finished(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    path = scenario(tmp_path, "approvals:\n  poll: 0.05\n  auto: {approve_after: 0}\n")
    done = cli("run", str(path), "--json", store=store)
    assert done.returncode == 0, done.stderr
    sid = json.loads(done.stdout)["session_id"]
    refused = cli("resume", sid, store=store)
    assert refused.returncode == 2
    assert f"session {sid} ended (completed); only a run whose process died" in refused.stderr


# -- the pieces --------------------------------------------------------------------------------


async def test_an_agent_without_a_desk_says_nobody_can_be_asked() -> None:
    agent = Agent("lonely")
    with pytest.raises(ApprovalUnavailable, match="'lonely' asked for approval, but nobody"):
        await agent.approve({"summary": "deploy?"})
    with pytest.raises(ApprovalUnavailable, match="needs a 'summary'"):
        await agent.approve({"what": "deploy"})
    with pytest.raises(ApprovalUnavailable, match="one line"):
        await agent.approve({"summary": "two\nlines"})


class _Desk:
    def __init__(self, approved: bool) -> None:
        self.approved = approved
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def ask(self, agent: str, request: Any) -> dict[str, Any]:
        self.asked.append((agent, dict(request)))
        return Decision(7, self.approved, "looked", "cy", 1.0).to_dict()


PLAN = {
    "email_id": "e9", "sender": "a@b.example", "intent": "refund", "confidence": 0.9,
    "amount": 500.0, "action": "reply", "steps": [{"tool": "reply", "text": "done"}],
}  # fmt: skip


@pytest.mark.parametrize("approved", [True, False])
async def test_the_guardian_asks_about_a_refund_over_the_limit(approved: bool) -> None:
    guardian = Guardian(settings={"over_limit": "ask"})
    guardian.desk = desk = _Desk(approved)
    decision = await guardian._ask_person_about(guardian.decide(PLAN))
    assert desk.asked == [("guardian", {
        "summary": "refund 500.00 over limit 200.00 needs human approval: e9 from a@b.example",
        "email_id": "e9", "sender": "a@b.example", "amount": 500.0, "action": "reply",
    })]  # fmt: skip
    if approved:
        assert (decision["verdict"], decision["action"]) == ("approved", "reply")
        assert decision["steps"] == PLAN["steps"]
        assert decision["reasons"][-1] == "approved by cy: looked"
    else:
        assert (decision["verdict"], decision["action"], decision["steps"]) == (
            "rejected", "ignore", [])  # fmt: skip
        assert decision["reasons"][-1] == "rejected by cy: looked"
    assert "approval" not in decision
    assert dict(guardian.decisions) == {decision["verdict"]: 1}
    # Escalating (the default) asks nobody.
    assert Guardian().decide(PLAN)["verdict"] == "escalated"


def test_a_decision_is_made_once_whoever_comes_second(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "s.db") as st:
        book = ApprovalBook(st)
        asked = book.ask(origin="o", session="o", agent="g", key="k#0",
                         request={"summary": "x"}, timeout=5, default_approve=False)  # fmt: skip
        again = book.ask(origin="o", session="r", agent="g", key="k#0",
                         request={"summary": "x"}, timeout=5, default_approve=False)  # fmt: skip
        assert (asked.id, again.id, again.session, again.deadline) == (1, 1, "r", asked.deadline)
        book.decide("o", 1, approved=True, by="ann")
        with pytest.raises(AlreadyDecided, match="already approved by ann") as info:
            book.decide("o", 1, approved=False, by="timeout")
        assert info.value.approval.status == "approved"
        with pytest.raises(ApprovalNotFound, match="session o has no approval 2"):
            book.decide("o", 2, approved=True, by="ann")


def test_a_request_only_cancelled_is_reopened_when_asked_again(tmp_path: Path) -> None:
    """A cancellation (``reopen`` names its decider: ``node-lost``) answered nothing: the run
    asking again gets the row back pending, same number, with a new deadline, and a person
    decides it. A real decision, a person's or the timeout's, stands."""
    lost = "node-lost"

    def ask(key: str, session: str, now: float) -> Any:
        return book.ask(origin="o", session=session, agent="g", key=key, request={"summary": key},
                        timeout=5, default_approve=False, node=None, now=now,
                        reopen=(lost,))  # fmt: skip

    with SessionStore(tmp_path / "s.db") as st:
        book = ApprovalBook(st)
        for n, key in enumerate(("cut#0", "no#0", "late#0"), 1):
            assert ask(key, "o", 100.0).id == n
        book.decide("o", 1, approved=False, note="node 'a' ended", by=lost)
        book.decide("o", 2, approved=False, note="too much", by="ann")
        book.decide("o", 3, approved=False, by="timeout")
        again = ask("cut#0", "r", 200.0)
        assert (again.id, again.status, again.decided_by, again.decided, again.note) == (
            1, "pending", None, None, "",
        )  # fmt: skip
        assert (again.session, again.asked, again.deadline) == ("r", 100.0, 205.0)
        assert book.get("o", 1) == again
        stood = [ask("no#0", "r", 200.0), ask("late#0", "r", 200.0)]
        assert [(a.status, a.decided_by) for a in stood] == [
            ("rejected", "ann"),
            ("rejected", "timeout"),
        ]
        assert book.decide("o", 1, approved=True, by="ann").status == "approved"
        assert ask("cut#0", "r2", 300.0).decided_by == "ann"


# -- the scenario section ----------------------------------------------------------------------


def _problems(tmp_path: Path, block: str) -> list[str]:
    path = scenario(tmp_path, block)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return [str(p) for p in info.value.problems]


def test_the_scripted_person_is_validated(tmp_path: Path) -> None:
    ok = load_scenario(scenario(tmp_path, "approvals:\n  auto: {approve_after: 0.5}\n"))
    assert ok.approvals.auto is not None and ok.approvals.auto.approve_after == 0.5
    at = f"{tmp_path / 'approvals.yaml'}:25"
    assert _problems(tmp_path, "approvals:\n  timeout: 0\n") == [
        f"{at}:3: approvals.timeout: Input should be greater than 0"
    ]
    assert _problems(tmp_path, "approvals:\n  timeout: 1e9\n") == [
        f"{at}:3: approvals.timeout: Input should be less than or equal to 86400"
    ]
    assert _problems(tmp_path, "approvals:\n  auto: {approve_after: 1, reject_after: 1}\n") == [
        f"{at}:3: approvals.auto: give approve_after or reject_after, exactly one of them"
    ]
    assert _problems(tmp_path, "approvals:\n  auto: {approve_after: 7200}\n") == [
        f"{at}:10: approvals.auto.approve_after: Input should be less than or equal to 3600"
    ]
    assert _problems(tmp_path, "approvals:\n  defualt: approve\n") == [
        f"{at}:3: approvals.defualt: unknown key 'defualt' (did you mean 'default'?); "
        "expected one of timeout, default, poll, auto"
    ]
