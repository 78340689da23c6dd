"""What charging a node's model call to the driver's budget costs, per call.

A node process (this file with ``--node``) admits and settles ``--calls`` calls one after
another through :class:`pantheon.runner._budget_relay.RemoteBudgetGuard`, over its real
stdin and stdout, to a driver (this process) answering with
:class:`pantheon.runner._budget_relay.BudgetRelay` through
``pantheon.runner._multiprocess._Child``, the pipes and reader a run uses. The same loop on a
local :class:`agents.BudgetGuard` in the node is the baseline: the difference is what the
control link adds before each model call (the settle line is one-way and not waited for).

    .venv/bin/python benchmarks/budget_link_bench.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import time
from typing import Any

from agents import Budget, BudgetGuard, BudgetLedger
from pantheon.runner._budget_relay import (
    BUDGET_COMMAND,
    BUDGET_EVENT,
    BudgetRelay,
    NodeBudgetLink,
    RemoteBudgetGuard,
)
from pantheon.runner._multiprocess import _Child, _stdin_lines, say_control, split_control


def _guard() -> BudgetGuard:
    return BudgetGuard([BudgetLedger("run", Budget(tokens=10**15))])


async def _calls(guard: BudgetGuard, n: int) -> list[float]:
    """Seconds each admission took (the settle after it is part of the loop, not timed)."""
    took = []
    for _ in range(n):
        started = time.perf_counter()
        await guard.admit()
        took.append(time.perf_counter() - started)
        guard.settle(5, 0.0, True)
    return took


async def node(calls: int) -> None:
    say = functools.partial(say_control, sys.stdout)
    link = NodeBudgetLink("bench", say)
    _, tap = split_control(
        await _stdin_lines(), "bench", {BUDGET_COMMAND: link.answered}, (link.driver_gone,)
    )
    local = await _calls(_guard(), calls)
    remote = await _calls(RemoteBudgetGuard(link, "asker"), calls)
    say("result", local=local, remote=remote)
    tap.cancel()


def _ms(samples: list[float], q: float) -> float:
    return (
        statistics.quantiles(samples, n=100)[int(q) - 1] * 1000 if q < 100 else max(samples) * 1000
    )


async def driver(calls: int) -> dict[str, Any]:
    relay = BudgetRelay({"asker": _guard()}, {"bench": ["asker"]})
    command = [sys.executable, __file__, "--node", "--calls", str(calls)]
    child = await _Child.spawn("bench", ("asker",), command, "bench node")
    child.handlers[BUDGET_EVENT] = relay.on_event("bench", child.send)
    try:
        while (event := await child.events.get()).get("event") != "result":
            if event.get("event") == "eof":
                raise SystemExit(f"the node died:{child.tail()}")
    finally:
        await child.close()
        await relay.aclose()
    [ledger] = relay.guards["asker"].ledgers
    assert ledger.settled == calls and ledger.in_flight == 0, "every call settled on the driver"
    out = {}
    for key in ("local", "remote"):
        samples = event[key]
        out[key] = {
            "median_ms": round(statistics.median(samples) * 1000, 4),
            "p99_ms": round(_ms(samples, 99), 4),
            "max_ms": round(max(samples) * 1000, 4),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--node", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.node:
        asyncio.run(node(args.calls))
        return
    result = asyncio.run(driver(args.calls))
    print(f"{args.calls} admissions, one after another")
    print("| guard | median (ms) | p99 (ms) | max (ms) |")
    print("|---|---|---|---|")
    for key, row in result.items():
        print(f"| {key} | {row['median_ms']} | {row['p99_ms']} | {row['max_ms']} |")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
