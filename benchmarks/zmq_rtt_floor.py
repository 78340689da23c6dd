#!/usr/bin/env python
"""The round-trip floor of pyzmq on this machine: DEALER -> ROUTER echo between two processes
over ipc, with no bus, no envelope and no broker, in three styles:

blocking   ``send`` then a blocking ``recv`` on both sides (no event loop at all);
asyncio    the echo and the asker each read their socket from a reader callback on its FD
           (``loop.add_reader``), draining non-blocking, as Pantheon's transport does;
uvloop     the same on uvloop.

Why: the issue asks for a round trip p50 of at most 100 us. Every ZeroMQ message crosses the
sender's and the receiver's libzmq I/O threads, so even these bare echoes pay four thread
hand-offs per trip; this says how far below or above 100 us that floor is here, so the
Pantheon row of ``zmq_bench.py`` can be read against it. Run::

    .venv/bin/python benchmarks/zmq_rtt_floor.py [--trips 5000] [--repeats 5]

Prints p50/p99 in microseconds per style, the median over repeats (the styles interleaved).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import zmq

PAYLOAD = b"x" * 322  # the size of zmq_bench's payload
STYLES = ("blocking", "asyncio", "uvloop")


def _echo_blocking(addr: str) -> None:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(addr)
    while True:
        msg = sock.recv_multipart()
        if msg[1] == b"q":
            return
        sock.send_multipart(msg)


def _run(style: str, main: Callable[[], object]) -> object:
    if style == "uvloop":
        import uvloop

        return uvloop.run(main())  # type: ignore[arg-type]
    return asyncio.run(main())  # type: ignore[arg-type]


def _echo_loop(addr: str, style: str) -> None:
    async def main() -> None:
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.bind(addr)
        done = asyncio.get_running_loop().create_future()

        def drain() -> None:
            while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                msg = sock.recv_multipart(zmq.NOBLOCK)
                if msg[1] == b"q":
                    if not done.done():
                        done.set_result(None)
                    return
                sock.send_multipart(msg, zmq.NOBLOCK)

        asyncio.get_running_loop().add_reader(sock.getsockopt(zmq.FD), drain)
        drain()
        await done

    _run(style, main)


def _echo(addr: str, style: str) -> None:
    if style == "blocking":
        _echo_blocking(addr)
    else:
        _echo_loop(addr, style)


def _ask_blocking(addr: str, trips: int) -> list[int]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(addr)
    out = []
    for _ in range(trips):
        t = time.perf_counter_ns()
        sock.send(PAYLOAD)
        sock.recv()
        out.append(time.perf_counter_ns() - t)
    sock.send(b"q")
    return out


def _ask_loop(addr: str, trips: int, style: str) -> list[int]:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.connect(addr)
        waiting: list[asyncio.Future[bytes]] = []

        def drain() -> None:
            while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                msg = sock.recv(zmq.NOBLOCK)
                if waiting and not waiting[0].done():
                    waiting.pop().set_result(msg)

        loop.add_reader(sock.getsockopt(zmq.FD), drain)
        out = []
        for _ in range(trips):
            t = time.perf_counter_ns()
            fut = loop.create_future()
            waiting.append(fut)
            sock.send(PAYLOAD, zmq.NOBLOCK)
            drain()  # a send can take the FD's edge for a reply that is already there
            await fut
            out.append(time.perf_counter_ns() - t)
        sock.send(b"q")
        await asyncio.sleep(0.05)
        return out

    return _run(style, main)  # type: ignore[return-value]


def measure(style: str, trips: int) -> tuple[float, float]:
    """One repeat: a fresh echo process, ``trips`` round trips; (p50, p99) in us."""
    addr = f"ipc://{tempfile.gettempdir()}/pantheon-rtt-{os.getpid()}-{style}"
    echo = multiprocessing.get_context("spawn").Process(target=_echo, args=(addr, style))
    echo.start()
    try:
        time.sleep(0.3)  # the echo binds; the asker's DEALER queues until it connects anyway
        warm = trips // 10
        if style == "blocking":
            samples = _ask_blocking(addr, trips + warm)
        else:
            samples = _ask_loop(addr, trips + warm, style)
    finally:
        echo.join(10)
        if echo.is_alive():
            echo.kill()
    samples = sorted(samples[warm:])
    return samples[len(samples) // 2] / 1e3, samples[int(len(samples) * 0.99)] / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trips", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {s: [] for s in STYLES}
    for _ in range(args.repeats):
        for style in STYLES:
            results[style].append(measure(style, args.trips))
    print(f"pyzmq DEALER->ROUTER echo over ipc, {args.trips} trips x {args.repeats} repeats")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print("| style | RTT p50 us | RTT p99 us |\n|---|---:|---:|")
    for style, reps in results.items():
        p50 = statistics.median(r[0] for r in reps)
        p99 = statistics.median(r[1] for r in reps)
        print(f"| {style} | {p50:.1f} | {p99:.1f} |")


if __name__ == "__main__":
    main()
