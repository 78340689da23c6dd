"""/metrics with many topics: a bounded number of series, and a slow rendering not
repeated at every scrape (it runs on the run's event loop)."""

from __future__ import annotations

import asyncio

from bus import Bus
from pantheon.gateway import GatewayState, Tokens
from pantheon.gateway import _metrics as metrics
from pantheon.scenario import GatewayConfig

TOPICS = 3000


def topic_lines(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("pantheon_bus_topic_published_total{"):
            label, value = line.split("} ")
            out[label.split('topic="')[1].rstrip('"')] = float(value)
    return out


async def test_topic_series_are_capped_with_the_rest_summed_as_other() -> None:
    async with Bus() as bus:
        bus.on(">", lambda env: None, name="sink", max_queue=100_000)
        for i in range(TOPICS):
            bus.emit_nowait(f"t.n{i}", i)
        for _ in range(5):
            bus.emit_nowait("t.busy", 0)
        await asyncio.sleep(0.1)
        state = GatewayState(bus, GatewayConfig(), Tokens())
        body, _ = await metrics.render_metrics(state)
    series = topic_lines(body.decode())
    assert len(series) == metrics.MAX_TOPIC_LABELS + 1
    assert series["t.busy"] == 5.0  # the busiest topics keep their own series
    assert series["(other)"] == TOPICS + 5 - sum(v for k, v in series.items() if k != "(other)")


async def test_a_slow_rendering_is_reused_and_a_cheap_one_never() -> None:
    async with Bus() as bus:
        state = GatewayState(bus, GatewayConfig(), Tokens())
        await metrics.render_metrics(state)
        assert state.metrics_cache is None  # cheap: the next scrape renders again
        bus.emit_nowait("a.b", 1)
        assert b'topic="a.b"' in (await metrics.render_metrics(state))[0]
        state.metrics_cache = (float("inf"), b"slow one")
        assert (await metrics.render_metrics(state))[0] == b"slow one"
