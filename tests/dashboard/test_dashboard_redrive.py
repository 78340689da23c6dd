"""The session page's redrive, under ``AppTest``, through a team that asks a person: a real
``pantheon dlq redrive`` in the background, whose approval requests wait for whoever decides,
here the page itself.

The invoice team (``tests/_support/invoice_team.py``) is recorded once with an incident
(a flaky Checker) and a bank that refuses 6,000 EUR and more; every request of that run is
approved by a person in this process as it comes. Redriven, the Checker's entries over
1,000 EUR ask again, on the redrive's session, and wait two minutes for a person: longer
than a page may block. Those the bank refuses fail downstream.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from approval_run import WAIT
from invoice_team import person_run
from streamlit.testing.v1 import AppTest

from dashboard.web import APP
from dashboard.web._jobs import RedriveJob, redrive_bound
from pantheon.approvals._desk import who
from pantheon.readmodel import redrive_outcome
from pantheon.sessions import (
    DEFAULT_REPLAY_TIMEOUT,
    STORE_ENV,
    ApprovalBook,
    SessionStore,
    StoredDeadLetter,
)

#: Seconds one render of the page may take: a page that blocks on the redrive fails here.
RENDER_S = 30.0


@pytest.fixture(scope="module")
def invoices(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The store of the recorded invoice run, and its session."""
    return person_run(tmp_path_factory.mktemp("invoices"))


@pytest.fixture
def copy(invoices: tuple[Path, str], tmp_path: Path) -> Path:
    """A private copy of the recorded store (SQLite's backup API: WAL content included)."""
    dst_path = tmp_path / "s.db"
    src, dst = sqlite3.connect(invoices[0]), sqlite3.connect(dst_path)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return dst_path


def _letters(store: Path, sid: str) -> list[StoredDeadLetter]:
    with SessionStore(store, create=False) as st:
        return st.dead_letters(sid)


def _amounts(store: Path, sid: str) -> dict[int, float]:
    """Each dead letter's invoice amount, by entry."""
    with SessionStore(store, create=False) as st:
        payloads = {e.id: e.payload for e in st.envelopes(sid)}
        return {d.entry_id: float(payloads[d.envelope_id]["amount"]) for d in st.dead_letters(sid)}


