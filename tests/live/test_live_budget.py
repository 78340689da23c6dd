"""A snapshot's budget scopes cross the live feed's wire whole (the monitor attached to a
running session reads them from there)."""

from __future__ import annotations

from agents import BudgetState
from pantheon.live import Snapshot, Totals
from pantheon.live._wire import decode_server, encode


def test_budget_scopes_round_trip_through_the_feed_wire() -> None:
    budget = (
        BudgetState("run", 25, 0.000175, 23, None, 15),
        BudgetState("agent:asker", 10, 0.00007, None, 0.5, 0),
    )
    snap = Snapshot(
        session_id="s", scenario="budgeted", status="running", live=True, seq=3, t_s=1.5,
        totals=Totals(), budget=budget,
    )  # fmt: skip
    back = decode_server(encode(snap)[4:])
    assert isinstance(back, Snapshot) and back == snap
    assert [b.stopped for b in back.budget] == [True, False]
