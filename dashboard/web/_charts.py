"""Altair charts of the read model's values. Pure: values in, chart out, no Streamlit.

Every chart states its own ``autosize`` (:func:`_sized`): the width fits the column the page
puts it in, and ``height`` is the plot's, with title, axes and legend drawn around it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import altair as alt
import pandas as pd

from pantheon.readmodel import BreakerEvent, HopBar, HopLatency, ThroughputPoint
from pantheon.sessions import LatencyDelta

__all__ = [
    "BREAKER_COLOURS",
    "breaker_chart",
    "latency_chart",
    "latency_delta_chart",
    "throughput_chart",
    "verdicts_chart",
    "waterfall_chart",
]

BREAKER_COLOURS = {"closed": "#2e7d32", "half_open": "#f9a825", "open": "#c62828"}
_OUTCOME_COLOURS = alt.Scale(
    domain=["delivered", "failed", "circuit_open"], range=["#1565c0", "#c62828", "#6a1b9a"]
)

_ChartT = TypeVar("_ChartT", alt.Chart, alt.LayerChart)


def _sized(chart: _ChartT) -> _ChartT:
    """``chart`` sized as ``autosize: fit-x``: as wide as its container, its plot as tall
    as its ``height`` (or its bands' steps).

    Vega-Lite's ``height`` is the plot's only under ``pad`` or ``fit-x`` autosizing. A spec
    without an ``autosize`` of its own gets ``{"type": "fit"}`` from ``st.altair_chart``,
    and ``fit`` makes ``height`` the whole chart's: the title, the x axis and the bottom
    legend are taken out of it and the plot gets what is left. A throughput chart's legend
    of ten topics in four rows left it nothing: lines and y axis collapsed onto the x
    axis. Bars lost their bands the same way (the waterfall's hops drawn on top of each
    other, the breakers' legend cut off). Fitting the width alone keeps charts in their
    column and lets the chart grow below the plot for its legend.
    """
    return chart.properties(autosize=alt.AutoSizeParams(type="fit-x", contains="padding"))


def throughput_chart(points: Sequence[ThroughputPoint], kind: str) -> alt.Chart:
    """Messages per second over time, one line per topic (``kind="topic"``) or agent."""
    df = pd.DataFrame(
        [
            {"t (s)": p.t_s, "msg/s": p.rate, "count": p.count, kind: p.key}
            for p in points
            if p.kind == kind
        ]
    )
    return _sized(
        alt.Chart(df, title=f"throughput per {kind}")
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("t (s):Q", title="seconds since the first message"),
            y=alt.Y("msg/s:Q"),
            color=alt.Color(f"{kind}:N", legend=alt.Legend(orient="bottom", columns=3)),
            tooltip=[f"{kind}:N", "t (s):Q", "count:Q", "msg/s:Q"],
        )
        .properties(height=260)
    )


def latency_chart(hops: Sequence[HopLatency], kind: str, quantile: str) -> alt.Chart:
    """Queue wait and handling at one quantile (``p50``/``p95``/``p99``), stacked per hop, so
    a slow hop shows whether it waited or worked."""
    rows = []
    for h in hops:
        if h.kind != kind:
            continue
        rows.append({"hop": h.name, "part": "queue wait", "ms": getattr(h, f"wait_{quantile}_ms")})
        rows.append({"hop": h.name, "part": "handling", "ms": getattr(h, f"handle_{quantile}_ms")})
    df = pd.DataFrame(rows, columns=["hop", "part", "ms"])
    return _sized(
        alt.Chart(df, title=f"{quantile} per {kind}: queue wait + handling (ms)")
        .mark_bar()
        .encode(
            y=alt.Y("hop:N", sort="-x", title=None),
            x=alt.X("ms:Q", stack="zero", title=f"{quantile} (ms)"),
            color=alt.Color(
                "part:N",
                scale=alt.Scale(domain=["queue wait", "handling"], range=["#90caf9", "#1565c0"]),
                legend=alt.Legend(orient="bottom"),
            ),
            tooltip=["hop:N", "part:N", alt.Tooltip("ms:Q", format=".3f")],
        )
        .properties(height=max(120, 28 * len(df) // 2))
    )


def breaker_chart(events: Sequence[BreakerEvent], end_s: float) -> alt.Chart:
    """Each breaker's state over time: one band per breaker, coloured by state, from each
    transition to the next (the last lasts to ``end_s``)."""
    rows = []
    by_name: dict[str, list[BreakerEvent]] = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e)
    for name, evs in by_name.items():
        # Before its first recorded change a breaker was in that change's old state.
        rows.append(
            {"breaker": name, "state": evs[0].old, "from": 0.0, "to": evs[0].t_s, "reason": ""}
        )
        for e, nxt in zip(evs, [*evs[1:], None], strict=True):
            to = end_s if nxt is None else nxt.t_s
            rows.append(
                {
                    "breaker": name,
                    "state": e.new,
                    "from": e.t_s,
                    "to": max(to, e.t_s),
                    "reason": e.reason or "",
                }
            )
    df = pd.DataFrame(rows, columns=["breaker", "state", "from", "to", "reason"])
    states = list(BREAKER_COLOURS)
    return _sized(
        alt.Chart(df, title="circuit breakers")
        .mark_bar(height=18)
        .encode(
            y=alt.Y("breaker:N", title=None),
            x=alt.X("from:Q", title="seconds since the first message"),
            x2="to:Q",
            color=alt.Color(
                "state:N",
                scale=alt.Scale(domain=states, range=[BREAKER_COLOURS[s] for s in states]),
                legend=alt.Legend(orient="bottom"),
            ),
            tooltip=["breaker:N", "state:N", "from:Q", "to:Q", "reason:N"],
        )
        .properties(height=max(80, 34 * len(by_name)))
    )


def waterfall_chart(bars: Sequence[HopBar], origin_ms: float) -> alt.LayerChart:
    """One request's hops as a waterfall: a light bar for the wait in the mailbox, then a
    solid bar for the handling, coloured by outcome; milliseconds since the request began."""
    rows = []
    for i, b in enumerate(bars):
        label = f"{i + 1:>2}. {b.agent} ← {b.topic}"
        common = {"hop": label, "order": i, "outcome": b.outcome, "error": b.error or ""}
        rows.append(
            common
            | {
                "part": "queue wait",
                "from": b.enqueued_ms - origin_ms,
                "to": b.start_ms - origin_ms,
                "ms": b.queue_wait_ms,
            }
        )
        rows.append(
            common
            | {
                "part": "handling",
                "from": b.start_ms - origin_ms,
                "to": b.end_ms - origin_ms,
                "ms": b.handling_ms,
            }
        )
    df = pd.DataFrame(
        rows, columns=["hop", "order", "outcome", "error", "part", "from", "to", "ms"]
    )
    y = alt.Y("hop:N", sort=alt.EncodingSortField("order"), title=None)
    x = alt.X("from:Q", title="ms since the request began")
    tooltip = ["hop:N", "part:N", alt.Tooltip("ms:Q", format=".3f"), "outcome:N", "error:N"]
    waits = (
        alt.Chart(df)
        .transform_filter(alt.datum.part == "queue wait")
        .mark_bar(height=14, color="#cfd8dc")
        .encode(y=y, x=x, x2="to:Q", tooltip=tooltip)
    )
    handling = (
        alt.Chart(df)
        .transform_filter(alt.datum.part == "handling")
        .mark_bar(height=14)
        .encode(
            y=y,
            x=x,
            x2="to:Q",
            color=alt.Color(
                "outcome:N", scale=_OUTCOME_COLOURS, legend=alt.Legend(orient="bottom")
            ),
            tooltip=tooltip,
        )
    )
    return _sized(
        (waits + handling).properties(
            title="request waterfall (grey: waiting in the mailbox)",
            height=max(100, 26 * len(bars)),
        )
    )


def verdicts_chart(decisions: Mapping[str, int]) -> alt.Chart:
    """How many of the Guardian's decisions were each verdict, the commonest on top."""
    df = pd.DataFrame(
        [{"verdict": k, "count": v} for k, v in sorted(decisions.items())],
        columns=["verdict", "count"],
    )
    return _sized(
        alt.Chart(df, title="Guardian verdicts")
        .mark_bar()
        .encode(
            x=alt.X("count:Q"),
            y=alt.Y("verdict:N", sort="-x", title=None),
            color=alt.Color("verdict:N", legend=None),
            tooltip=["verdict:N", "count:Q"],
        )
    )


def latency_delta_chart(deltas: Sequence[LatencyDelta], a: str, b: str) -> alt.Chart:
    """p99 handling per subscriber in the original (``a``) and the replay (``b``), side by
    side."""
    rows = []
    for d in deltas:
        if d.scope != "subscriber" or d.metric != "handling":
            continue
        rows.append(
            {"subscriber": d.name, "session": f"original {a}", "p99 (ms)": d.a.p99_us / 1e3}
        )
        rows.append({"subscriber": d.name, "session": f"replay {b}", "p99 (ms)": d.b.p99_us / 1e3})
    df = pd.DataFrame(rows, columns=["subscriber", "session", "p99 (ms)"])
    return _sized(
        alt.Chart(df, title="p99 handling per agent: original vs replay")
        .mark_bar()
        .encode(
            y=alt.Y("subscriber:N", title=None),
            yOffset="session:N",
            x=alt.X("p99 (ms):Q"),
            color=alt.Color("session:N", legend=alt.Legend(orient="bottom")),
            tooltip=["subscriber:N", "session:N", alt.Tooltip("p99 (ms):Q", format=".3f")],
        )
    )