def _page(store: Path, sid: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(STORE_ENV, str(store))
    at = AppTest.from_file(str(APP), default_timeout=RENDER_S)
    at.query_params["session"] = sid
    at.run()
    assert not at.exception, at.exception
    return at


def _texts(at: AppTest) -> list[str]:
    return [e.value for kind in (at.error, at.success, at.info, at.warning) for e in kind]


def _until(at: AppTest, done: Callable[[AppTest], bool], act: Callable[[AppTest], None]) -> None:
    """Re-render (doing ``act`` on each render) until ``done``; fail at the deadline."""
    deadline = time.monotonic() + 2 * WAIT
    while True:
        at.run()
        assert not at.exception, at.exception
        if done(at):
            return
        act(at)
        assert time.monotonic() < deadline, f"not done; the page says: {_texts(at)}"
        time.sleep(0.2)  # polling interval, not synchronisation: the deadline decides


def _result(at: AppTest) -> str | None:
    return next(
        (e.value for e in [*at.error, *at.success] if e.value.startswith("Redrive recorded as")),
        None,
    )


def test_a_redrive_waiting_for_a_person_runs_in_the_background_and_is_decided_on_the_page(
    copy: Path, invoices: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = invoices[1]
    amounts = _amounts(copy, sid)
    letters = _letters(copy, sid)
    checker = [d.entry_id for d in letters if d.subscriber == "checker"]
    small = [e for e in checker if amounts[e] <= 1_000]
    asking = [e for e in checker if amounts[e] > 1_000]
    refused = [e for e, a in amounts.items() if a >= 6_000]
    assert small and asking and refused, amounts
    at = _page(copy, sid, monkeypatch)

    # One entry that asks nobody: redriven, said in a success.
    at.selectbox(key="dlq_pick").set_value(small[0]).run()
    at.button(key="redrive_one").click().run()
    assert not at.exception, at.exception
    _until(at, lambda a: _result(a) is not None, lambda a: None)
    with SessionStore(copy, create=False) as st:
        first = next(s.id for s in st.sessions() if s.kind == "redrive")
    assert [s.value for s in at.success if s.value.startswith("Redrive")] == [
        f"Redrive recorded as {first}: 1 of 1 redriven"
    ]

    # All the others: the click returns while the redrive waits for a person.
    at.button(key="redrive_all").click().run()
    assert not at.exception, at.exception
    started = time.monotonic()

    def pending() -> list[tuple[str, int]]:
        with SessionStore(copy, create=False) as st:
            redrives = [s.id for s in st.sessions() if s.kind == "redrive" and s.id != first]
            book = ApprovalBook(st)
            return [(r, a.id) for r in redrives for a in book.entries(r, status="pending")]

    def waiting(a: AppTest) -> bool:
        return any("it waits for a person" in w.value for w in a.warning)

    _until(at, waiting, lambda a: None)
    (redrive, rid), *_ = pending()
    # It has been waiting for as long as it took to get here; the page was drawn meanwhile,
    # one render at a time, and offers the request's buttons and the redrive's page.
    assert _result(at) is None and time.monotonic() - started < RENDER_S
    assert at.button(key="redrive_all").disabled and at.button(key="redrive_one").disabled
    assert at.button(key="redrive_open").label == f"Open the redrive session {redrive}"
    assert {f"approve_{redrive}_{rid}", f"reject_{redrive}_{rid}"} <= {b.key for b in at.button}

    approved: list[int] = []

    def approve(a: AppTest) -> None:
        for b in a.button:
            if b.key and b.key.startswith(f"approve_{redrive}_"):
                b.click().run()
                assert not a.exception, a.exception
                approved.append(int(b.key.rsplit("_", 1)[1]))
                return

    _until(at, lambda a: _result(a) is not None, approve)
    assert len(approved) == len(asking)
    with SessionStore(copy, create=False) as st:
        asked = ApprovalBook(st).entries(redrive)
        report = st.session(redrive).summary["redrive"]
        marked = {d.entry_id for d in st.dead_letters(sid) if d.redriven_by == redrive}
    assert {(a.status, a.decided_by) for a in asked} == {("approved", who())}
    assert sorted(a.id for a in asked) == sorted(approved)
    # The bank still refuses the large ones: they failed downstream of their redelivery.
    again = set(refused)
    assert marked == set(amounts) - {small[0]} - again
    assert _result(at) == f"Redrive recorded as {redrive}: {redrive_outcome(report)}"
    assert "failed again" in (_result(at) or "") and "downstream)" in (_result(at) or "")
    assert [e.value for e in at.error if e.value.startswith("Redrive recorded as")]
    outcomes = next(d.value for d in at.dataframe if "redrive outcome" in d.value.columns)
    failed = outcomes[outcomes["redrive outcome"] != "delivered"]
    assert set(failed["entry"]) == again
    assert failed["redrive outcome"].str.startswith("failed").all()
    assert any(v.startswith("failed downstream: #") for v in failed["redrive outcome"])
    assert not at.button(key="redrive_all").disabled  # it ended: the next may start


def test_a_redrive_is_killed_only_past_every_timeout_of_its_own(
    copy: Path, invoices: tuple[Path, str]
) -> None:
    """The page's bound on a redrive is the CLI's own (each entry's drain with its wait for
    a person) with room to spare: no fixed kill cuts a person's decision short. Past it the
    process can only be hung, and is killed and said to be."""
    assert redrive_bound(3, 120.0) >= 3 * (DEFAULT_REPLAY_TIMEOUT + 120.0)
    assert redrive_bound(1, 86_400.0) > 86_400.0
    sid = invoices[1]
    # A bound of a second on a redrive that waits two minutes for a person stands in for a
    # process hung past its own timeouts.
    job = RedriveJob.start(copy, sid, None, bound=1.0)
    try:
        deadline = time.monotonic() + WAIT
        while job.state == "running":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert job.state == "error" and job.report is None
        assert job.error is not None and "hung" in job.error
        assert job.process.poll() is not None
        assert not job.out_path.exists() and not job.err_path.exists()
    finally:
        job.cancel()
