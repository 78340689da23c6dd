"""``pantheon dlq redrive`` through a team that asks for approval, in a domain of its own: an
invoice team written into the test's folder (a Checker that an incident makes flaky, an
Approver that asks a person above a limit, a Payer whose bank refuses large sums when told
to). The redrive's team gets the approval desk of the redrive's own session, as under
``pantheon run``, and an entry counts as redriven only when nothing it caused in the
redrive was dead-lettered: the exit code, the text and ``--json`` say which did."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from approval_run import WAIT, stop
from cli_run import pantheon
from invoice_team import recorded_run, write_team

from pantheon.sessions import ApprovalBook, SessionStore, StoredDeadLetter


def invoice_of(store: Path, sid: str, letter: StoredDeadLetter) -> dict[str, Any]:
    """The invoice a dead letter carries."""
    with SessionStore(store, create=False) as st:
        env = next(e for e in st.envelopes(sid) if e.id == letter.envelope_id)
    return dict(env.payload)


def amount_of(store: Path, sid: str, letter: StoredDeadLetter) -> float:
    return float(invoice_of(store, sid, letter)["amount"])


def the_redrive(store: Path) -> str:
    with SessionStore(store, create=False) as st:
        return next(s.id for s in st.sessions() if s.kind == "redrive")


def test_a_redrive_asks_its_own_desk_and_the_scripted_person_decides(tmp_path: Path) -> None:
    store, sid, letters = recorded_run(tmp_path)
    assert letters and {d.subscriber for d in letters} == {"checker"}
    asking = [d for d in letters if amount_of(store, sid, d) > 1_000]
    assert asking, "some invoices the incident dead-lettered need a person's approval"

    # At 60 columns, where the line naming the new session is longer than the terminal:
    # whole all the same, for a person to copy the session from.
    done = pantheon("dlq", "redrive", sid, "--store", str(store), cwd=tmp_path, columns=60)
    n = len(letters)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{n} of {n} redriven, 0 failed again" in done.stdout
    assert "new dead letter" not in done.stdout
    redrive = the_redrive(store)
    assert f"redriving {n} dead letters of {sid} as session {redrive}" in done.stderr.splitlines()
    with SessionStore(store, create=False) as st:
        assert st.dead_letters(redrive) == []
        assert all(d.redriven_by == redrive for d in st.dead_letters(sid))
        assert st.session(redrive).summary["redrive"]["ok"] is True
        paid = [e.payload["invoice_id"] for e in st.envelopes(redrive) if e.topic == "invoice.paid"]
        book = ApprovalBook(st)
        asked = book.entries(book.origin(redrive))
    assert len(paid) == n
    # Asked on the redrive's session, and decided there by the scenario's scripted person.
    assert sorted(a.request["invoice_id"] for a in asked) == sorted(
        invoice_of(store, sid, d)["id"] for d in asking
    )
    assert {(a.session, a.status, a.decided_by, a.note) for a in asked} == {
        (redrive, "approved", "auto", "scripted")
    }


def test_a_redrive_whose_messages_die_downstream_counts_them_failed(tmp_path: Path) -> None:
    # The bank refuses 6,000 and more: the Payer dead-letters those in the run, and again
    # after a redriven Checker entry's invoice is approved in the redrive.
    store, sid, letters = recorded_run(tmp_path, bank_limit=6_000)
    refused = {d.entry_id for d in letters if amount_of(store, sid, d) >= 6_000}
    downstream = {d.entry_id for d in letters if d.subscriber == "checker"} & refused
    assert downstream, "some Checker entries are invoices the bank refuses"
    assert {d.entry_id for d in letters if d.subscriber == "payer"} <= refused

    done = pantheon("dlq", "redrive", sid, "--store", str(store), "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    n, failed = len(letters), len(refused)
    assert report["ok"] is False
    assert set(report["failed"]) == refused and set(report["downstream"]) == downstream
    assert set(report["redriven"]) == {d.entry_id for d in letters} - refused
    assert report["outcome"] == (
        f"{n - failed} of {n} redriven, {failed} failed again ({len(downstream)} downstream)"
    )
    for entry in downstream:
        assert report["outcomes"][str(entry)].startswith("failed downstream: #")
        assert (
            "payer on invoice.decided: failed: RuntimeError: the bank refuses"
            in (report["outcomes"][str(entry)])
        )
    # Every new dead letter is the redrive session's, named by its number there and by the
    # entry whose redelivery led to it (the Payer's own entries, or the Checker's above).
    redrive = report["new_session_id"]
    with SessionStore(store, create=False) as st:
        recorded = {d.entry_id: d for d in st.dead_letters(redrive)}
        assert not any(d.redriven for d in st.dead_letters(sid) if d.entry_id in refused)
        invoices = {e.id: e.payload for e in st.envelopes(redrive)}
        originals = {e.id: e.payload for e in st.envelopes(sid)}
    new = report["new_dead_letters"]
    assert {d["entry_id"] for d in new} == set(recorded) and len(new) == failed
    by_entry = {d.entry_id: d for d in letters}
    for d in new:
        assert d["subscriber"] == "payer" and d["caused_by"] in refused
        paid_for = invoices[recorded[d["entry_id"]].envelope_id]["id"]
        assert paid_for == originals[by_entry[d["caused_by"]].envelope_id]["id"]

    # Redriven again, the same entries fail the same way, and the text says so.
    done = pantheon("dlq", "redrive", sid, "--store", str(store), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert f"0 of {failed} redriven, {failed} failed again ({len(downstream)} downstream)" in out
    assert f"{failed} new dead letters in " in out and "see pantheon dlq list" in out
    for entry in downstream:
        assert f"entry {entry}: failed downstream: #" in out


def decide_while(
    proc: subprocess.Popen[str], store: Path, kind: str, decide: Callable[[str, int], None]
) -> tuple[list[int], str, str]:
    """Until ``proc`` ends: ``decide(session, request id)`` every pending request of the
    newest session of ``kind``; returns the ids decided and ``proc``'s output."""
    decided: list[int] = []
    deadline = time.monotonic() + 2 * WAIT
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, f"pantheon ({kind}) did not finish"
            if not store.exists():
                time.sleep(0.05)
                continue
            with SessionStore(store, create=False) as st:
                sessions = [s for s in st.sessions() if s.kind == kind]
                book = ApprovalBook(st)
                rows = (
                    book.entries(book.origin(sessions[0].id), status="pending") if sessions else []
                )
            for row in rows:
                decide(row.session, row.id)
                decided.append(row.id)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            stop(proc)
    return decided, out, err


