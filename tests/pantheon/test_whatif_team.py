"""A what-if on a team that is not the support desk: an invoice desk whose approver asks a
person above a threshold, and a custom check that fails when an invoice is held. The
what-if re-asks changed approvals through its own desk (never a dead letter), judges every
expectation as ``pantheon run`` does, and exits 1 when one fails."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_run import pantheon as cli

import pantheon
from pantheon.sessions import ApprovalBook, SessionStore
from pantheon.sessions._codec import decode

MODULE = '''
from agents import Agent, AgentSettings
from bus import Envelope


class Approver(Agent):
    """Pays an invoice at once up to ``threshold``; above it, a person decides."""

    subscriptions = ("invoice.received",)

    class Settings(AgentSettings):
        threshold: float = 100.0

    async def handle(self, env: Envelope) -> None:
        invoice = env.payload
        paid = True
        if invoice["amount"] > self.settings.threshold:
            summary = f"pay {invoice['amount']} to {invoice['vendor']}"
            decision = await self.approve({"summary": summary, "invoice": invoice["id"]})
            paid = decision.approved
        await self.emit("invoice.paid" if paid else "invoice.held", {"id": invoice["id"]})


async def pay(env, agent):
    await agent.effect("tool.pay", lambda: {"paid": env.payload["id"]})


async def explode(env):
    raise RuntimeError(f"cannot audit {env.payload['id']}")


def nothing_held(summary):
    held = summary.topics.get("invoice.held", 0)
    return True if held == 0 else f"{held} invoices held"
'''

INVOICES = [
    {"id": "i1", "vendor": "acme", "amount": 50},
    {"id": "i2", "vendor": "bolt", "amount": 200},
    {"id": "i3", "vendor": "cogs", "amount": 300},
    {"id": "i4", "vendor": "dyna", "amount": 800},
    {"id": "i5", "vendor": "echo", "amount": 1200},
]

# Nobody approves in time: every invoice over 100 is held, and the custom check fails.
SCENARIO = """\
version: 1
name: invoice_desk
input:
  kind: jsonl
  path: invoices.jsonl
  topic: invoice.received
approvals:
  timeout: 0.2
  default: reject
  poll: 0.02
agents:
  approver:
    class: "invoices_mod:Approver"
    settings: {threshold: 100}
  payer:
    handler: "invoices_mod:pay"
    subscribe: ["invoice.paid"]
expect:
  zero_lost: true
  custom: ["invoices_mod:nothing_held"]
