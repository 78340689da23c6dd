"""The Altair chart builders: what they plot is the read model's values, nothing lost."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest
from dashboard_store import Recorded

from dashboard.web import _charts
from pantheon import readmodel as rm
from pantheon.sessions import SessionStore, diff_sessions


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
        rm.BreakerEvent(0.5, "actor", "closed", "open", "5 failures in a row", t_s=0.5),
        rm.BreakerEvent(0.6, "actor", "open", "half_open", "cooldown over", t_s=0.6),
        rm.BreakerEvent(0.7, "actor", "half_open", "closed", "probe succeeded", t_s=0.7),
        rm.BreakerEvent(0.2, "sensor", "closed", "open", "rate 0.5", t_s=0.2),
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


def _charts_of(recorded: Recorded) -> Iterator[tuple[str, Any]]:
    """Every chart the session page draws, built from the failing session's read model (its
    breakers never change state, so their chart gets made-up transitions; the replay's
    comparison is drawn against the session itself)."""
    with SessionStore(recorded.path, create=False) as store:
        points = rm.throughput(store, recorded.failed, bucket_s=0.05)
        hops = rm.hop_latency(store, recorded.failed)
        out = rm.outcomes(store, recorded.failed)
        req = next(r for r in rm.requests(store, recorded.failed) if r.outcome == "dead_letter")
        bars = rm.waterfall(store, recorded.failed, req.correlation_id)
        diff = diff_sessions(store, recorded.failed, recorded.failed)
    for kind in ("topic", "agent"):
        yield f"throughput per {kind}", _charts.throughput_chart(points, kind)
    for kind in ("agent", "edge"):
        yield f"latency per {kind}", _charts.latency_chart(hops, kind, "p99")
    events = [
        rm.BreakerEvent(0.1, "actor", "closed", "open", "3 failures in a row", t_s=0.1),
        rm.BreakerEvent(0.2, "actor", "open", "half_open", "cooldown over", t_s=0.2),
    ]
    yield "breakers", _charts.breaker_chart(events, end_s=1.0)
    yield "waterfall", _charts.waterfall_chart(bars, req.start_ms)
    yield "verdicts", _charts.verdicts_chart(out.decisions)
    yield "replay", _charts.latency_delta_chart(diff.latency, recorded.failed, recorded.failed)


def _encodings(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(channel, field definition, its view's encoding) of every encoded field, layers too."""
    for view in [spec, *spec.get("layer", [])]:
        encoding = view.get("encoding", {})
        for channel, enc in encoding.items():
            for e in enc if isinstance(enc, list) else [enc]:
                if "field" in e:
                    yield channel, e, encoding


@pytest.fixture(scope="module")
def charts(pristine: Recorded) -> list[tuple[str, Any]]:
    return list(_charts_of(pristine))


def test_every_chart_encodes_only_fields_its_data_has(charts: list[tuple[str, Any]]) -> None:
    """What the browser gets must be drawable: each encoded field is a column of the rows
    the spec carries, with no null in it, and each quantitative position has an extent."""
    for name, chart in charts:
        spec = chart.to_dict()
        rows = spec["datasets"][spec["data"]["name"]]
        assert rows, name
        for channel, e, encoding in _encodings(spec):
            values = [r.get(e["field"]) for r in rows]
            assert not any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values), (
                f"{name}: {channel} field {e['field']!r} missing or null in the data"
            )
            if channel in ("x", "y") and e["type"] == "quantitative":
                if f"{channel}2" in encoding:  # a bar from x to x2
                    values += [r[encoding[f"{channel}2"]["field"]] for r in rows]
                assert max(values) > min(0, *values), f"{name}: {channel} has no extent"


def test_every_chart_keeps_its_height_for_the_plot(charts: list[tuple[str, Any]]) -> None:
    """Streamlit gives a spec without an ``autosize`` of its own ``{"type": "fit"}``, which
    squeezes title, axes and the bottom legend into ``height``: a throughput chart with a
    dozen topics in its legend was left a plot 0 px tall, lines and y axis gone. Each chart
    says how it sizes instead: its width fits the column, its height is the plot's, and the
    title, axes and legend come on top."""
    for name, chart in charts:
        assert chart.to_dict().get("autosize") == {"type": "fit-x", "contains": "padding"}, name
