#!/usr/bin/env python
"""The bus's inbound path: what a receiving node spends per message from another bus.

    .venv/bin/python benchmarks/inbound_bench.py [--n 200000] [--repeats 5]
        [--loop uvloop|asyncio] [--frame 64] [--markdown]

A transport hands every remote message to ``BusPort.deliver(env, names)`` (``Bus._inbound``)
with a :class:`~bus.Receipt` in ``env.reply``; the bus queues it, a worker runs the handler and
settles the receipt. This script times exactly that, without a socket or a codec: a
:class:`CaptureTransport` keeps the port the bus gives it in ``start``, and the script delivers
``--n`` prebuilt envelopes through it the way the ZeroMQ node does, ``--frame`` messages per
reader wake-up (one shared receipt per frame, as the node's ``FrameReceipt``), yielding to the
loop between frames so the worker drains them, then ``await bus.drain()``.

Cases, each a fresh bus per repeat:

* ``plain``: one subscription with a no-op async handler; every envelope carries its
  frame's counting receipt.
* ``request``: one subscription whose handler returns a value; every envelope carries its
  own request receipt (as ``_RequestReceipt``: it keeps the first answer and settles the
  frame's receipt).
* ``fanout2``: two no-op subscriptions on the topic, so each message is settled twice.

Beside each case, ``floor`` runs the same frames, handlers and receipts through the least
any mailbox can do (a deque per subscription, one worker task each that pops, awaits the
handler and settles): the part of the cost that is the transport's loop, the handler and
the receipt's own methods. ``bus`` = case - floor is what the bus itself adds.

Building the envelopes and receipts is the transport's (decode) cost, so it happens before
the clock starts. Each repeat checks the receipts: ``expect`` summed to the deliveries,
``settle`` came as often, and every request got its answer. Reported per message: wall
time (``time.perf_counter``) and CPU time of this process (``time.process_time``), the
median of ``--repeats`` after one untimed warm-up. On a shared machine the CPU figure is
the steadier one.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bus import Bus, Envelope, Transport  # noqa: E402
from bus._transport import BusPort, Receipt  # noqa: E402

TOPIC = "bench.inbound"
CASES = ("plain", "request", "fanout2")


class CaptureTransport(Transport):
    """No peers; keeps the port so the benchmark can play the remote side."""

    def __init__(self) -> None:
        self.port: BusPort | None = None

    async def start(self, port: BusPort) -> None:
        self.port = port

    def advertise(self, subscriptions: Iterable[tuple[str, str]]) -> None:
        return None

    def has_remote(self, topic: str) -> bool:
        return False

    async def send(self, envelope: Envelope) -> None:
        raise AssertionError("nothing subscribes elsewhere, so nothing is sent")

    async def aclose(self) -> None:
        return None


class CountingReceipt(Receipt):
    """A frame's receipt: counts what the bus promised and what it settled."""

    __slots__ = ("expected", "settled")

    def __init__(self) -> None:
        self.expected = 0
        self.settled = 0

    def expect(self, count: int) -> None:
        self.expected += count

    def settle(self, result: Any, error: BaseException | None) -> None:
        self.settled += 1


class RequestReceipt(Receipt):
    """A request's receipt: keeps the first answer, then settles its frame's receipt."""

    __slots__ = ("answer", "frame")

    def __init__(self, frame: CountingReceipt) -> None:
        self.frame = frame
        self.answer: Any = None

    def expect(self, count: int) -> None:
        self.frame.expect(count)

    def settle(self, result: Any, error: BaseException | None) -> None:
        if self.answer is None and (error is not None or result is not None):
            self.answer = result if error is None else error
        self.frame.settle(result, error)


async def noop(env: Envelope) -> None:
    return None


async def answer(env: Envelope) -> int:
    return 1


def build(case: str, n: int, frame: int) -> tuple[list[list[Envelope]], list[CountingReceipt]]:
    """The frames as a transport would have decoded them: envelopes with their receipts."""
    frames: list[list[Envelope]] = []
    receipts: list[CountingReceipt] = []
    now = time.monotonic_ns()
    for start in range(0, n, frame):
        receipt = CountingReceipt()
        receipts.append(receipt)
        envs = []
        for i in range(start, min(start + frame, n)):
            env = Envelope(TOPIC, i, 1, i + 1, None, i + 1, None, None, now, 0, "remote")
            env.reply = RequestReceipt(receipt) if case == "request" else receipt
            envs.append(env)
        frames.append(envs)
    return frames, receipts


