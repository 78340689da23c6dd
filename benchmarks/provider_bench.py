"""The support pipeline against a real OpenAI-compatible server, next to the rule provider.

    python benchmarks/provider_bench.py [--repeats 5] [--delay-ms 1] [--loop uvloop]

Runs ``scenarios/support_email.yaml`` in this process with ``pantheon.runner._runtime.run_scenario``
(the shipped 600 emails, unpaced: ``input.rate`` 0, everything else as shipped, so the
Reasoner has 8 workers) with two providers:

- ``rules``: the scenario's own rule provider, no network;
- ``openai``: ``OpenAIProvider`` (httpx, pooled keep-alive connections) against
  ``pantheon.testing.ModelServer`` answering ``classify_reply`` after ``--delay-ms``. The
  server runs in a child process, as a model server would: in a thread of this process its
  HTTP parsing would compete with the pipeline for the GIL.

Each provider runs once to warm up, then ``--repeats`` times, alternating; reported are the
medians of wall time (``run_scenario`` called to returned, team construction and provider
close included) and emails/s, and for the median run: provider calls, requests the server
saw, per-call latency (mean, p50, p99 of ``provider.chat`` timed in the Reasoner's process:
the HTTP round trip, the server's delay, JSON parsing) and tokens. JSON with every repeat
goes to ``benchmarks/results/provider_bench.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pantheon.runner._build as team
import pantheon.runner._runtime as runtime
from agents import ChatResult, ModelProvider, OpenAIProvider
from pantheon.scenario import OpenAIProviderConfig, Scenario, load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "support_email.yaml"
# Loading the scenario puts its folder on the path: the support team's question is its own.
load_scenario(SCENARIO)
from support.intents import classify  # noqa: E402


class Timed:
    """The provider the runtime built, with every ``chat()`` timed."""

    def __init__(self, inner: ModelProvider) -> None:
        self.inner = inner
        self.name = inner.name
        self.model = inner.model
        self.latencies_ns: list[int] = []

    async def chat(self, messages: Any, **kwargs: Any) -> ChatResult:
        started = time.perf_counter_ns()
        try:
            return await self.inner.chat(messages, **kwargs)
        finally:
            self.latencies_ns.append(time.perf_counter_ns() - started)

    async def aclose(self) -> None:
        await self.inner.aclose()


class ServerProcess:
    """``ModelServer(classify_reply)`` in a child process, asked for its counts over a pipe."""

    def __init__(self, delay_ms: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(delay_ms)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url.startswith("http://"):
            raise RuntimeError(f"the model server did not start: {self.base_url!r}")

    def stats(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())  # type: ignore[no-any-return]

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def serve(delay_ms: float) -> None:
    """The child: serve until stdin closes; ``stats`` answers the counts so far."""
    from pantheon.testing import ModelServer, classify_reply

    with ModelServer(classify_reply, delay=delay_ms / 1000) as server:
        print(server.base_url, flush=True)
        for line in sys.stdin:
            if line.strip() == "stats":
                requests = server.requests
                statuses: dict[str, int] = {}
                for r in requests:
                    statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
                ports = len({r.client_port for r in requests})
                print(json.dumps({"requests": len(requests), "statuses": statuses,
                                  "ports": ports}), flush=True)  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_run(scenario: Scenario, runner: Callable[..., Any]) -> dict[str, Any]:
    timed: list[Timed] = []
    build = team._provider

    def provider(s: Scenario) -> ModelProvider:
        timed.append(Timed(build(s)))
        return timed[-1]

    with patch.object(team, "_provider", provider):
        started = time.perf_counter()
        summary = runner(runtime.run_scenario(scenario))
        wall = time.perf_counter() - started
    [t] = timed
    latencies_ms = [ns / 1e6 for ns in t.latencies_ns]
    emails = summary.inputs + summary.malformed
    return {
        "wall_s": wall,
        "emails": emails,
        "emails_per_s": emails / wall,
        "calls": len(latencies_ms),
        "call_mean_ms": statistics.fmean(latencies_ms),
        "call_p50_ms": percentile(latencies_ms, 0.50),
        "call_p99_ms": percentile(latencies_ms, 0.99),
        "usage": summary.usage,
        "action_accuracy": summary.accuracy.get("action_accuracy"),
        "dead_letters": sum(summary.dlq.values()),
    }


SUBJECT, BODY = "Refund for ORD-123456", "I was charged twice for my order, please refund one."


class _Captured:
    """Takes the request ``support.intents.classify`` would send, for the raw client to send."""

    body: dict[str, Any]

    async def chat(self, messages: Any, **kwargs: Any) -> ChatResult:
        self.body = {"model": "local", "messages": list(messages), **kwargs}
        return ChatResult(None, {"intent": "refund", "confidence": 1.0})


async def alone(base_url: str, calls: int, concurrency: int, raw: bool) -> dict[str, Any]:
    """``calls`` classifications from ``concurrency`` workers and nothing else running: through
    ``OpenAIProvider``, or (``raw``) as bare HTTP/1.1 on asyncio streams, one kept-alive
    connection per worker: what the server sustains when the client costs next to nothing."""
    captured = _Captured()
    await classify(captured, SUBJECT, BODY)
    data = json.dumps(captured.body).encode()
    host, port = base_url.removeprefix("http://").split("/")[0].split(":")
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data
    latencies: list[float] = []

    async def provider_worker(provider: OpenAIProvider, n: int) -> None:
        for _ in range(n):
            started = time.perf_counter()
            await classify(provider, SUBJECT, BODY)
            latencies.append((time.perf_counter() - started) * 1000)

    async def raw_worker(n: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        for _ in range(n):
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            latencies.append((time.perf_counter() - started) * 1000)
        writer.close()
        await writer.wait_closed()

    per_worker = calls // concurrency
    async with OpenAIProvider(base_url, model="local") as provider:
        # Warm up: every worker's connection open before the clock starts.
        await asyncio.gather(*(provider_worker(provider, 1) for _ in range(concurrency)))
        latencies.clear()
        cpu, started = time.process_time(), time.perf_counter()
        if raw:
            await asyncio.gather(*(raw_worker(per_worker) for _ in range(concurrency)))
        else:
            await asyncio.gather(
                *(provider_worker(provider, per_worker) for _ in range(concurrency))
            )
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "calls": len(latencies),
        "calls_per_s": len(latencies) / wall,
        "call_mean_ms": statistics.fmean(latencies),
        "call_p99_ms": percentile(latencies, 0.99),
        "client_cpu_ms_per_call": cpu * 1000 / len(latencies),
    }


async def client_costs(base_url: str, root_url: str, calls: int) -> dict[str, Any]:
    """Per-call cost of each client against the stand-in (no delay), one call at a time on
    one kept-alive connection: the wall time and this process's CPU per call, plain and
    streamed, for the shipped ``OpenAIProvider`` (httpx), the official ``openai`` SDK doing
    the same calls (its own retries, SSE parsing and stream assembly), and
    ``AnthropicProvider`` (the ``anthropic`` SDK) on the Messages endpoint."""
    try:
        import openai
    except ImportError:
        raise SystemExit("--clients needs the openai SDK: pip install -e '.[bench]'") from None

    from agents import AnthropicProvider

    messages: list[Any] = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"Subject: {SUBJECT}\n\n{BODY}"}]  # fmt: skip
    sdk = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=3)

    async def sdk_call(stream: bool) -> None:
        if not stream:
            reply = await sdk.chat.completions.create(model="local", messages=messages)
            json.loads(reply.choices[0].message.content or "")
            return
        events = await sdk.chat.completions.create(
            model="local", messages=messages, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        parts = [c.choices[0].delta.content or "" async for c in events if c.choices]
        json.loads("".join(parts))

    async with (
        OpenAIProvider(base_url, model="local") as mine,
        AnthropicProvider(root_url, model="local") as claude,
    ):
        clients: dict[str, Callable[[bool], Any]] = {
            "OpenAIProvider (httpx)": lambda stream: mine.chat(
                messages, response_format={"type": "json_object"}, stream=stream
            ),
            "openai SDK": sdk_call,
            "AnthropicProvider (anthropic SDK)": lambda stream: claude.chat(
                messages, response_format={"type": "json_object"}, stream=stream
            ),
        }
        out: dict[str, Any] = {}
        for _round in range(2):  # the first round warms every client up
            for name, call in clients.items():
                for stream in (False, True):
                    cpu, started = time.process_time(), time.perf_counter()
                    for _ in range(calls):
                        await call(stream)
                    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
                    out[f"{name}{', streamed' if stream else ''}"] = {
                        "calls": calls,
                        "wall_ms_per_call": wall * 1000 / calls,
                        "cpu_ms_per_call": cpu * 1000 / calls,
                    }
        await sdk.close()
    return out


def import_ms(module: str) -> float:
    """Milliseconds for a fresh interpreter to import ``module``, less a bare start."""

    def run(code: str) -> float:
        best = math.inf
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            best = min(best, time.perf_counter() - started)
        return best

    return (run(f"import {module}") - run("pass")) * 1000


def busy_jiffies() -> int:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields[:8]) - fields[3] - fields[4]


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--delay-ms", type=float, default=1.0, help="the server's answer delay")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    parser.add_argument(
        "--json", type=Path, default=ROOT / "benchmarks/results/provider_bench.json"
    )
    parser.add_argument("--serve", type=float, help=argparse.SUPPRESS)
    parser.add_argument(
        "--clients",
        type=int,
        metavar="CALLS",
        help="instead: per-call cost of each client (httpx, openai SDK, anthropic SDK), "
        "CALLS calls each, to benchmarks/results/provider_clients.json",
    )
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    if args.clients is not None:
        compare_clients(args.clients)
        return

    runner: Callable[..., Any] = asyncio.run
    if args.loop == "uvloop":
        import uvloop

        runner = uvloop.run
    shipped = load_scenario(SCENARIO)
    unpaced = shipped.model_copy(update={"input": shipped.input.model_copy(update={"rate": 0.0})})
    server = ServerProcess(args.delay_ms)
    variants = {
        "rules": unpaced,
        "openai": unpaced.model_copy(
            update={
                "provider": OpenAIProviderConfig(
                    kind="openai", base_url=server.base_url, model="local", api_key_env=""
                )
            }
        ),
    }
    hz = os.sysconf("SC_CLK_TCK")
    busy0, own0, server0, started = busy_jiffies(), own_cpu_s(), server.cpu_s(), time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    try:
        for scenario in variants.values():
            one_run(scenario, runner)  # warm-up: imports, first connections
        for _ in range(args.repeats):
            for name, scenario in variants.items():
                before = server.stats()["requests"]
                run = one_run(scenario, runner)
                after = server.stats()
                run["server_requests"] = after["requests"] - before
                runs[name].append(run)
        concurrency = shipped.agent("reasoner").concurrency
        probes = {
            f"{kind} client, {concurrency} workers, no pipeline": runner(
                alone(server.base_url, 600, concurrency, raw=kind == "raw")
            )
            for kind in ("OpenAIProvider", "raw")
        }
        stats = server.stats()
        server_cpu = server.cpu_s() - server0
    finally:
        server.close()
    wall = time.perf_counter() - started
    other = (busy_jiffies() - busy0) / hz - (own_cpu_s() - own0) - server_cpu
    load = {
        "other_work_cores": max(0.0, other / wall),
        "loadavg_end": os.getloadavg(),
        "server_cpu_s": server_cpu,
        "server_connections": stats["ports"],
        "server_statuses": stats["statuses"],
    }

    results: dict[str, Any] = {
        "benchmark": "provider_bench",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "loop": args.loop,
        },
        "delay_ms": args.delay_ms,
        "repeats": args.repeats,
        "load": load,
        "variants": {},
    }
    header = (
        f"{'provider':<8}{'wall s':>8}{'emails/s':>10}{'calls':>7}{'server':>8}"
        f"{'mean ms':>9}{'p50 ms':>8}{'p99 ms':>8}{'tokens in':>11}{'out':>7}{'action acc':>12}"
    )
    print(f"support pipeline, 600 emails unpaced, median of {args.repeats} ({args.loop})")
    print(header)
    for name, rs in runs.items():
        median = sorted(rs, key=lambda r: r["wall_s"])[len(rs) // 2]
        results["variants"][name] = {
            "median_wall_s": statistics.median(r["wall_s"] for r in rs),
            "median_emails_per_s": statistics.median(r["emails_per_s"] for r in rs),
            "median_run": median,
            "runs": rs,
        }
        v = results["variants"][name]
        print(
            f"{name:<8}{v['median_wall_s']:>8.3f}{v['median_emails_per_s']:>10,.0f}"
            f"{median['calls']:>7}{median['server_requests']:>8}"
            f"{median['call_mean_ms']:>9.3f}{median['call_p50_ms']:>8.3f}"
            f"{median['call_p99_ms']:>8.3f}{median['usage']['input_tokens']:>11,}"
            f"{median['usage']['output_tokens']:>7,}{median['action_accuracy']:>12.1%}"
        )
    results["alone"] = probes
    print(f"{'the same calls alone':<44}{'calls/s':>9}{'mean ms':>9}{'p99 ms':>8}{'CPU ms':>8}")
    for name, p in probes.items():
        print(
            f"{name:<44}{p['calls_per_s']:>9,.0f}{p['call_mean_ms']:>9.3f}"
            f"{p['call_p99_ms']:>8.3f}{p['client_cpu_ms_per_call']:>8.3f}"
        )
    print(
        f"server: {args.delay_ms:g} ms delay, {stats['ports']} connections over the whole "
        f"run, statuses {stats['statuses']}, {server_cpu:.2f} s CPU; other work on the "
        f"machine {load['other_work_cores']:.2f} cores, loadavg {os.getloadavg()[0]:.2f}; "
        f"wall {wall:.0f} s"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")


def compare_clients(calls: int) -> None:
    server = ServerProcess(0.0)
    try:
        costs = uvloop_run(
            client_costs(server.base_url, server.base_url.removesuffix("/v1"), calls)
        )
    finally:
        server.close()
    imports = {m: import_ms(m) for m in ("httpx", "openai", "anthropic")}
    print(f"{'one call at a time, stand-in with no delay':<52}{'wall ms':>9}{'CPU ms':>8}")
    for name, c in costs.items():
        print(f"{name:<52}{c['wall_ms_per_call']:>9.3f}{c['cpu_ms_per_call']:>8.3f}")
    print("import ms: " + ", ".join(f"{m} {ms:.0f}" for m, ms in imports.items()))
    out = ROOT / "benchmarks/results/provider_clients.json"
    out.write_text(
        json.dumps(
            {
                "benchmark": "provider_bench --clients",
                "command": " ".join([Path(sys.executable).name, *sys.argv]),
                "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                "machine": {
                    "platform": platform.platform(),
                    "cpus": os.cpu_count(),
                    "python": sys.version.split()[0],
                },
                "calls": costs,
                "import_ms": imports,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


def uvloop_run(coro: Any) -> Any:
    import uvloop

    return uvloop.run(coro)


if __name__ == "__main__":
    main()
