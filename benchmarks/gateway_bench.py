#!/usr/bin/env python
"""The HTTP/WebSocket gateway against the seed relay's ("Pulsar Relay") table, in one run.

    .venv/bin/python benchmarks/gateway_bench.py [--quick] [--repeats 3] [--markdown]
        [--json PATH]

Starts ``pantheon serve`` on a small scenario (one subscriber agent on ``bench.*`` that does
nothing, so every published message is also delivered once; no recording, as the seed
stored nothing either) on a free loopback port, in its own process, and drives it from this
one, on uvloop:

* single publish: 1,000 sequential ``POST /v1/topics/bench.single`` on one keep-alive
  connection (seed: 1,338 msg/s);
* bulk: sequential ``POST /v1/batch`` of 50 messages (seed: 32,955 msg/s in batches of 50),
  then the same with 4 connections at once, and with batches of 1,000, 4 connections (the
  ingest ceiling, for the goal of 330,000 msg/s); and that last one again on a topic no
  agent subscribes to, which leaves out the delivery to the agent (the team's cost, not
  the gateway's) and so shows the gateway and ``emit`` alone;
* WebSocket end to end: 20 subscribers on ``bench.e2e``; 50 messages published one at a
  time, each waiting until all 20 have it; latency from before the POST to receipt, per
  delivery (seed: 2.1 ms p50 over 1,000 deliveries);
* broadcast: 30 subscribers on ``bench.bcast``; 20,000 messages published in batches of
  1,000; deliveries per second from the first POST until the last subscriber has the last
  message (seed: 15,731 deliveries/s, 50 messages to 30 subscribers).

HTTP requests go out through a minimal keep-alive HTTP/1.1 client written on asyncio streams
(request bytes built before the clock starts), so the client's own cost is small next to
httpx's; WebSocket subscribers use the ``websockets`` library with compression off, and
count messages by decoding each frame's ``messages`` as raw JSON items (msgspec). Client
and server share the machine's cores, as they did for the seed (one laptop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent

#: The seed relay's figures (its published table), by row.
SEED = {
    "single": 1_338.0,
    "bulk50": 32_955.0,
    "e2e_p50_ms": 2.1,
    "broadcast": 15_731.0,
}
GOAL = 10.0

SCENARIO = """
version: 1
name: gateway_bench
input: {kind: http, topic: bench.inbox}
gateway:
  max_body: 16777216
  max_batch: 10000
  send_queue: 200000
  max_drops: 0
agents:
  sink: {handler: "bench_team:sink", subscribe: ["bench.*"], max_queue: 1000000}
"""
TEAM = """
async def sink(env):
    return None
"""


class Frame(msgspec.Struct):
    dropped: int
    messages: list[msgspec.Raw]


class E2EMessage(msgspec.Struct):
    payload: dict[str, int]


class E2EFrame(msgspec.Struct):
    dropped: int
    messages: list[E2EMessage]


_frame = msgspec.json.Decoder(Frame).decode
_e2e_frame = msgspec.json.Decoder(E2EFrame).decode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request_bytes(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


class Conn:
    """One keep-alive HTTP/1.1 connection: write a request, read one response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def call(self, raw: bytes) -> tuple[int, bytes]:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        body = await self.reader.readexactly(length)
        return status, body

    def close(self) -> None:
        self.writer.close()


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def bench_single(port: int, n: int) -> dict[str, float]:
    conn = await Conn.open(port)
    raws = [
        request_bytes("/v1/topics/bench.single", b'{"n":%d,"text":"hello"}' % i) for i in range(n)
    ]
    for raw in raws[:50]:  # warm-up
        await conn.call(raw)
    lat = []
    t0 = time.perf_counter()
    for raw in raws:
        t = time.perf_counter()
        status, _ = await conn.call(raw)
        lat.append(time.perf_counter() - t)
        assert status == 202, status
    elapsed = time.perf_counter() - t0
    conn.close()
    return {
        "msg_s": n / elapsed,
        "p50_ms": pct(lat, 0.5) * 1000,
        "p99_ms": pct(lat, 0.99) * 1000,
    }


