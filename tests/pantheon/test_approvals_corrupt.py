"""Approvals against damaged input: numbers out of range on the command line, and a row of
the approvals table that is not what Pantheon wrote. Each is one located line; a corrupt
row fails only itself, never the rows beside it or the run waiting on them."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pantheon.approvals._desk import StoreDesk
from pantheon.cli import app
from pantheon.scenario import ApprovalsConfig
from pantheon.sessions import ApprovalBook, ApprovalError, SessionStore


def _store_with_approvals(path: Path, n: int) -> None:
    with SessionStore(path) as st:
        st.begin_session("s", scenario="x", scenario_text="x", seed=1)
        book = ApprovalBook(st)
        for i in range(n):
            request = {"summary": f"refund {i}"}
            book.ask(origin="s", session="s", agent="guard", key=f"k#{i}",
                     request=request, timeout=60, default_approve=False)  # fmt: skip


def _corrupt(
    path: Path, approval_id: int, column: str = "request", value: object = "{oops"
) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(f"UPDATE approvals SET {column} = ? WHERE id = ?", (value, approval_id))
    conn.close()


@pytest.mark.parametrize("number", ["1000000000000000000000000000000", "0"])
def test_approve_range_checks_the_number(tmp_path: Path, number: str) -> None:
    store = tmp_path / "s.db"
    _store_with_approvals(store, 1)
    result = CliRunner().invoke(app, ["approve", "s", number, "--store", str(store)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [f"error: session s has no approval {number} (approvals are numbered from 1)"]


def test_a_corrupt_row_is_one_line_and_the_others_are_listed(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    _store_with_approvals(store, 3)
    _corrupt(store, 2)
    result = CliRunner().invoke(app, ["approvals", "s", "--json", "--store", str(store)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    out = result.output
    assert '"summary": "refund 0"' in out and '"summary": "refund 2"' in out
    assert '"refund 1"' not in out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: approval 2 of session s is corrupt in the store: request is not JSON "
        "(JSONDecodeError: Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1)); left out"
    ]


def test_deciding_a_corrupt_row_is_refused_in_one_line(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    _store_with_approvals(store, 1)
    _corrupt(store, 1, "deadline", "soon")
    result = CliRunner().invoke(app, ["approve", "s", "1", "--store", str(store)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: approval 1 of session s is corrupt in the store: deadline is 'soon', not a number"
    )


async def test_a_waiting_run_fails_only_the_corrupt_request(tmp_path: Path) -> None:
    """Three requests wait; one row is damaged while they wait and a person decides the
    others. The damaged one fails alone, naming itself; the others get their decisions.
    (Before, the poll's JSONDecodeError failed every waiter: most of a run dead-lettered.)"""
    store = tmp_path / "s.db"
    with SessionStore(store) as st:
        st.begin_session("s", scenario="x", scenario_text="x", seed=1)
    desk = StoreDesk(store, "s", ApprovalsConfig(timeout=30, poll=0.02))
    try:
        asks = [
            asyncio.ensure_future(desk.ask("guard", {"summary": f"refund {i}", "n": i}))
            for i in range(3)
        ]
        await asyncio.sleep(0.2)
        with SessionStore(store) as st:
            book = ApprovalBook(st)
            # Numbered in the order the asks reached the store: found by request.
            number = {a.request["n"]: a.id for a in book.entries("s")}
            assert sorted(number) == [0, 1, 2]
            _corrupt(store, number[1])
            book.decide("s", number[0], approved=True, by="ann")
            book.decide("s", number[2], approved=False, by="ann")
        done = await asyncio.wait_for(asyncio.gather(*asks, return_exceptions=True), 10)
    finally:
        await desk.aclose()
    assert [d["approved"] if isinstance(d, dict) else None for d in done] == [True, None, False]
    assert isinstance(done[1], ApprovalError)
    assert str(done[1]).startswith(
        f"approval {number[1]} of session s is corrupt in the store: request is not JSON"
    )
