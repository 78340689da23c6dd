"""The Altair chart builders: what they plot is the read model's values, nothing lost."""

from __future__ import annotations

from typing import Any

import pandas as pd
from conftest import Recorded

from dashboard.web import _charts
from pantheon import readmodel as rm
from pantheon.sessions import SessionStore


def _data(chart: Any) -> pd.DataFrame:
    data = chart.data
    assert isinstance(data, pd.DataFrame)
    return data


def test_throughput_chart_plots_every_message(pristine: Recorded) -> None:
    with SessionStore(pristine.path, create=False) as store:
        points = rm.throughput(store, pristine.failed, bucket_s=0.05)
        row = rm.session_row(store, pristine.failed)
    by_topic = _data(_charts.throughput_chart(points, "topic"))
    assert by_topic["count"].sum() == row.messages
    assert (by_topic["msg/s"] == by_topic["count"] / 0.05).all()
    spec = _charts.throughput_chart(points, "agent").to_dict()
    assert spec["mark"]["type"] == "line" and spec["encoding"]["color"]["field"] == "agent"


def test_latency_chart_stacks_wait_and_handling(pristine: Recorded) -> None:
    with SessionStore(pristine.path, create=False) as store:
        hops = rm.hop_latency(store, pristine.failed)
    data = _data(_charts.latency_chart(hops, "agent", "p99"))
    actor = next(h for h in hops if h.kind == "agent" and h.name == "actor")
    got = data[data["hop"] == "actor"].set_index("part")["ms"]
    assert (got["queue wait"], got["handling"]) == (actor.wait_p99_ms, actor.handle_p99_ms)
    assert set(data["hop"]) == {h.name for h in hops if h.kind == "agent"}


def test_breaker_chart_draws_each_state_until_the_next() -> None:
    events = [
        rm.BreakerEvent(0.5, "actor", "closed", "open", "5 failures in a row"),
        rm.BreakerEvent(0.6, "actor", "open", "half_open", "cooldown over"),
        rm.BreakerEvent(0.7, "actor", "half_open", "closed", "probe succeeded"),
        rm.BreakerEvent(0.2, "sensor", "closed", "open", "rate 0.5"),
    ]
    data = _data(_charts.breaker_chart(events, end_s=2.0))
    segments = [tuple(r) for r in data[["breaker", "state", "from", "to"]].itertuples(index=False)]
    assert segments == [
        ("actor", "closed", 0.0, 0.5),
        ("actor", "open", 0.5, 0.6),
        ("actor", "half_open", 0.6, 0.7),
        ("actor", "closed", 0.7, 2.0),
        ("sensor", "closed", 0.0, 0.2),
        ("sensor", "open", 0.2, 2.0),
    ]


def test_waterfall_chart_is_relative_to_the_request(pristine: Recorded) -> None:
    with SessionStore(pristine.path, create=False) as store:
        req = next(r for r in rm.requests(store, pristine.failed) if r.outcome == "dead_letter")
        bars = rm.waterfall(store, pristine.failed, req.correlation_id)
    data = _data(_charts.waterfall_chart(bars, req.start_ms))
    assert len(data) == 2 * len(bars)  # a wait bar and a handling bar per hop
    first = data[data["order"] == 0].set_index("part")
    assert first.loc["queue wait", "from"] == 0.0  # the input was published at the start
    handling = data[data["part"] == "handling"]
    assert list(handling["outcome"]) == [b.outcome for b in bars]
    assert (handling["to"] - handling["from"]).round(6).tolist() == [
        round(b.handling_ms, 6) for b in bars
    ]