async def bench_bulk(
    port: int, batches: int, size: int, conns: int, topic: str = "bench.bulk"
) -> dict[str, float]:
    payloads = [{"n": i, "text": "hello"} for i in range(size)]
    raw = request_bytes("/v1/batch", msgspec.json.encode({"topic": topic, "payloads": payloads}))
    pool = [await Conn.open(port) for _ in range(conns)]
    for c in pool:  # warm-up
        await c.call(raw)
    lat: list[float] = []
    per = batches // conns

    async def worker(c: Conn) -> None:
        for _ in range(per):
            t = time.perf_counter()
            status, body = await c.call(raw)
            lat.append(time.perf_counter() - t)
            assert status == 202, (status, body[:200])

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in pool))
    elapsed = time.perf_counter() - t0
    for c in pool:
        c.close()
    return {
        "msg_s": per * conns * size / elapsed,
        "batch_p50_ms": pct(lat, 0.5) * 1000,
        "batch_p99_ms": pct(lat, 0.99) * 1000,
    }


async def subscribers(port: int, pattern: str, n: int) -> list[Any]:
    import websockets

    url = f"ws://127.0.0.1:{port}/v1/subscribe?pattern={pattern}"
    return [
        await websockets.connect(url, compression=None, max_size=None, max_queue=64)
        for _ in range(n)
    ]


async def bench_e2e(port: int, clients: int, messages: int) -> dict[str, float]:
    socks = await subscribers(port, "bench.e2e", clients)
    conn = await Conn.open(port)
    lat: list[float] = []
    everyone = asyncio.Event()  # set when all subscribers have the message just sent
    target = 0

    async def receive(ws: Any, want: int, sent_at: dict[int, int]) -> None:
        got = 0
        while got < want:
            data = await ws.recv()
            now = time.monotonic_ns()
            for m in _e2e_frame(data).messages:
                lat.append((now - sent_at[m.payload["n"]]) / 1e6)
                got += 1
            if len(lat) >= target:
                everyone.set()

    for warm in (True, False):
        sent_at: dict[int, int] = {}
        count = 5 if warm else messages
        tasks = [asyncio.ensure_future(receive(ws, count, sent_at)) for ws in socks]
        lat.clear()
        t0 = time.perf_counter()
        for i in range(count):
            raw = request_bytes("/v1/topics/bench.e2e", b'{"n":%d}' % i)
            target = (i + 1) * clients
            everyone.clear()
            sent_at[i] = time.monotonic_ns()
            status, _ = await conn.call(raw)
            assert status == 202
            if len(lat) < target:  # one at a time: every subscriber has this one first
                await everyone.wait()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
    conn.close()
    for ws in socks:
        await ws.close()
    return {
        "p50_ms": statistics.median(lat),
        "p95_ms": pct(lat, 0.95),
        "p99_ms": pct(lat, 0.99),
        "deliveries_s": len(lat) / elapsed,
    }


