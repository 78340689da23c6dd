#!/usr/bin/env python
"""The gateway under hostile and crowded clients, before and after, in one run.

    .venv/bin/python benchmarks/gateway_limits_bench.py [--before REV] [--quick]
        [--parts idle,fanout,memory,slowloris,metrics] [--json PATH]

Exports ``REV`` (default: the commit before the gateway hardening) with ``git archive``
into a temporary folder and runs ``pantheon serve`` from it ("before") and from this tree
("after"), one part at a time, each against a fresh server, on a free loopback port:

* idle: 2,000 WebSocket clients on one pattern, recorded run (the live feed snapshots the
  bus's stats every interval), no traffic; the server's CPU over 10 s, in % of one core;
* fanout: 1,000 WebSocket clients on one pattern, recorded run; 20 messages published one at a time,
  each waiting until every client has it; the server's CPU time per message;
* memory: one subscriber that reads everything; 4,096 messages of 512 KiB (``--quick``:
  1,024), not recorded (the session store is another part's); the server's RSS before,
  after the run, and 3 s after the subscriber left;
* slowloris: the server with a 1,024-file limit; 1,250 connections that send a header
  byte a second; a well-behaved client (a fresh connection per ``GET /healthz``, every
  20 ms) before and during; its p99, how many of its requests got no answer within 5 s,
  and how many slow connections the server had closed after 15 s;
* metrics: 20,000 topics published, then a well-behaved client (``POST`` of a small
  message every 20 ms on a keep-alive connection) alone and while a scraper reads
  ``/metrics`` once a second (15 times Prometheus' default rate); its p99 both times.

CPU and RSS are read from ``/proc/<pid>`` of the server; client and server share the
machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import websockets

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "4558113"
SCENARIO = """
version: 1
name: limits_bench
input: {kind: http, topic: bench.inbox}
gateway:
  max_body: 1048576
  max_batch: 10000
agents:
  sink: {handler: "bench_team:sink", subscribe: ["bench.*"], max_queue: 1000000}
