#!/usr/bin/env python
"""Pantheon over NATS JetStream beside the raw nats-py JetStream client, on one server, one run.

::

    .venv/bin/python benchmarks/nats_bench.py [--count N] [--trips N] [--repeats N]
        [--storage file|memory] [--json PATH]

Starts its own ``nats-server -js`` (free loopback port, temporary store), then alternates the
two rows ``--repeats`` times so both see the same machine load; the verdict is the ratio of
medians (the machine is shared: absolute numbers move, ratios much less).

Every message is the first email of ``scenarios/data/support_emails.jsonl`` (the Observer's
payload), msgpack-encoded by the sender and decoded by the receiver. Publisher and consumer
are two connections (two buses) in this one process and event loop, for both rows.

one way   ``count`` messages to a stream; the rate is ``count`` over the time from the first
          publish to the last message handled *and acknowledged* by the consumer.
          raw:      ``js.publish_async`` (Nats-Msg-Id header, its default window of pending
                    acks), a durable pull consumer, ``fetch(batch=256)``, ``await msg.ack()``
                    per message.
          pantheon: ``await bus.emit`` on one bus, a subscription on the other
                    (``NatsTransport``, defaults: credit 256, window 4096).
round trip one message in flight, ping on one subject, pong back on another, both through the
          stream; p50/p99 of the per-trip times.
          raw:      ``await js.publish`` (waits for its stream ack, as a client that must not
                    lose the message does), ``fetch(1)`` on each side, ack.
          pantheon: ``await bus.emit("ping")``; the other bus's handler emits "pong"; the
                    first bus's handler completes the trip. (``request`` row: ``bus.request``,
                    the reply over a NATS inbox.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bus import Bus, Envelope  # noqa: E402
from bus.backends.nats import NatsServer, NatsTransport  # noqa: E402

EMAIL = json.loads((ROOT / "scenarios" / "data" / "support_emails.jsonl").open().readline())
enc = msgspec.msgpack.Encoder().encode
dec = msgspec.msgpack.Decoder().decode


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def raw_one_way(url: str, count: int, storage: StorageType, run: int) -> float:
    pub = await nats.connect(url)
    sub = await nats.connect(url)
    js_pub, js_sub = pub.jetstream(), sub.jetstream()
    stream = f"RAW{run}"
    await js_pub.add_stream(
        StreamConfig(name=stream, subjects=[f"raw{run}.>"], storage=storage, duplicate_window=120)
    )
    psub = await js_sub.pull_subscribe(
        f"raw{run}.x",
        durable="raw",
        stream=stream,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=4096),
    )
    got = 0

    async def consume() -> None:
        nonlocal got
        while got < count:
            try:
                msgs = await psub.fetch(256, timeout=1)
            except nats.errors.TimeoutError:
                continue
            for m in msgs:
                dec(m.data)
                await m.ack()
                got += 1

    task = asyncio.create_task(consume())
    start = time.perf_counter()
    for i in range(count):
        await js_pub.publish_async(f"raw{run}.x", enc(EMAIL), headers={"Nats-Msg-Id": str(i)})
    await js_pub.publish_async_completed()
    await task
    elapsed = time.perf_counter() - start
    await js_pub.delete_stream(stream)
    await pub.close()
    await sub.close()
    return count / elapsed


async def raw_rtt(url: str, trips: int, storage: StorageType, run: int) -> list[float]:
    a = await nats.connect(url)
    b = await nats.connect(url)
    ja, jb = a.jetstream(), b.jetstream()
    stream = f"RAWRTT{run}"
    await ja.add_stream(StreamConfig(name=stream, subjects=[f"rtt{run}.>"], storage=storage))
    pings = await jb.pull_subscribe(f"rtt{run}.ping", durable="ping", stream=stream)
    pongs = await ja.pull_subscribe(f"rtt{run}.pong", durable="pong", stream=stream)

    async def responder() -> None:
        while True:
            try:
                (m,) = await pings.fetch(1, timeout=5)
            except nats.errors.TimeoutError:
                continue
            body = enc(dec(m.data))
            await m.ack()
            await jb.publish(f"rtt{run}.pong", body)

    task = asyncio.create_task(responder())
    times = []
    for _ in range(trips):
        t0 = time.perf_counter()
        await ja.publish(f"rtt{run}.ping", enc(EMAIL))
        (m,) = await pongs.fetch(1, timeout=5)
        dec(m.data)
        await m.ack()
        times.append(time.perf_counter() - t0)
    task.cancel()
    await ja.delete_stream(stream)
    await a.close()
    await b.close()
    return times


def transport(url: str, team: str, storage: str) -> NatsTransport:
    return NatsTransport(url, team=team, storage=storage)


async def pantheon_one_way(url: str, count: int, storage: str, run: int) -> float:
    done = asyncio.Event()
    got = 0
    async with (
        Bus(transport=transport(url, f"ow{run}", storage)) as a,
        Bus(transport=transport(url, f"ow{run}", storage)) as b,
    ):

        @b.on("email.received", name="sink", max_queue=10_000)
        def sink(env: Envelope) -> None:
            nonlocal got
            got += 1
            if got == count:
                done.set()

        await b.transport.sync()
        while not a.transport.has_remote("email.received"):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        start = time.perf_counter()
        for _ in range(count):
            await a.emit("email.received", EMAIL)
        await done.wait()
        await a.drain()  # the consumer acknowledged everything (its ack floor passed)
        elapsed = time.perf_counter() - start
    return count / elapsed


async def pantheon_rtt(
    url: str, trips: int, storage: str, run: int
) -> tuple[list[float], list[float]]:
    async with (
        Bus(transport=transport(url, f"rtt{run}", storage)) as a,
        Bus(transport=transport(url, f"rtt{run}", storage)) as b,
    ):
        back: asyncio.Future[None] | None = None

        @b.on("ping", name="responder")
        async def responder(env: Envelope) -> Any:
            await b.emit("pong", env.payload)
            return env.payload

        @a.on("pong", name="client")
        def client(env: Envelope) -> None:
            if back is not None and not back.done():
                back.set_result(None)

        await a.transport.sync()
        await b.transport.sync()
        while not (a.transport.has_remote("ping") and b.transport.has_remote("pong")):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        times = []
        for _ in range(trips):
            back = loop.create_future()
            t0 = time.perf_counter()
            await a.emit("ping", EMAIL)
            await back
            times.append(time.perf_counter() - t0)
        requests = []
        for _ in range(trips):
            t0 = time.perf_counter()
            await a.request("ping", EMAIL)
            requests.append(time.perf_counter() - t0)
        await a.drain()
    return times, requests


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--trips", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--storage", choices=("file", "memory"), default="file")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    storage = StorageType.FILE if args.storage == "file" else StorageType.MEMORY
    rows: dict[str, list[Any]] = {
        k: [] for k in ("raw_ow", "pan_ow", "raw_rtt", "pan_rtt", "pan_req")
    }
    server = NatsServer().start()
    try:
        for run in range(args.repeats):
            rows["raw_ow"].append(await raw_one_way(server.url, args.count, storage, run))
            rows["pan_ow"].append(await pantheon_one_way(server.url, args.count, args.storage, run))
            raw = await raw_rtt(server.url, args.trips, storage, run)
            pan, req = await pantheon_rtt(server.url, args.trips, args.storage, run)
            rows["raw_rtt"].append((pct(raw, 0.5), pct(raw, 0.99)))
            rows["pan_rtt"].append((pct(pan, 0.5), pct(pan, 0.99)))
            rows["pan_req"].append((pct(req, 0.5), pct(req, 0.99)))
            print(
                f"run {run + 1}: one way raw {rows['raw_ow'][-1]:,.0f}/s pantheon "
                f"{rows['pan_ow'][-1]:,.0f}/s; rtt p50 raw {rows['raw_rtt'][-1][0] * 1e3:.2f} ms "
                f"pantheon {rows['pan_rtt'][-1][0] * 1e3:.2f} ms",
                flush=True,
            )
    finally:
        server.stop()

    def med(key: str, i: int | None = None) -> float:
        values = rows[key] if i is None else [v[i] for v in rows[key]]
        return statistics.median(values)

    result = {
        "machine": f"{platform.node()} {platform.machine()} {platform.python_version()}",
        "storage": args.storage,
        "count": args.count,
        "trips": args.trips,
        "repeats": args.repeats,
        "one_way_msgs_per_s": {"raw": med("raw_ow"), "pantheon": med("pan_ow")},
        "one_way_ratio": med("pan_ow") / med("raw_ow"),
        "rtt_ms": {
            name: {"p50": med(key, 0) * 1e3, "p99": med(key, 1) * 1e3}
            for name, key in (
                ("raw", "raw_rtt"),
                ("pantheon", "pan_rtt"),
                ("pantheon_request", "pan_req"),
            )
        },
        "rtt_p50_ratio_raw_over_pantheon": med("raw_rtt", 0) / med("pan_rtt", 0),
        "rtt_p99_ratio_raw_over_pantheon": med("raw_rtt", 1) / med("pan_rtt", 1),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