async def run_case(case: str, n: int, frame: int) -> tuple[float, float]:
    """One repeat: a fresh bus, every frame delivered, drained. Returns (wall, cpu) seconds."""
    transport = CaptureTransport()
    async with Bus(transport=transport) as bus:
        if case == "request":
            bus.on(TOPIC, answer, name="responder")
        else:
            bus.on(TOPIC, noop, name="sink")
            if case == "fanout2":
                bus.on(TOPIC, noop, name="sink2")
        fanout = 2 if case == "fanout2" else 1
        frames, receipts = build(case, n, frame)
        assert transport.port is not None
        deliver: Callable[[Envelope, Collection[str] | None], Awaitable[None] | None]
        deliver = transport.port.deliver
        gc.collect()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for envs in frames:
            for env in envs:
                waiting = deliver(env, None)
                if waiting is not None:
                    await waiting
            await asyncio.sleep(0)
        await bus.drain()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        expected = sum(r.expected for r in receipts)
        settled = sum(r.settled for r in receipts)
        assert expected == settled == n * fanout, (case, expected, settled, n * fanout)
        if case == "request":
            assert all(env.reply.answer == 1 for envs in frames for env in envs)
    return wall, cpu


async def run_floor(case: str, n: int, frame: int) -> tuple[float, float]:
    """One repeat of ``case`` without the bus: a bare deque and worker per subscription."""
    loop = asyncio.get_running_loop()
    handler = answer if case == "request" else noop
    fanout = 2 if case == "fanout2" else 1
    queues: list[deque[Envelope]] = [deque() for _ in range(fanout)]
    idle: list[list[asyncio.Future[None]]] = [[] for _ in range(fanout)]
    left = [n * fanout]
    done: asyncio.Future[None] = loop.create_future()

    def deliver(env: Envelope, names: Collection[str] | None) -> None:
        for queue, parked in zip(queues, idle, strict=True):
            queue.append(env)
            if parked:
                parked.pop().set_result(None)
        env.reply.expect(fanout)

    async def work(queue: deque[Envelope], parked: list[asyncio.Future[None]]) -> None:
        while True:
            if not queue:
                fut = loop.create_future()
                parked.append(fut)
                await fut
                continue
            env = queue.popleft()
            result = await handler(env)
            env.reply.settle(result, None)
            left[0] -= 1
            if not left[0]:
                done.set_result(None)

    workers = [loop.create_task(work(q, p)) for q, p in zip(queues, idle, strict=True)]
    frames, receipts = build(case, n, frame)
    gc.collect()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for envs in frames:
        for env in envs:
            deliver(env, None)
        await asyncio.sleep(0)
    await done
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    assert sum(r.settled for r in receipts) == n * fanout
    return wall, cpu


def measure(case: str, n: int, frame: int, repeats: int, loop: str) -> dict[str, Any]:
    """Repeats of the case and of its floor, interleaved so drift hits both alike."""
    runner = _runner(loop)
    runner(run_case(case, min(n, 20_000), frame))  # warm-up
    runner(run_floor(case, min(n, 20_000), frame))
    walls, cpus, floors = [], [], []
    for _ in range(repeats):
        wall, cpu = runner(run_case(case, n, frame))
        walls.append(wall / n * 1e6)
        cpus.append(cpu / n * 1e6)
        floors.append(runner(run_floor(case, n, frame))[1] / n * 1e6)
    return {
        "case": case,
        "wall_us": statistics.median(walls),
        "cpu_us": statistics.median(cpus),
        "floor_cpu_us": statistics.median(floors),
        "bus_cpu_us": statistics.median(c - f for c, f in zip(cpus, floors, strict=True)),
        "cpu_repeats": cpus,
    }


def _runner(loop: str) -> Callable[[Any], Any]:
    if loop == "uvloop":
        import uvloop

        return uvloop.run
    return asyncio.run


def markdown_table(rows: list[dict[str, Any]], n: int, loop: str) -> str:
    lines = [
        f"| case ({loop}, N={n:,}) | wall µs/msg | CPU µs/msg | floor CPU | bus CPU "
        "(CPU - floor) | CPU repeats |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        reps = ", ".join(f"{c:.3f}" for c in r["cpu_repeats"])
        lines.append(
            f"| {r['case']} | {r['wall_us']:.3f} | {r['cpu_us']:.3f} | "
            f"{r['floor_cpu_us']:.3f} | {r['bus_cpu_us']:.3f} | {reps} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000, help="envelopes per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--frame", type=int, default=64, help="messages per reader wake-up")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                    help="event loop (pantheon's nodes run on uvloop)")  # fmt: skip
    ap.add_argument("--case", choices=CASES, action="append", help="default: every case")
    ap.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, loop {args.loop}, N={args.n:,}", flush=True)
    rows = []
    for case in args.case or CASES:
        row = measure(case, args.n, args.frame, args.repeats, args.loop)
        rows.append(row)
        print(
            f"{case:8s} wall {row['wall_us']:.3f} µs/msg  CPU {row['cpu_us']:.3f} µs/msg  "
            f"(floor {row['floor_cpu_us']:.3f}, bus {row['bus_cpu_us']:.3f})",
            flush=True,
        )
    print(f"load average {os.getloadavg()[0]:.2f} after")
    if args.markdown:
        print(markdown_table(rows, args.n, args.loop))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