"""
TEAM = "async def sink(env):\n    return None\n"
TICK = os.sysconf("SC_CLK_TCK")
#: Seconds between two scrapes of /metrics (Prometheus scrapes every 15 s by default).
SCRAPE_EVERY = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class Served:
    def __init__(self, tree: Path, *, record: bool = False, nofile: int | None = None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="gwlimits-"))
        (self.tmp / "bench.yaml").write_text(SCENARIO)
        (self.tmp / "bench_team.py").write_text(TEAM)
        self.port = free_port()
        env = {**os.environ, "PANTHEON_LOG_LEVEL": "WARNING", "PYTHONPATH": str(tree)}

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        args = ["--store", str(self.tmp / "s.db")] if record else ["--no-record"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pantheon.cli", "serve", str(self.tmp / "bench.yaml"),
             "--port", str(self.port), *args],
            cwd=self.tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=limit,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.stop()
        raise SystemExit("the gateway did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def p99(samples: list[float]) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def connect_all(url: str, n: int) -> list[Any]:
    out: list[Any] = []
    for first in range(0, n, 100):
        out += await asyncio.gather(
            *(websockets.connect(url, compression=None) for _ in range(min(100, n - first)))
        )
    return out


async def idle(tree: Path, quick: bool) -> dict[str, float]:
    srv = Served(tree, record=True)
    try:
        clients = await connect_all(f"ws://127.0.0.1:{srv.port}/v1/subscribe?pattern=idle.*", 2000)
        await asyncio.sleep(3)
        before, t0 = cpu_seconds(srv.pid), time.monotonic()
        await asyncio.sleep(5 if quick else 10)
        used = cpu_seconds(srv.pid) - before
        pct = 100 * used / (time.monotonic() - t0)
        for ws in clients:
            ws.transport.abort()
        return {"clients": len(clients), "cpu_pct_of_a_core": round(pct, 1)}
    finally:
        srv.stop()


async def fanout(tree: Path, quick: bool) -> dict[str, float]:
    srv = Served(tree, record=True)
    n, messages = 1000, 10 if quick else 20
    try:
        clients = await connect_all(f"ws://127.0.0.1:{srv.port}/v1/subscribe?pattern=fan.*", n)
        await asyncio.sleep(2)
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:

            async def wait_one(ws: Any) -> None:
                got = 0
                while not got:
                    got = len(json.loads(await ws.recv())["messages"])

            before = cpu_seconds(srv.pid)
            for i in range(messages):
                r = await http.post("/v1/topics/fan.x", json={"i": i, "text": "x" * 200})
                assert r.status_code == 202, r.text
                await asyncio.gather(*(wait_one(ws) for ws in clients))
            used = cpu_seconds(srv.pid) - before
        for ws in clients:
            ws.transport.abort()
        return {"subscribers": n, "server_cpu_ms_per_message": round(1000 * used / messages, 1)}
    finally:
        srv.stop()


async def memory(tree: Path, quick: bool) -> dict[str, float]:
    srv = Served(tree)
    count, size = (1024 if quick else 4096), 512 * 1024
    body = b'"' + b"y" * size + b'"'
    try:
        start = rss_mib(srv.pid)
        received = 0
        ws = await websockets.connect(
            f"ws://127.0.0.1:{srv.port}/v1/subscribe?pattern=mem.*",
            compression=None,
            max_size=None,
        )

        async def reader() -> None:
            nonlocal received
            async for frame in ws:
                received += len(json.loads(frame)["messages"])

        task = asyncio.create_task(reader())
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
            for _ in range(count):
                r = await http.post(
                    "/v1/topics/mem.x", content=body, headers={"content-type": "application/json"}
                )
                assert r.status_code == 202, r.text
        for _ in range(300):
            if received >= count:
                break
            await asyncio.sleep(0.1)
        after = rss_mib(srv.pid)
        await ws.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(3)
        left = rss_mib(srv.pid)
        return {
            "messages": count,
            "received": received,
            "rss_start_mib": round(start),
            "rss_after_run_mib": round(after),
            "rss_after_leave_mib": round(left),
        }
    finally:
        srv.stop()


async def good_client(
    url: str, seconds: float, *, fresh: bool, path: str = "/healthz"
) -> dict[str, float]:
    """Latencies of a well-behaved client: one request every 20 ms."""
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
    if path == "/healthz":
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    else:
        body = b'{"n": 1}'
        request = (
            b"POST %b HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (path.encode(), len(body), body)
        )
    latencies: list[float] = []
    unanswered = 0
    why: dict[str, int] = {}
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        try:
            if conn is None or fresh:
                conn = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
            reader, writer = conn
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await asyncio.wait_for(reader.readexactly(length), 5)
            latencies.append((time.perf_counter() - t0) * 1000)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, IndexError, ValueError) as exc:
            unanswered += 1
            why[type(exc).__name__] = why.get(type(exc).__name__, 0) + 1
            if conn is not None:
                conn[1].close()
            conn = None
        if fresh and conn is not None:
            conn[1].close()
            conn = None
        await asyncio.sleep(0.02)
    return {
        "p99_ms": round(p99(latencies), 1),
        "answered": len(latencies),
        "unanswered": unanswered,
        **({"unanswered_by": why} if why else {}),
    }


async def slowloris(tree: Path, quick: bool) -> dict[str, Any]:
    srv = Served(tree, nofile=1024)
    seconds = 8 if quick else 15
    try:
        baseline = await good_client(srv.url, 5, fresh=True)
        slow: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        for _ in range(1250):
            try:
                slow.append(await asyncio.open_connection("127.0.0.1", srv.port))
            except OSError:
                break
        stop = asyncio.Event()

        async def trickle() -> None:
            for _, w in slow:
                w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set():
                for _, w in slow:
                    if not w.is_closing():
                        w.write(b"X")
                await asyncio.sleep(1)

        task = asyncio.create_task(trickle())
        during = await good_client(srv.url, seconds, fresh=True)
        stop.set()
        await task

        async def was_closed(r: asyncio.StreamReader) -> bool:
            try:
                await asyncio.wait_for(r.read(), 0.5)  # returns only at EOF
            except TimeoutError:
                return False
            except OSError:
                return True  # reset: the server closed it and our trickle wrote on
            return True

        closed = sum(await asyncio.gather(*(was_closed(r) for r, _ in slow)))
        for _, w in slow:
            w.transport.abort()
        return {
            "slow_connections": len(slow),
            "closed_by_server": closed,
            "baseline": baseline,
            "during": during,
        }
    finally:
        srv.stop()


async def metrics(tree: Path, quick: bool) -> dict[str, Any]:
    srv = Served(tree)
    topics = 20_000
    try:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
            for first in range(0, topics, 10_000):
                batch = [{"topic": f"m.t{i}", "payload": i} for i in range(first, first + 10_000)]
                r = await http.post("/v1/batch", json={"messages": batch})
                assert r.status_code == 202, r.text
            seconds = 5 if quick else 10
            baseline = await good_client(srv.url, seconds, fresh=False, path="/v1/topics/bench.x")
            stop = asyncio.Event()
            scrapes = 0

            async def scraper() -> None:
                nonlocal scrapes
                while not stop.is_set():
                    assert (await http.get("/metrics")).status_code == 200
                    scrapes += 1
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), SCRAPE_EVERY)

            task = asyncio.create_task(scraper())
            during = await good_client(srv.url, seconds, fresh=False, path="/v1/topics/bench.x")
            stop.set()
            await task
        return {"topics": topics, "scrapes": scrapes, "baseline": baseline, "during": during}
    finally:
        srv.stop()


PARTS: dict[str, Callable[[Path, bool], Awaitable[Any]]] = {
    "idle": idle,
    "fanout": fanout,
    "memory": memory,
    "slowloris": slowloris,
    "metrics": metrics,
}


def export(rev: str) -> Path:
    """The tree of ``rev``, for the "before" server (not a worktree: a plain copy)."""
    old = Path(tempfile.mkdtemp(prefix="gw-before-"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    return old


async def run(old: Path, parts: list[str], quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for part in parts:
        for label, tree in (("before", old), ("after", ROOT)):
            got = await PARTS[part](tree, quick)
            results.setdefault(part, {})[label] = got
            print(part, label, json.dumps(got), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help="the revision to compare with")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = asyncio.run(run(export(args.before), args.parts.split(","), args.quick))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
