#!/usr/bin/env python
"""Routing with 10,000 subscription patterns: a publish nobody wants, a publish one subscriber
wants, and 10,000 subscribes on a running bus; this tree against another one in one run::

    .venv/bin/python benchmarks/routing_bench.py [--before PATH] [--patterns N] [--topics N]
        [--json PATH] [--markdown]

``--before PATH`` names a checkout of another version (``git worktree add /tmp/main main``, or
``git archive main | tar -x -C PATH``); each side runs in its own child process with that tree
first on ``PYTHONPATH``, one after the other, so the ratio comes from one run on one machine.

Every child builds one started ``Bus`` and measures, in this order:

subscribe   ``bus.on("tenant{i}.events.*", ...)`` for i < N on the running bus (each one is
            a runtime subscribe: routes dropped, subscriptions advertised, workers started).
miss        ``await bus.emit(topic)`` per never-seen topic that no pattern matches, timed one
            call at a time: ``tenant{r}.audit.{j}`` shares its first token with a pattern, so
            the index has to look; ``nobody.home.{j}`` does not. Twice the route cache's size,
            so the second half also evicts a cached route per publish.
match one   ``await bus.emit(topic)`` per never-seen ``tenant{r}.events.{j}``, which exactly
            one subscription takes (put in its mailbox), timed one call at a time; then the
            same with the delivery included (emit all, drain, total / count).

Medians and p99 in microseconds. Absolute numbers move with whatever else the machine runs
(the JSON records the other processes' CPU during the run); the after/before ratio much less.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def pct(samples: list[int], q: float) -> float:
    return samples[min(len(samples) - 1, int(q * len(samples)))] / 1e3


async def child(n_patterns: int, n_topics: int) -> dict[str, Any]:
    import bus as bus_pkg
    from bus import Bus

    async def noop(env: object) -> None:
        return None

    rng = random.Random(7)
    out: dict[str, Any] = {"bus_module": bus_pkg.__file__}
    async with Bus() as bus:
        t0 = time.perf_counter()
        for i in range(n_patterns):
            bus.on(f"tenant{i}.events.*", noop, name=f"t{i}")
        out["subscribe_s"] = time.perf_counter() - t0
        await asyncio.sleep(0)

        emit = bus.emit
        perf_ns = time.perf_counter_ns

        async def timed(topics: list[str]) -> dict[str, float]:
            gc.collect()  # each phase starts from the same heap, whatever the last one left
            samples = []
            for t in topics:
                s = perf_ns()
                await emit(t)
                samples.append(perf_ns() - s)
            samples.sort()
            return {"median_us": pct(samples, 0.5), "p99_us": pct(samples, 0.99)}

        shared = [f"tenant{rng.randrange(n_patterns)}.audit.{j}" for j in range(n_topics)]
        out["miss_shared"] = await timed(shared)
        unknown = [f"nobody.home.{j}" for j in range(n_topics)]
        out["miss_unknown"] = await timed(unknown)
        stats = bus.stats()
        if any(s.delivered or s.published for s in stats.subscribers.values()):
            raise AssertionError("a miss reached a subscriber")

        one = [f"tenant{rng.randrange(n_patterns)}.events.{j}" for j in range(n_topics)]
        out["match_one"] = await timed(one)
        await bus.drain()
        again = [f"tenant{rng.randrange(n_patterns)}.events.x{j}" for j in range(n_topics)]
        gc.collect()
        t0 = time.perf_counter()
        for t in again:
            await emit(t)
        await bus.drain()
        out["match_one_delivered_us"] = (time.perf_counter() - t0) / n_topics * 1e6
        delivered = sum(s.delivered for s in bus.stats().subscribers.values())
        if delivered != 2 * n_topics:
            raise AssertionError(f"match-one delivered {delivered}, expected {2 * n_topics}")
    return out


def cpu_jiffies() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def run_side(tree: Path, n_patterns: int, n_topics: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, __file__, "--_child", "--patterns", str(n_patterns)]
    cmd += ["--topics", str(n_topics)]
    busy0, _ = cpu_jiffies()
    t0 = time.monotonic()
    own0 = os.times()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"child for {tree} failed:\n{proc.stderr}")
    wall = time.monotonic() - t0
    busy1, _ = cpu_jiffies()
    own1 = os.times()
    child_cpu = own1.children_user + own1.children_system - own0.children_user
    child_cpu -= own0.children_system
    other = (busy1 - busy0) / os.sysconf("SC_CLK_TCK") - child_cpu
    result: dict[str, Any] = json.loads(proc.stdout)
    result["other_work_cores"] = round(max(0.0, other) / wall, 2)
    result["tree"] = str(tree)
    expected = tree / "bus" / "__init__.py"
    if Path(result["bus_module"]).resolve() != expected.resolve():
        raise SystemExit(f"child imported {result['bus_module']}, not {expected}")
    return result


ROWS = [
    ("runtime subscribes on a started bus", "s", "subscribe_s"),
    ("publish miss (first token shared), median", "us", "miss_shared.median_us"),
    ("publish miss (first token shared), p99", "us", "miss_shared.p99_us"),
    ("publish miss (unknown first token), median", "us", "miss_unknown.median_us"),
    ("publish miss (unknown first token), p99", "us", "miss_unknown.p99_us"),
    ("publish match-one (to mailbox), median", "us", "match_one.median_us"),
    ("publish match-one (to mailbox), p99", "us", "match_one.p99_us"),
    ("match-one incl. delivery, per msg", "us", "match_one_delivered_us"),
]


def value(result: dict[str, Any], path: str) -> float:
    v: Any = result
    for key in path.split("."):
        v = v[key]
    return float(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="another checkout to compare against")
    ap.add_argument("--patterns", type=int, default=10_000)
    ap.add_argument("--topics", type=int, default=20_000)
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/routing_bench.json")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        print(json.dumps(asyncio.run(child(args.patterns, args.topics))))
        return
    sides: dict[str, dict[str, Any]] = {}
    if args.before is not None:
        print(f"before: {args.before} ...", file=sys.stderr, flush=True)
        sides["before"] = run_side(args.before.resolve(), args.patterns, args.topics)
    print(f"after: {ROOT} ...", file=sys.stderr, flush=True)
    sides["after"] = run_side(ROOT, args.patterns, args.topics)
    ratio = ["after/before"] if "before" in sides else []
    head = [f"{args.patterns:,} patterns", "unit", *sides, *ratio]
    rows = []
    for label, unit, path in ROWS:
        vals = {k: value(r, path) for k, r in sides.items()}
        row = [label, unit, *(f"{v:,.2f}" for v in vals.values())]
        if "before" in vals:
            row.append(f"{vals['after'] / vals['before']:.3f}x")
        rows.append(row)
    rows.append(
        ["other processes' CPU", "cores", *(str(r["other_work_cores"]) for r in sides.values())]
    )
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [
            max(len(str(r[i])) for r in [head, *rows] if i < len(r)) for i in range(len(head))
        ]
        for row in [head, *rows]:
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    machine = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    args.json.write_text(json.dumps({"machine": machine, "sides": sides}, indent=2) + "\n")


if __name__ == "__main__":
    main()
