"""The session page's Trace tab under ``AppTest``, on a refund desk of a model agent recorded
by ``pantheon run`` against its stand-in model: the item picker opens on the item that went
wrong, and a picked item shows the story ``pantheon trace`` prints, from the same functions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from refund_trace_team import recorded_refunds
from streamlit.testing.v1 import AppTest

from dashboard.web import APP
from pantheon.itemtrace import item_trace
from pantheon.sessions import STORE_ENV, SessionStore

_TIME = re.compile(r"\d+\.\d ms")


@pytest.fixture(scope="module")
def refunds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return recorded_refunds(tmp_path_factory.mktemp("refunds"))


def _page(monkeypatch: pytest.MonkeyPatch, path: Path, sid: str) -> AppTest:
    monkeypatch.setenv(STORE_ENV, str(path))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["session"] = sid
    at.run()
    assert not at.exception, at.exception
    return at


def test_the_trace_tab_shows_a_picked_item_s_story(
    refunds: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, sid = refunds
    at = _page(monkeypatch, path, sid)
    assert [t.label for t in at.tabs][-1] == "Trace"
    (picker,) = [s for s in at.selectbox if s.key == f"trace_pick_{sid}"]
    assert picker.label == "Item (3, by ticket)"
    assert picker.options == [
        "T-1 · none · 5 effect calls",
        "T-2 · refund · 7 effect calls",
        "T-3 · none (expected refund) · 3 effect calls · 1 error",
    ]
    assert picker.value == "T-3"  # the one that went wrong
    assert "outcome: none (expected refund: wrong)" in [e.value for e in at.error]
    picker.set_value("T-2").run()
    assert not at.exception, at.exception
    assert "outcome: refund (expected refund: right)" in [s.value for s in at.success]
    heads = [m.value for m in at.markdown if " ms · **" in m.value]
    assert [_TIME.sub("N ms", h) for h in heads] == [
        "+N ms · **refund.asked** · input → refunds",
        "↳ +N ms · **refund.decided** · from refunds → payout",
        "↳ ↳ +N ms · **refund.paid** · from payout → nobody",
    ]
    # Each handling's block is the CLI's text of it, from the same story.
    with SessionStore(path, create=False) as st:
        story = item_trace(st, sid, "T-2")
    blocks = [c.value for c in at.code if c.language == "plaintext"]
    assert blocks == ["\n".join(h.lines(400)) for h in story.handlings]
    model, payout = blocks
    assert '  1 tool.order_status(order_id="A-2")' in model
    assert '      → {"order_id": "A-2", "status": "lost", "paid": 95.5}' in model
    assert '      asks refund_limit(status="lost", paid=95.5)' in model
    assert '      approved by desk-lead (request 1): note "receipt seen"' in payout
    assert f"`pantheon trace {sid} T-2`" in " ".join(c.value for c in at.caption)