"""

RAISE_THRESHOLD = "agents:\n  approver:\n    settings: {threshold: 500}\n"
AUTO = "approvals:\n  poll: 0.02\n  auto: {approve_after: 0.05, note: what-if}\n"


@pytest.fixture
def failed(tmp_path: Path) -> tuple[Path, str]:
    """A failed run of the invoice desk: the store and the session id."""
    folder = tmp_path / "invoice_desk"
    folder.mkdir()
    (folder / "invoices_mod.py").write_text(MODULE, encoding="utf-8")
    (folder / "invoices.jsonl").write_text(
        "".join(json.dumps(i) + "\n" for i in INVOICES), encoding="utf-8"
    )
    (folder / "scenario.yaml").write_text(SCENARIO, encoding="utf-8")
    store = tmp_path / "s.db"
    summary = asyncio.run(pantheon.run(folder / "scenario.yaml", store=store))
    assert [(e["name"], e["passed"], e["actual"]) for e in summary.expectations] == [
        ("zero lost", True, True),
        ("custom: invoices_mod:nothing_held", False, "4 invoices held"),
    ]
    return store, summary.session_id or ""


def approvals_of(store: Path, session: str) -> list[tuple[str, bool, str]]:
    """(invoice, approved, by) of every ``human.approval`` the session recorded."""
    with SessionStore(store, create=False) as st:
        effects = st.effects(session, name="human.approval")
        book = ApprovalBook(st)
        invoices = {a.id: a.request["invoice"] for a in book.entries(book.origin(session))}
    out = []
    for e in effects:
        d = decode(e.result)
        out.append((invoices.get(d["id"], "recorded"), d["approved"], d["by"]))
    return sorted(out)


def test_a_changed_approver_asks_again_and_the_overlays_scripted_person_decides(
    failed: tuple[Path, str],
) -> None:
    store, session = failed
    report = asyncio.run(pantheon.replay(session, store=store, with_=RAISE_THRESHOLD + AUTO))
    assert report.passed is True
    assert [(e["name"], e["passed"], e["actual"]) for e in report.expectations] == [
        ("zero lost", True, True),
        ("dead letters other than shed <= 0", True, 0),
        ("custom: invoices_mod:nothing_held", True, "passed"),
    ]
    assert report.summary.dlq == {} and report.summary.dead_letters == []
    assert report.summary.inputs == 5
    # The approver changed, so its approvals were asked anew, of the what-if's own desk:
    # only the two invoices over the new threshold, both by the overlay's scripted person.
    assert approvals_of(store, report.new_session_id) == [
        ("i4", True, "auto"),
        ("i5", True, "auto"),
    ]
    assert report.summary.topics["invoice.paid"] == 5
    with SessionStore(store, create=False) as st:
        info = st.session(report.new_session_id)
    assert info.status == "completed" and info.summary["passed"] is True
    assert [e["name"] for e in info.summary["expectations"]] == [
        e["name"] for e in report.expectations
    ]


def test_an_unchanged_approval_is_served_from_the_record_and_nobody_is_asked(
    failed: tuple[Path, str],
) -> None:
    store, session = failed
    report = asyncio.run(pantheon.replay(session, store=store, with_=AUTO))
    # Same approver, same invoices: the four recorded decisions (the timeout's rejections)
    # are served, the overlay's scripted person never asked, and the check still fails.
    with SessionStore(store, create=False) as st:
        assert ApprovalBook(st).entries(report.new_session_id) == []
        effects = st.effects(report.new_session_id, name="human.approval")
    served = [decode(e.result) for e in effects]
    assert [(d["approved"], d["by"]) for d in served] == [(False, "timeout")] * 4
    assert report.effects_called == 0
    assert report.passed is False
    assert report.expectations[-1] == {
        "name": "custom: invoices_mod:nothing_held",
        "passed": False,
        "expected": "pass",
        "actual": "4 invoices held",
        "state": "failed",
    }


def test_a_person_decides_the_whatifs_approvals_with_pantheon_approve(
    failed: tuple[Path, str], tmp_path: Path
) -> None:
    store, session = failed
    overlay = tmp_path / "changes.yaml"
    overlay.write_text(RAISE_THRESHOLD + "approvals:\n  timeout: 120\n  poll: 0.02\n")
    whatif = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "replay", session, "--with", str(overlay),
         "--store", str(store), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        # The approver handles one invoice at a time: each request waits for its person.
        deadline = time.monotonic() + 60
        decided: dict[str, str] = {}
        new = ""
        while time.monotonic() < deadline and len(decided) < 2:
            assert whatif.poll() is None, whatif.communicate()
            time.sleep(0.05)
            with SessionStore(store, create=False) as st:
                forks = [s for s in st.sessions() if s.forked_from == session]
                rows = ApprovalBook(st).entries(forks[0].id, status="pending") if forks else []
            for a in rows:
                new = a.session
                invoice = a.request["invoice"]
                verdict = ["--by", "ann"] if invoice == "i4" else ["--reject", "--by", "bob"]
                done = cli("approve", new, str(a.id), *verdict, "--store", str(store),
                           cwd=tmp_path)  # fmt: skip
                assert done.returncode == 0, done.stderr
                decided[invoice] = a.summary
        assert decided == {"i4": "pay 800 to dyna", "i5": "pay 1200 to echo"}
        out, err = whatif.communicate(timeout=120)
    finally:
        if whatif.poll() is None:
            whatif.kill()
            whatif.communicate()
    # One invoice held by bob: the custom check fails, and so does the what-if (exit 1).
    assert whatif.returncode == 1, err
    report = json.loads(out)
    assert report["new_session_id"] == new and report["passed"] is False
    assert [(e["name"], e["passed"], e["actual"]) for e in report["expectations"]] == [
        ("zero lost", True, True),
        ("dead letters other than shed <= 0", True, 0),
        ("custom: invoices_mod:nothing_held", False, "1 invoices held"),
    ]
    assert report["dlq"] == {} and report["not_judged"] == []
    assert approvals_of(store, new) == [("i4", True, "ann"), ("i5", False, "bob")]


def test_the_cli_prints_every_expectation_and_exits_by_them(
    failed: tuple[Path, str], tmp_path: Path
) -> None:
    store, session = failed
    fix = tmp_path / "fix.yaml"
    fix.write_text(RAISE_THRESHOLD + AUTO)
    out = cli("replay", session, "--with", str(fix), "--store", str(store), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "dead letters 0" in lines
    assert "PASS custom: invoices_mod:nothing_held (actual passed)" in lines
    assert "PASS dead letters other than shed <= 0 (actual 0)" in lines
    assert lines[-2] == "all expectations passed"

    # An added agent that fails every invoice it sees: its dead letters fail the what-if,
    # counted by reason and explained, although the custom check passes.
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        RAISE_THRESHOLD
        + AUTO
        + "add_agents:\n  audit:\n    handler: invoices_mod:explode\n"
        + "    subscribe: [invoice.paid]\n"
    )
    out = cli("replay", session, "--with", str(broken), "--store", str(store), cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "dead letters 5 (5 failed)" in lines
    assert any(
        line.startswith("  5 x audit (failed), e.g. RuntimeError: cannot audit i") for line in lines
    )
    assert "FAIL dead letters other than shed <= 0 (actual 5)" in lines
    assert "PASS custom: invoices_mod:nothing_held (actual passed)" in lines
    assert lines[-2] == "expectations failed"
