"""Recording overhead: emit -> no-op handler throughput with and without a Recorder.

Run: ``.venv/bin/python benchmarks/session_bench.py [N] [ROUNDS]``. Both variants run in
the same process, alternating, best of ROUNDS each. "bus msg/s" times emit + drain; "incl.
flush" adds the time until every row is committed (``Recorder.flush``). The CPU lines split
the recorded run's cost between the bus thread and the recorder's writer thread, which do
not depend on what else the machine is running (the msg/s figures do: on a 2-vCPU VM the
writer thread competes with the bus thread for CPU whenever anything else runs).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from bus import Bus, Delivery, Envelope
from pantheon.sessions import Recorder, SessionStore
from pantheon.sessions._journal import CHUNK_ROWS, DeliveryRows, EnvelopeRows
from pantheon.sessions._recorder import _Writer

_writer_cpu = [0.0]
_commit = _Writer._commit


def _timed_commit(self, conn, batches):  # type: ignore[no-untyped-def]
    started = time.thread_time()
    try:
        _commit(self, conn, batches)
    finally:
        _writer_cpu[0] += time.thread_time() - started


_Writer._commit = _timed_commit  # type: ignore[method-assign]


async def one(n: int, store: SessionStore | None) -> tuple[float, float, float, float]:
    async with Bus() as bus:
        rec = Recorder(store, scenario="bench") if store is not None else None
        if rec is not None:
            rec.attach(bus)

        @bus.on("bench.*", max_queue=n + 1)
        async def noop(env: object) -> None:
            return None

        _writer_cpu[0] = 0.0
        cpu0 = time.thread_time()
        t0 = time.perf_counter()
        for i in range(n):
            await bus.emit("bench.x", {"i": i, "text": "hello"})
        await bus.drain()
        t1 = time.perf_counter()
        cpu1 = time.thread_time()
        if rec is not None:
            await rec.flush()
        t2 = time.perf_counter()
        writer = _writer_cpu[0]
        if rec is not None:
            await rec.finish("completed", {})
    return n / (t1 - t0), n / (t2 - t0), (cpu1 - cpu0) / n * 1e6, writer / n * 1e6


def encode_cost(repeats: int = 100) -> tuple[float, float]:
    """Bus-thread ns per row to write one journal chunk of this benchmark's envelopes and
    of their deliveries, as the recorder's listeners do (in a loop here, so the listener's
    own call is counted and the handling around it is not)."""
    envs = [
        Envelope("bench.x", {"i": i, "text": "hello"}, 2, 2**62 + i, None, 2**62 + i, None,
                 None, time.monotonic_ns())
        for i in range(CHUNK_ROWS)
    ]  # fmt: skip
    dels = [Delivery("noop", e, e.created + 5, e.created + 9, "delivered") for e in envs]
    envelope_rows = EnvelopeRows(time.time(), time.monotonic_ns())
    delivery_rows = DeliveryRows()
    costs = []
    for add, batch, rows in (
        (envelope_rows.add_envelope, envs, envelope_rows),
        (delivery_rows.add_delivery, dels, delivery_rows),
    ):
        started = time.thread_time()
        for _ in range(repeats):
            for item in batch:
                add(item)  # type: ignore[operator]
            rows.take()
        costs.append((time.thread_time() - started) / repeats / CHUNK_ROWS * 1e9)
    return costs[0], costs[1]


async def main(n: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SessionStore(Path(tmp) / "bench.db")
        plain, rec = [], []
        for _ in range(rounds):
            plain.append(await one(n, None))
            rec.append(await one(n, store))
        p = max(plain, key=lambda r: r[0])
        r = max(rec, key=lambda r: r[0])
        ra = max(x[1] for x in rec)
        print(f"messages per round: {n}, rounds: {rounds} (best of each), payload: small dict")
        print(f"plain bus:           {p[0]:12,.0f} msg/s")
        print(
            f"recorded bus:        {r[0]:12,.0f} msg/s  ({(1 - r[0] / p[0]) * 100:5.1f}% overhead)"
        )
        print(f"recorded incl flush: {ra:12,.0f} msg/s  ({(1 - ra / p[0]) * 100:5.1f}% overhead)")
        print(
            f"bus thread CPU:      {p[2]:.2f} µs/msg plain, {r[2]:.2f} µs/msg recorded "
            f"(+{(r[2] / p[2] - 1) * 100:.0f}%)"
        )
        print(f"writer thread CPU:   {r[3]:.2f} µs/msg (journal commits: SQLite)")
        env_ns, del_ns = encode_cost()
        print(f"bus thread encoding: {env_ns:.0f} ns/envelope + {del_ns:.0f} ns/delivery")
        store.close()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    asyncio.run(main(n, rounds))
