"""How a divergence reads: a side with no message or no call says so, the item is named."""

from __future__ import annotations

import pickle

from pantheon.sessions import ReplayDivergence


def test_a_missing_side_reads_nothing_and_the_item_is_named() -> None:
    extra = ReplayDivergence(
        "extra", original_id=None, replay_id=7, agent="pricer", expected=None,
        actual={"topic": "quote.priced"}, topic="quote.priced",
    )  # fmt: skip
    extra.name_item("IT-3")
    assert extra.describe("A", "B") == (
        "runs differ (extra) at B message 7 (none in the A) on 'quote.priced' for item 'IT-3' "
        "from agent 'pricer': A has nothing, B has {'topic': 'quote.priced'}"
    )
    assert str(extra).startswith("replay diverged (extra) at replay message 7 (none in the ")
    assert extra.to_dict()["item"] == "IT-3"
    assert pickle.loads(pickle.dumps(extra)).item == "IT-3"  # crosses a process whole

    effect = ReplayDivergence(
        "effect", original_id=1, replay_id=2, agent="router", expected=None,
        actual="fault.draw",
    )  # fmt: skip
    assert "expected no call, got 'fault.draw'" in str(effect)
    payload = ReplayDivergence(
        "payload", original_id=1, replay_id=2, agent="router", expected=None, actual=3
    )
    assert "expected None, got 3" in str(payload)  # a value that is None stays None