def test_a_person_approves_a_redrive_s_requests_with_pantheon_approve(tmp_path: Path) -> None:
    # Nobody scripted: a request waits two minutes for a person, then is rejected.
    scenario = write_team(tmp_path, approvals="{timeout: 120, default: reject, poll: 0.05}")
    store = tmp_path / "s.db"
    run = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "run", str(scenario), "--store", str(store)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def in_process(session: str, rid: int) -> None:
        with SessionStore(store, create=False) as st:
            book = ApprovalBook(st)
            book.decide(book.origin(session), rid, approved=True, note="ok", by="clerk")

    _, out, err = decide_while(run, store, "run", in_process)
    assert run.returncode == 0, out + err
    with SessionStore(store, create=False) as st:
        sid = st.sessions()[0].id
        letters = st.dead_letters(sid)
    asking = [d for d in letters if amount_of(store, sid, d) > 1_000]
    assert asking

    redrive = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "dlq", "redrive", sid, "--store", str(store)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def by_cli(session: str, rid: int) -> None:
        done = pantheon(
            "approve", session, str(rid), "--by", "ann", "--store", str(store), cwd=tmp_path
        )
        assert done.returncode == 0, done.stdout + done.stderr

    approved, out, err = decide_while(redrive, store, "redrive", by_cli)
    assert redrive.returncode == 0, out + err
    n = len(letters)
    assert f"{n} of {n} redriven, 0 failed again" in out
    assert len(approved) == len(asking)
    with SessionStore(store, create=False) as st:
        book = ApprovalBook(st)
        rows = book.entries(book.origin(the_redrive(store)))
    assert {(r.status, r.decided_by) for r in rows} == {("approved", "ann")}


def test_a_redrive_with_nothing_left_to_redrive_records_no_session(tmp_path: Path) -> None:
    store, sid, letters = recorded_run(tmp_path)
    n = len(letters)
    assert n > 1
    first = pantheon("dlq", "redrive", sid, "--store", str(store), cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    again = pantheon("dlq", "redrive", sid, "--store", str(store), cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.splitlines() == [
        f"nothing to redrive: all {n} dead letters of {sid} are redriven already"
    ]
    as_json = pantheon("dlq", "redrive", sid, "--store", str(store), "--json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["new_session_id"] is None and report["attempted"] == 0 and report["ok"]
    # The first redrive only: the two that had nothing to do left no session to list.
    with SessionStore(store, create=False) as st:
        assert [s.kind for s in st.sessions()] == ["redrive", "run"]


def test_sessions_list_says_a_redrive_failed_again_rather_than_completed(tmp_path: Path) -> None:
    store, sid, letters = recorded_run(tmp_path, bank_limit=6_000)
    refused = sum(amount_of(store, sid, d) >= 6_000 for d in letters)
    n = len(letters)
    assert 0 < refused < n
    done = pantheon("dlq", "redrive", sid, "--store", str(store), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    outcome = f"{n - refused} of {n} redriven, {refused} failed again"
    assert outcome in done.stdout
    redrive = the_redrive(store)
    listed = pantheon("sessions", "list", "--store", str(store), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if redrive in line]
    assert f" {refused} failed again " in row and "completed" not in row, row
    (run_row,) = [
        line for line in listed.stdout.splitlines() if sid in line and "redrive" not in line
    ]
    assert "completed" in run_row, run_row
    # As the redrive said it: with "(D downstream)" when some redelivered entries' own
    # messages died further on (the bank's refusals, for entries that reach it again).
    said = re.search(re.escape(outcome) + r"( \(\d+ downstream\))?", done.stdout)
    assert said is not None
    shown = pantheon("sessions", "show", redrive, "--store", str(store), cwd=tmp_path)
    assert shown.stdout.splitlines()[0].split() == [redrive, "redrive", *said[0].split()]
