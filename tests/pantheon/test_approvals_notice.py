"""A run that waits for a person says so, and how to decide: ``pantheon run`` and ``pantheon
dlq redrive`` name their session from the start and, once a request has waited a second,
print the ``pantheon approve`` command of each. The tests act as the person: they paste
the commands printed, in a terminal (a pty: the session is in the progress bar) and when
the output is a pipe."""

from __future__ import annotations

import dataclasses
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest
from approval_run import WAIT, scenario, stop
from invoice_team import write_team
from said_lines import Said, approve_as_printed

from pantheon.cli._common import approvals_notice
from pantheon.sessions import Approval, ApprovalBook, SessionStore

#: The approvals scenario with nobody scripted: its two refunds wait two minutes.
WAITING = "approvals:\n  timeout: 120\n  default: reject\n  poll: 0.05\n"
#: A notice's first line: how many wait, and what the timeout decides.
HEADER = (
    r"(?P<count>\d+) approval requests? waits? for a person "
    r"\(each rejected after 120s undecided\):$"
)
#: One of its commands, as a person pastes it.
COMMAND = r"  pantheon approve (?P<sid>\S+) (?P<id>\d+) --store s\.db   # guardian: refund "


def footer(session: str) -> str:
    """A notice's last line: the other choice, and where to see every request."""
    return f"  --reject refuses; pantheon approvals {session} --store s.db lists them"


def run_env() -> dict[str, str]:
    return os.environ | {"COLUMNS": "200"}


def decide_printed(said: Said, count: int, cwd: Path) -> tuple[set[str], list[int]]:
    """Paste each ``pantheon approve`` line the run prints until ``count`` requests are
    approved; returns the sessions the commands named and the numbers approved."""
    sessions: set[str] = set()
    approved: list[int] = []
    while len(approved) < count:
        line = said.expect(f"{HEADER}|{COMMAND}", WAIT)
        if line["count"] is not None:
            continue
        sessions.add(line["sid"])
        done = approve_as_printed(line.string, cwd, "--by", "ann")
        assert done.returncode == 0, done.stdout + done.stderr
        approved.append(int(line["id"]))
    return sessions, approved


def decided_by_ann(store: Path, session: str) -> None:
    with SessionStore(store, create=False) as st:
        book = ApprovalBook(st)
        rows = book.entries(book.origin(session))
    assert len(rows) == 2 and {(r.status, r.decided_by) for r in rows} == {("approved", "ann")}


def test_a_waiting_run_names_its_session_and_the_commands_on_a_pipe(tmp_path: Path) -> None:
    path = scenario(tmp_path, WAITING)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "run", str(path), "--store", "s.db"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env(),
    )  # fmt: skip
    try:
        said = Said(proc.stderr)
        sid = said.expect(r"approvals: session (\S+) started$", WAIT)[1]
        sessions, approved = decide_printed(said, 2, tmp_path)
        said.until_end(WAIT)
        out, _ = proc.communicate(timeout=WAIT)  # stderr was read to its end already
    finally:
        if proc.poll() is None:
            stop(proc)
    assert proc.returncode == 0, out + "\n".join(said.lines)
    assert sessions == {sid} and sorted(approved) == [1, 2]
    assert footer(sid) in said.lines
    assert out.splitlines()[0].split()[:3] == ["approvals", "session", sid]
    decided_by_ann(tmp_path / "s.db", sid)


def test_a_waiting_run_names_its_session_and_the_commands_in_a_terminal(tmp_path: Path) -> None:
    path = scenario(tmp_path, WAITING)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "run", str(path), "--store", "s.db"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=slave, text=True, env=run_env(),
    )  # fmt: skip
    os.close(slave)
    try:
        said = Said(fd=master)
        sessions, approved = decide_printed(said, 2, tmp_path)
        out, _ = proc.communicate(timeout=WAIT)
        said.until_end(WAIT)  # the rest of what the terminal showed
    finally:
        if proc.poll() is None:
            stop(proc)
        os.close(master)
    assert proc.returncode == 0, out
    (sid,) = sessions
    assert sorted(approved) == [1, 2]
    assert footer(sid) in said.lines
    # The progress bar named the session from the start, the line a pipe gets instead is
    # not printed, and the summary names it once the bar has gone.
    bar = [line for line in said.lines if ": emails in" in line]
    assert bar, said.lines
    assert [line for line in bar if not line.startswith(f"approvals {sid}: emails in")] == []
    assert not any("started" in line for line in said.lines), said.lines
    assert out.splitlines()[0].split()[:3] == ["approvals", "session", sid]
    decided_by_ann(tmp_path / "s.db", sid)


