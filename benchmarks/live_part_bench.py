"""What a node's live part costs: built and encoded as a node sends it to its driver.

    python benchmarks/live_part_bench.py [--emails 3000] [--repeats 100]

Runs the nine-agent support pipeline (``pipeline_bench.py``'s run, model latency 0) on one
bus with a node's live feed attached (``ticking=False``, as ``pantheon.live.NodeParts``
makes it: every agent on this one node, the worst case), then builds the part and its
control-line text ``--repeats`` times: the median time and the size, and what sending one
each tick (4 a second) would cost that node's loop. Nodes send parts only while someone
watches the driver's feed (pantheon/live/_parts.py), and once when they leave.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pipeline_bench

from bus import Bus
from pantheon.live import DEFAULT_INTERVAL, LiveFeed
from pantheon.live._parts import encode_part
from pantheon.runner import count_own_topics


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--emails", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    feeds: list[LiveFeed] = []

    async def attach(bus: Bus) -> None:
        own = count_own_topics(bus)
        feed = LiveFeed(bus, nodes={}, here="node", own_topics=lambda: own, ticking=False)
        await feed.start()
        feeds.append(feed)

    with tempfile.TemporaryDirectory() as tmp:
        inbox = pipeline_bench.make_inbox(args.emails, Path(tmp))
        run: dict[str, Any] = asyncio.run(pipeline_bench.one_run(inbox, 0.0, 64, attach=attach))
    feed = feeds[0]
    times = []
    text = ""
    for _ in range(args.repeats):
        t = time.perf_counter()
        text = encode_part(feed.part())
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    print(
        f"{run['requests']:,} requests; a part built and encoded in {median * 1000:.2f} ms "
        f"(median of {args.repeats}), {len(text):,} bytes of control line; one per tick "
        f"({1 / DEFAULT_INTERVAL:g}/s) would take {median / DEFAULT_INTERVAL:.1%} of the "
        "node's loop"
    )


if __name__ == "__main__":
    main()