async def bench_broadcast(port: int, clients: int, messages: int, batch: int) -> dict[str, float]:
    socks = await subscribers(port, "bench.bcast", clients)
    conn = await Conn.open(port)
    payloads = [{"n": i, "text": "broadcast"} for i in range(batch)]
    raw = request_bytes(
        "/v1/batch", msgspec.json.encode({"topic": "bench.bcast", "payloads": payloads})
    )
    dropped = 0

    async def receive(ws: Any, want: int) -> None:
        nonlocal dropped
        got = 0
        while got < want:
            frame = _frame(await ws.recv())
            got += len(frame.messages)
            dropped += frame.dropped

    # warm-up round
    tasks = [asyncio.ensure_future(receive(ws, batch)) for ws in socks]
    await conn.call(raw)
    await asyncio.gather(*tasks)
    tasks = [asyncio.ensure_future(receive(ws, messages)) for ws in socks]
    t0 = time.perf_counter()
    for _ in range(messages // batch):
        status, _ = await conn.call(raw)
        assert status == 202
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    conn.close()
    for ws in socks:
        await ws.close()
    assert dropped == 0, f"{dropped} messages dropped"
    return {"deliveries_s": clients * messages / elapsed, "seconds": elapsed}


def cpu_busy() -> float:
    """Cores busy with other work over one second, from /proc/stat (before the run)."""

    def snap() -> tuple[int, int]:
        parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = parts[3] + parts[4]
        return sum(parts), idle

    t1, i1 = snap()
    time.sleep(1)
    t2, i2 = snap()
    cores = os.cpu_count() or 1
    return cores * (1 - (i2 - i1) / max(1, t2 - t1))


async def run(port: int, quick: bool, repeats: int) -> dict[str, Any]:
    """Every operation ``repeats`` times, in turn; the median of each figure."""
    runs = [await run_once(port, quick) for _ in range(repeats)]
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        out[key] = {f: statistics.median(r[key][f] for r in runs) for f in first}
    out["repeats"] = runs
    return out


async def run_once(port: int, quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["single"] = await bench_single(port, 1000)
    out["bulk50"] = await bench_bulk(port, 400 if quick else 2000, 50, 1)
    out["bulk50x4"] = await bench_bulk(port, 400 if quick else 2000, 50, 4)
    out["bulk1000x4"] = await bench_bulk(port, 40 if quick else 400, 1000, 4)
    out["bulk1000x4_unsubscribed"] = await bench_bulk(
        port, 40 if quick else 400, 1000, 4, topic="nobody.bulk"
    )
    out["e2e"] = await bench_e2e(port, 20, 50)
    out["broadcast"] = await bench_broadcast(port, 30, 4000 if quick else 20_000, 1000)
    return out


def serve(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    (tmp / "bench.yaml").write_text(SCENARIO)
    (tmp / "bench_team.py").write_text(TEAM)
    env = {**os.environ, "PANTHEON_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "serve", str(tmp / "bench.yaml"), "--port",
         str(port), "--no-record"],
        cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the gateway did not start")


def table(r: dict[str, Any]) -> str:
    rows = [
        ("single HTTP publish", "msg/s", r["single"]["msg_s"], SEED["single"], False),
        ("bulk, batches of 50, 1 connection", "msg/s", r["bulk50"]["msg_s"], SEED["bulk50"], True),
        (
            "bulk, batches of 50, 4 connections",
            "msg/s",
            r["bulk50x4"]["msg_s"],
            SEED["bulk50"],
            True,
        ),
        (
            "bulk, batches of 1000, 4 connections",
            "msg/s",
            r["bulk1000x4"]["msg_s"],
            SEED["bulk50"],
            True,
        ),
        (
            "same, a topic nobody subscribes to",
            "msg/s",
            r["bulk1000x4_unsubscribed"]["msg_s"],
            SEED["bulk50"],
            False,
        ),
        ("WebSocket end to end p50 (20 subs)", "ms", r["e2e"]["p50_ms"], SEED["e2e_p50_ms"], False),
        (
            "broadcast to 30 WebSocket subs",
            "deliv/s",
            r["broadcast"]["deliveries_s"],
            SEED["broadcast"],
            True,
        ),
    ]
    lines = [
        "| operation | unit | ours | seed | ratio | goal (>= 10x) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name, unit, ours, seed, goal in rows:
        ratio = seed / ours if unit == "ms" else ours / seed
        mark = ("met" if ratio >= GOAL else "NOT met") if goal else "reported"
        lines.append(f"| {name} | {unit} | {ours:,.2f} | {seed:,.1f} | {ratio:.1f}x | {mark} |")
    lines.append("")
    lines.append(
        f"single publish p50 {r['single']['p50_ms']:.3f} ms, p99 {r['single']['p99_ms']:.3f} ms; "
        f"batch of 50 p50 {r['bulk50']['batch_p50_ms']:.3f} ms; "
        f"e2e p95 {r['e2e']['p95_ms']:.3f} ms, p99 {r['e2e']['p99_ms']:.3f} ms"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every operation (median)")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--json", type=Path, help="also write the raw figures here")
    args = ap.parse_args()
    busy = cpu_busy()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = serve(Path(tmp), port)
        try:
            import uvloop

            results = uvloop.run(run(port, args.quick, args.repeats))
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    results["other_work_cores"] = busy
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(f"other work on the machine before the run: {busy:.2f} of {os.cpu_count()} cores")
    print(f"medians of {args.repeats} runs")
    print(table(results) if args.markdown else json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
