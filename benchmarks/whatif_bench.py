"""What a what-if replay costs next to an exact replay of the same session.

Records one run of scenarios/support_email.yaml (600 emails) into a fresh store, then, in
each repeat and in the same process, times three replays of it: the exact replay, a
what-if with an overlay that changes nothing (every effect served: the what-if machinery
alone), and a what-if with a higher refund limit (some calls live). Medians, and each
what-if's ratio to the exact replay measured in the same repeats, so the ratios hold on a
busy machine where the absolute times do not.

    .venv/bin/python benchmarks/whatif_bench.py [--repeats 5] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import pantheon

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "support_email.yaml"
CASES = {
    "exact replay": None,
    "what-if, no change": "{}\n",
    "what-if, refund_limit 500": "policy:\n  refund_limit: 500\n",
}


async def _time(session: str, store: Path, overlay: str | None) -> tuple[float, int]:
    started = time.perf_counter()
    report = await pantheon.replay(session, store=store, with_=overlay)
    elapsed = time.perf_counter() - started
    return elapsed, report.effects_called


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "sessions.db"
        summary = asyncio.run(pantheon.run(SCENARIO, store=store))
        times: dict[str, list[float]] = {name: [] for name in CASES}
        live: dict[str, int] = {}
        asyncio.run(_time(summary.session_id, store, None))  # warm-up: imports, caches
        for _ in range(args.repeats):
            for name, overlay in CASES.items():
                elapsed, called = asyncio.run(_time(summary.session_id, store, overlay))
                times[name].append(elapsed)
                live[name] = called
    base = statistics.median(times["exact replay"])
    rows = [
        (name, statistics.median(t), statistics.median(t) / base, live[name])
        for name, t in times.items()
    ]
    if args.markdown:
        print("| replay of 600 emails | median s | / exact replay | effects called live |")
        print("|---|---:|---:|---:|")
        for name, median, ratio, called in rows:
            print(f"| {name} | {median:.3f} | {ratio:.2f}x | {called} |")
    else:
        for name, median, ratio, called in rows:
            print(f"{name:28} {median:8.3f} s  {ratio:5.2f}x  live {called}")


if __name__ == "__main__":
    main()
