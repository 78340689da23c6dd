"""Approvals a multi-process run leaves undecided when it stops are nobody's decision.

The expense-claims team (``claims_team``, its first ten claims) with its Approver on node
``desk`` asks a person (nobody scripted, no timeout within the test) about every claim over
its limit; the payer on node ``bank`` pays each approved claim through a bank tool that
writes a line to ``bank.log``, so a claim paid twice, or never, shows.

* ``pantheon run`` is interrupted (Ctrl-C twice) while requests wait: they stay ``pending``
  (they were once ``rejected`` by ``node-lost``, the driver's note for a node it lost, and
  ``pantheon resume`` served those rejections as decisions: the claims went unpaid);
* a NATS run's node dies while requests wait: those are cancelled (``node-lost``: nobody
  in that run acts on them), and a resume asks them again rather than serving the
  cancellation as a person's answer.

Every process is real; the NATS server is the test's own, on a free port."""

from __future__ import annotations

import collections
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from approval_run import WAIT, resume_approving
from claims_team import write_team
from cli_run import pantheon
from interrupting import run_and_interrupt

from bus.backends.nats import NatsServer
from pantheon.approvals._relay import LOST_BY
from pantheon.sessions import Approval, ApprovalBook, SessionStore
from pantheon.sessions._codec import decode

#: Claims in the input: the team's first ten (its one invalid record comes after them).
KEPT = 10
#: Every claim of the input, and those over the Approver's limit (a person decides those).
ALL = {f"C-{i:02d}" for i in range(KEPT)}
ASKED = {f"C-{i:02d}" for i in range(1, KEPT, 2)}
#: The Approver's concurrency: as many requests wait at once.
WAITING = 3
#: The bank tool, writing each payment to ``bank.log`` beside the team's module.
BANK = """def _bank(claim):
    from pathlib import Path

    with (Path(__file__).resolve().parent / "bank.log").open("a") as log:
        log.write(claim["id"] + "\\n")
    return {"paid": claim["id"]}
"""


@pytest.fixture
def nats_url() -> Iterator[str]:
    """This test's own ``nats-server -js``: a resume reads the run's stream back."""
    server = NatsServer().start()
    try:
        yield server.url
    finally:
        server.stop()


def claims_team(folder: Path, transport: str, kill: str | None = None) -> Path:
    """The claims team on ``transport`` (``{kind: ..., ...}`` without ``nodes``), asking a
    person alone (five minutes before the timeout would reject), paying through
    :data:`BANK`, with no fault but ``kill`` (``faults.kill_node``)."""
    path = write_team(folder, monitor=False, concurrency=WAITING, max_dlq=0, kill=kill)
    text = path.read_text()
    placement = "nodes: {checks: [intake], desk: [approver], bank: [payer]}"
    for old, new in (
        ("approvals: {timeout: 120, default: reject, auto: {approve_after: 0.2}}",
         "approvals: {timeout: 300, default: reject, poll: 0.05}"),
        ("  agents:\n    payer: {failure_rate: 0.3}\n", "  agents: {}\n"),
    ):  # fmt: skip
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text + f"transport: {transport[:-1]}, {placement}}}\n")
    claims = folder / "claims.jsonl"
    lines = claims.read_text().splitlines(keepends=True)
    assert [json.loads(line)["id"] for line in lines[:KEPT]] == sorted(ALL)
    claims.write_text("".join(lines[:KEPT]))
    agents = folder / "claims_agents.py"
    code = agents.read_text()
    old = 'def _bank(claim):\n    return {"paid": claim["id"]}\n'
    assert old in code
    agents.write_text(code.replace(old, BANK))
    return path


def rows(store: Path) -> tuple[str, list[Approval]] | None:
    """The newest run session and every approval under it, oldest first."""
    if not store.exists():
        return None
    with SessionStore(store, create=False) as st:
        runs = [s for s in st.sessions() if s.kind == "run"]
        if not runs:
            return None
        book = ApprovalBook(st)
        return runs[0].id, book.entries(book.origin(runs[0].id))


def states(store: Path, session: str) -> dict[int, tuple[str, str, str | None]]:
    """Each approval of ``session``: (claim, status, who decided)."""
    with SessionStore(store, create=False) as st:
        book = ApprovalBook(st)
        entries = book.entries(book.origin(session))
    return {a.id: (a.request["claim_id"], a.status, a.decided_by) for a in entries}


def paid(folder: Path) -> collections.Counter[str]:
    """Each claim the bank paid, as often as it paid it."""
    log = folder / "bank.log"
    return collections.Counter(log.read_text().split() if log.exists() else ())


def stored_payments(store: Path, session: str) -> set[str]:
    """The claims whose payment the session's record holds (shipped by node ``bank``)."""
    with SessionStore(store, create=False) as st:
        return {decode(e.result)["paid"] for e in st.effects(session, name="tool.bank")}


def approve(folder: Path, session: str, approval: int) -> None:
    ok = pantheon("approve", session, str(approval), "--by", "ann", "--store", "s.db",
                  cwd=folder, timeout=WAIT)  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr


def one_decided_then_waiting(folder: Path) -> Callable[[], bool]:
    """When to press Ctrl-C, as QA did: a person has approved the first request, and its
    claim's payment is in the record, as is every payment made (so none is made again by
    a resume for want of its record), while :data:`WAITING` more requests wait."""
    store = folder / "s.db"
    approved: list[int] = []

    def ready() -> bool:
        got = rows(store)
        if got is None:
            return False
        session, entries = got
        waiting = [a for a in entries if a.pending]
        if not approved:
            if len(waiting) < WAITING:
                return False
            approve(folder, session, entries[0].id)
            approved.append(entries[0].id)
            return False
        first = entries[0].request["claim_id"]
        made = set(paid(folder))
        return len(waiting) == WAITING and first in made and made == stored_payments(store, session)

    return ready


def interrupt_while_waiting(folder: Path) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Run the team and press Ctrl-C twice once :func:`one_decided_then_waiting`."""
    done = run_and_interrupt(
        folder, "claims.yaml", one_decided_then_waiting(folder), "three requests waiting",
        times=2,
    )  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert "interrupted at once" in done.stdout + done.stderr
    # The driver says what became of them; it cancels nothing.
    assert (
        "left pending: the run was interrupted before a decision reached node 'desk'; "
        "nobody decided it" in done.stderr
    )
    assert "nobody acts on this request" not in done.stderr
    got = rows(folder / "s.db")
    assert got is not None
    return got[0], done


def assert_nobody_decided_the_rest(folder: Path, session: str) -> None:
    """#1 approved by the person; the requests that waited are still pending, nobody's."""
    got = states(folder / "s.db", session)
    assert sorted(got) == [1, 2, 3, 4], got
    assert got[1][1:] == ("approved", "ann")
    assert {k: v[1:] for k, v in got.items() if k != 1} == {n: ("pending", None) for n in (2, 3, 4)}
    # The Approver takes claims in order: the first four over the limit.
    assert {claim for claim, _, _ in got.values()} == {"C-01", "C-03", "C-05", "C-07"}
    listed = pantheon("approvals", session, "--pending", "--store", "s.db", cwd=folder)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("approver@desk") == 3 and LOST_BY not in listed.stdout


def assert_finished_once(folder: Path, session: str, summary: dict[str, Any]) -> None:
    """The resumed run decided and paid every claim once, every request approved by the
    person once, none by anyone else."""
    assert summary["passed"] is True, summary["expectations"]
    assert summary["dlq"] == {}, summary["dead_letters"]
    got = states(folder / "s.db", session)
    assert sorted(got) == list(range(1, len(ASKED) + 1))
    assert collections.Counter(claim for claim, _, _ in got.values()) == dict.fromkeys(ASKED, 1)
    assert {v[1:] for v in got.values()} == {("approved", "ann")}
    assert paid(folder) == dict.fromkeys(ALL, 1)
    with SessionStore(folder / "s.db", create=False) as st:
        decided = collections.Counter(
            (e.payload["id"], e.payload["decision"])
            for e in st.envelopes(summary["session_id"])
            if e.topic == "claim.decided"
        )
    assert decided == {(claim, "approve"): 1 for claim in ALL}


def test_a_nats_run_interrupted_while_approvals_wait_leaves_them_to_its_resume(
    tmp_path: Path, nats_url: str
) -> None:
    claims_team(tmp_path, f"{{kind: nats, url: {nats_url}}}")
    session, done = interrupt_while_waiting(tmp_path)
    assert f"pantheon resume {session} finishes it" in done.stdout + done.stderr
    assert_nobody_decided_the_rest(tmp_path, session)

    # The person decides each request the resume asks, the interrupted run's first.
    summary, decided = resume_approving(tmp_path, session)
    assert decided[:3] == [2, 3, 4]
    assert summary["resume"]["original_session_id"] == session
    assert_finished_once(tmp_path, session, summary)


def test_a_zeromq_run_interrupted_while_approvals_wait_leaves_them_pending(
    tmp_path: Path,
) -> None:
    """Its nodes' records end with the cut, so it cannot be resumed; its requests still
    say that nobody decided them."""
    claims_team(tmp_path, '{kind: zmq, broker: "tcp://127.0.0.1:0"}')
    session, _ = interrupt_while_waiting(tmp_path)
    assert_nobody_decided_the_rest(tmp_path, session)
    refused = pantheon("resume", session, "--store", "s.db", cwd=tmp_path)
    assert refused.returncode == 2
    assert "is a ZeroMQ run" in refused.stderr
    assert states(tmp_path / "s.db", session)[2][1] == "pending"


def test_a_resume_asks_again_what_a_dead_node_left_undecided(tmp_path: Path, nats_url: str) -> None:
    """The scenario kills the Approver's node while its first requests wait: the run
    cancels them (``node-lost``: nobody in it will act on them) and ends with their claims
    in the stream. The resume asks them again, and the person's answers are the ones
    that count."""
    # ack_wait: what the dead node held is seen waiting (for nobody) after 2 s, not 30.
    claims_team(tmp_path, f"{{kind: nats, url: {nats_url}, ack_wait: 2}}", kill="desk, at: 3")
    run = pantheon("run", "claims.yaml", "--store", "s.db", "--json", cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    original = json.loads(run.stdout)
    session = original["session_id"]
    assert original["nodes"]["desk"]["status"] == "killed"
    got = states(tmp_path / "s.db", session)
    assert got == {
        1: ("C-01", "rejected", LOST_BY),
        2: ("C-03", "rejected", LOST_BY),
        3: ("C-05", "rejected", LOST_BY),
    }

    summary, decided = resume_approving(tmp_path, session)
    assert decided[:3] == [1, 2, 3]
    assert_finished_once(tmp_path, session, summary)
