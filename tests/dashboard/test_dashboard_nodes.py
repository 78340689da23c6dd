"""The web session page of a multi-process session (recorded by ``pantheon run`` on ZeroMQ
nodes) under ``AppTest``: its processes, and the node of each hop, dead letter and breaker
change; a single-process session's page has no node anywhere."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from node_session import NodeSessions
from streamlit.testing.v1 import AppTest

from dashboard.web import APP
from pantheon import readmodel
from pantheon.sessions import STORE_ENV, SessionStore


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path, str], AppTest]:
    def make(path: Path, sid: str) -> AppTest:
        monkeypatch.setenv(STORE_ENV, str(path))
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.query_params["session"] = sid
        at.run()
        assert not at.exception, at.exception
        return at

    return make


#: A column only each table has: the processes, dead letters, a waterfall, breaker changes.
_MARK = {
    "node_table": "journal",
    "dlq_table": "attempts",
    "waterfall_table": "queue_wait_ms",
    "breaker_table": "old",
}


def _frame(at: AppTest, table: str) -> pd.DataFrame | None:
    found = [d.value for d in at.dataframe if _MARK[table] in d.value.columns]
    assert len(found) <= 1, f"{len(found)} tables like {table}"
    return found[0] if found else None


def test_the_session_page_lists_its_processes_and_the_node_of_each_hop(
    app: Callable[[Path, str], AppTest], node_sessions: NodeSessions
) -> None:
    s = node_sessions
    with SessionStore(s.store, create=False) as store:
        nodes = readmodel.nodes(store, s.three)
        letters = readmodel.dead_letters(store, s.three)
        picked = next(r for r in readmodel.requests(store, s.three) if r.outcome != "ok")
        bars = readmodel.waterfall(store, s.three, picked.correlation_id)
    at = app(s.store, s.three)

    table = _frame(at, "node_table")
    assert table is not None
    assert list(table["node"]) == ["driver", "perception", "cognition", "action"]
    assert list(table["agents"]) == [", ".join(n.agents) for n in nodes]
    assert list(table["ended"]) == ["ok"] * 4
    assert list(table["journal"]) == [n.journal for n in nodes]
    assert table["journal"].iloc[3].endswith("journal complete")

    dlq = _frame(at, "dlq_table")
    assert dlq is not None
    assert list(dlq.columns[:3]) == ["entry", "subscriber", "node"]
    assert set(dlq["node"]) == {"action"} and len(dlq) == len(letters)

    # The picked request (a dead-lettered one) as a waterfall: each hop where it ran.
    hops = _frame(at, "waterfall_table")
    assert hops is not None
    assert list(hops["node"]) == [b.node for b in bars]
    assert {"perception", "cognition", "action"} <= set(hops["node"])

    breakers = _frame(at, "breaker_table")
    assert breakers is not None and set(breakers["node"]) == {"action"}


def test_a_killed_nodes_journal_is_said_to_stop_early(
    app: Callable[[Path, str], AppTest], node_sessions: NodeSessions
) -> None:
    at = app(node_sessions.store, node_sessions.killed)
    table = _frame(at, "node_table")
    assert table is not None
    work2 = table.set_index("node").loc["work2"]
    assert work2["ended"].startswith("killed at ")
    assert work2["journal"].endswith("died with it)")
    assert any("the journal of `work2` stops early" in m.value for m in at.markdown)


def test_a_single_process_session_has_no_node_column(
    app: Callable[[Path, str], AppTest], node_sessions: NodeSessions
) -> None:
    at = app(node_sessions.store, node_sessions.alone)
    assert _frame(at, "node_table") is None
    for key in ("dlq_table", "waterfall_table", "breaker_table"):
        frame = _frame(at, key)
        assert frame is not None, key
        assert "node" not in frame.columns, key
