"""A run that waits for a person says so, and how to decide: ``pantheon run``, ``pantheon
dlq redrive``, ``pantheon resume`` and a what-if ``pantheon replay --with`` name their
session and, once a request has waited a second, print the ``pantheon approve`` command of
each. The tests act as the person: they paste the commands printed, in a terminal (a pty:
the session is in the progress bar) and when the output is a pipe."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import claims_team
import pytest
from approval_run import WAIT, scenario, stop
from cli_run import pantheon
from invoice_team import write_team
from said_lines import Said, approve_as_printed
from store_poll import query, until

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


#: The claims team's approvals with nobody scripted: a request waits two minutes, then is
#: rejected.
NOBODY = "approvals: {timeout: 120, default: reject, poll: 0.05}"


def claims_asking_last(folder: Path) -> Path:
    """The claims team (one process) whose Approver asks a person only about the last two
    claims (8,700 and 8,900 EUR), two at a time, and nobody decides: a run of it ends up
    waiting on both with everything else decided."""
    path = claims_team.write_team(folder, concurrency=2)
    text = re.sub(r"(?m)^approvals: .*$", NOBODY, path.read_text())
    approver = '    class: "claims_agents:Approver"\n'
    assert approver in text
    text = text.replace(approver, approver + "    settings: {limit: 8600}\n")
    path.write_text(text)
    return path


def test_a_resume_names_its_new_session_and_the_commands_of_the_requests_it_asks_again(
    tmp_path: Path,
) -> None:
    """``pantheon resume`` of a claims run killed while two requests waited asks them again
    and waits on them: it names the session it records from the start and prints the
    command of each, as ``pantheon run`` does; before, it said nothing and looked hung."""
    path = claims_asking_last(tmp_path)
    store = tmp_path / "s.db"
    run = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "run", str(path), "--store", "s.db", "--json"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        until(
            "38 claims decided and two requests waiting",
            lambda: (
                query(store, "SELECT count(*) FROM envelopes WHERE topic = 'claim.decided'")
                == [(38,)]
                and query(store, "SELECT count(*) FROM approvals WHERE status = 'pending'")
                == [(2,)]
            ),
        )
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=WAIT)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    with SessionStore(store) as st:  # opening it finds the process gone: aborted
        (info,) = st.sessions()
        assert info.status == "aborted"
        sid = info.id
        asked = {a.id: a.summary for a in ApprovalBook(st).entries(sid)}
    assert sorted(asked.values()) == ["pay 8700.00 EUR (C-37)", "pay 8900.00 EUR (C-39)"]

    # At 60 columns: the lines naming a session are longer, and whole all the same.
    resume = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "resume", sid, "--store", "s.db"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"COLUMNS": "60"},
    )  # fmt: skip
    try:
        said = Said(resume.stderr)
        new = said.expect(rf"resuming {sid} as session (\S+)$", WAIT)[1]
        said.expect(r"2 approval requests wait for a person", WAIT)
        assert said.lines[-1] == (
            "2 approval requests wait for a person (each rejected after 120s undecided):"
        )
        commands = [said.expect("  ", WAIT).string for _ in range(3)]
        assert commands == [
            *(
                f"  pantheon approve {new} {n} --store s.db   # approver: {asked[n]}"
                for n in sorted(asked)
            ),
            f"  --reject refuses; pantheon approvals {new} --store s.db lists them",
        ]
        for line in commands[:2]:
            done = approve_as_printed(line, tmp_path, "--by", "ann")
            assert done.returncode == 0, done.stdout + done.stderr
        out, _ = resume.communicate(timeout=WAIT)  # stderr was read to its end already
        said.until_end(WAIT)
    finally:
        if resume.poll() is None:
            stop(resume)
    assert resume.returncode == 0, out + "\n".join(said.lines)
    assert out.splitlines()[0].startswith(f"resumed {sid} as {new}: 42 recorded inputs re-run")
    with SessionStore(store, create=False) as st:
        assert (st.session(new).kind, st.session(new).replay_of) == ("resume", sid)
        rows = ApprovalBook(st).entries(sid)  # the resume's requests are the run's
    assert {(r.id, r.status, r.decided_by, r.session) for r in rows} == {
        (n, "approved", "ann", new) for n in asked
    }


def test_a_whatif_names_the_commands_of_the_requests_its_changed_team_asks(
    tmp_path: Path,
) -> None:
    """A what-if whose changed Approver asks about claims the recorded one never asked
    about (a lower limit), with nobody scripted to answer: each new request waits for a
    person, and the replay prints its command on the new session, one at a time as the
    Approver asks them (it handles one claim at a time)."""
    path = claims_team.write_team(tmp_path)  # its scripted person approves every request
    recorded = pantheon("run", str(path), "--store", "s.db", "--json", cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stderr
    sid = json.loads(recorded.stdout)["session_id"]
    (tmp_path / "change.yaml").write_text(
        "approvals: {auto: null, poll: 0.05}\nagents:\n  approver:\n    settings: {limit: 500}\n"
    )
    whatif = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "replay", sid, "--with", "change.yaml",
         "--store", "s.db"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env(),
    )  # fmt: skip
    command = r"  pantheon approve (\S+) (\d+) --store s\.db   # approver: (.*)$"
    printed: list[tuple[str, str, str]] = []
    try:
        said = Said(whatif.stderr)
        while (line := said.expect_or_end(command, WAIT)) is not None:
            done = approve_as_printed(line.string, tmp_path, "--by", "ann")
            assert done.returncode == 0, done.stdout + done.stderr
            printed.append((line[1], line[2], line[3]))
        out, _ = whatif.communicate(timeout=WAIT)  # stderr was read to its end already
    finally:
        if whatif.poll() is None:
            stop(whatif)
    assert whatif.returncode == 0, out + "\n".join(said.lines)
    new = re.search(rf"what-if replay of {sid} with change.yaml recorded as (\S+):", out)
    assert new is not None, out
    # The four claims between the two limits, asked (and named) one after another.
    assert printed == [
        (new[1], str(n), f"pay {amount:.2f} EUR (C-{i})")
        for n, (i, amount) in enumerate([(32, 520), (34, 540), (36, 560), (38, 580)], 1)
    ]
    first = [line for line in said.lines if "approval request" in line]
    assert first == [
        "1 approval request waits for a person (each rejected after 120s undecided):",
        *["1 more approval request waits (1 in all):"] * 3,
    ]
    with SessionStore(tmp_path / "s.db", create=False) as st:
        rows = ApprovalBook(st).entries(new[1])
    assert [(r.status, r.decided_by) for r in rows] == [("approved", "ann")] * 4