def approve_in_the_store(run: subprocess.Popen[str], store: Path) -> None:
    """Until ``run`` ends, approve each request of the newest session as it comes (the
    person of the run a redrive follows: not what is tested here)."""
    deadline = time.monotonic() + 2 * WAIT
    while run.poll() is None:
        assert time.monotonic() < deadline, "the run did not finish"
        if store.exists():
            with SessionStore(store, create=False) as st:
                book = ApprovalBook(st)
                sessions = st.sessions()  # none yet: the run has made the store, not its row
                pending = (
                    book.entries(book.origin(sessions[0].id), status="pending") if sessions else []
                )
                for row in pending:
                    book.decide(row.origin, row.id, approved=True, note="", by="clerk")
        time.sleep(0.05)


def test_a_waiting_redrive_names_its_new_session_and_the_commands(tmp_path: Path) -> None:
    path = write_team(tmp_path, approvals="{timeout: 120, default: reject, poll: 0.05}")
    store = tmp_path / "s.db"
    run = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "run", str(path), "--store", "s.db", "--json"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        approve_in_the_store(run, store)
    finally:
        stop(run)
    assert run.returncode == 0
    with SessionStore(store, create=False) as st:
        sid = st.sessions()[0].id
        letters = st.dead_letters(sid)
        payloads = {e.id: e.payload for e in st.envelopes(sid)}
    asking = [d for d in letters if payloads[d.envelope_id]["amount"] > 1_000]
    assert asking, "some dead-lettered invoices need a person's approval"

    n = len(letters)
    redrive = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "dlq", "redrive", sid, "--store", "s.db"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env(),
    )  # fmt: skip
    approved: list[str] = []
    try:
        said = Said(redrive.stderr)
        new = said.expect(rf"redriving {n} dead letters of {sid} as session (\S+)$", WAIT)[1]
        # The redrive delivers one entry at a time: each asking one waits alone.
        command = rf"  pantheon approve {new} (\d+) --store s\.db   # approver: pay "
        while (line := said.expect_or_end(command, WAIT)) is not None:
            done = approve_as_printed(line.string, tmp_path, "--by", "ann")
            assert done.returncode == 0, done.stdout + done.stderr
            approved.append(line[1])
        out, _ = redrive.communicate(timeout=WAIT)  # stderr was read to its end already
    finally:
        if redrive.poll() is None:
            stop(redrive)
    assert redrive.returncode == 0, out + "\n".join(said.lines)
    assert f"redrive of {sid} recorded as {new}" in out
    assert f"{n} of {n} redriven, 0 failed again" in out
    assert len(approved) == len(asking)
    assert "1 approval request waits for a person (each rejected after 120s undecided):" in (
        said.lines
    )
    with SessionStore(store, create=False) as st:
        book = ApprovalBook(st)
        rows = book.entries(book.origin(new))
    assert {(r.status, r.decided_by) for r in rows} == {("approved", "ann")}


def _asked(n: int) -> Approval:
    now = time.time() - 2
    return Approval(
        origin="S", id=n, key=f"k{n}", session="S", agent="guardian", summary=f"refund {n}",
        request={}, asked=now, deadline=now + 120, default_approve=False, status="pending",
        note="", decided_by=None, decided=None,
    )  # fmt: skip


def test_a_notice_names_five_new_requests_and_counts_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    notice = approvals_notice(tmp_path / "s.db")
    notice([_asked(i) for i in range(1, 8)])
    first = capsys.readouterr().err.splitlines()
    assert first[0] == "7 approval requests wait for a person (each rejected after 120s undecided):"
    assert first[1:6] == [
        f"  pantheon approve S {i} --store s.db   # guardian: refund {i}" for i in range(1, 6)
    ]
    assert first[6:] == [
        "  and 2 more; --reject refuses; pantheon approvals S --store s.db lists them"
    ]
    notice([_asked(i) for i in range(1, 9)])  # one more joined: only it is news
    assert capsys.readouterr().err.splitlines() == [
        "1 more approval request waits (8 in all):",
        "  pantheon approve S 8 --store s.db   # guardian: refund 8",
    ]
    unrecorded = approvals_notice(None)
    unrecorded([_asked(1)])
    assert capsys.readouterr().err.splitlines() == [
        "1 approval request waits for a person, but nobody can decide it: the run is not "
        "recorded (--no-record), so each is rejected after 120s"
    ]


def test_a_notice_shows_as_much_of_a_summary_as_the_terminal_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What tells two requests apart is often at the end of their summaries (QA: "restart
    nginx on web1: A-1-…" twice, cut at a fixed width in a 150-column terminal)."""
    from pantheon.cli import _common

    monkeypatch.chdir(tmp_path)
    long = "triage: restart nginx on web1 for A-1 after the disk filled up"  # 62 characters
    request = dataclasses.replace(_asked(1), agent="triage", summary=long[len("triage: ") :])
    for width, shown in ((150, long), (60, long[:35] + "…")):
        monkeypatch.setattr(_common.console, "width", width)
        _common.approvals_notice(tmp_path / "s.db")([request])
        lines = capsys.readouterr().err.splitlines()
        assert lines[1] == f"  pantheon approve S 1 --store s.db   # {shown}", (width, lines)
