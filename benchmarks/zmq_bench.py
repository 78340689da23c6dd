#!/usr/bin/env python
"""Pantheon over ZeroMQ against raw pyzmq and the brokers on this machine, between two processes.

One command measures every row, on loopback, over ``ipc://`` and ``tcp://127.0.0.1``::

    .venv/bin/python benchmarks/zmq_bench.py [--quick] [--only ROW,ROW] [--transports ipc,tcp]
        [--loop uvloop|asyncio] [--repeats N] [--json PATH] [--markdown]

Every row sends the same payload: the first email of ``scenarios/data/support_emails.jsonl`` as
the Observer publishes it (322 bytes of msgpack), encoded per message by the sender and decoded
per message by the receiver, as a real client does. Each side is its own process (this script
re-run with ``--_child``); the parent only orchestrates them over their stdin/stdout between
measurements, never while one runs.

What is measured, for every row and transport:

one way   the receiver counts a fixed number of messages; the rate is that count over the time
          from the sender's first send to the receiver's last receive (``CLOCK_MONOTONIC`` is
          one clock for every process). Two untimed warm-ups size the count so a repeat lasts
          about ``tput_seconds`` whatever the row's speed.
round trip one request in flight: the client sends the payload, the server decodes it and sends
          it back re-encoded, the client decodes the reply. p50/p99 of the per-trip times.
CPU       microseconds of CPU per message (one way) and per round trip, summed over every
          thread of every process involved (sender, broker, receiver; for Redis, NATS and
          RabbitMQ the server's own processes), from the scheduler's ``schedstat``. Unlike the
          rates it hardly moves when other work shares the machine, and it says which process
          a message's cost is in: with two processes and a broker on two cores, one way can
          go no faster than 2 cores / (CPU us/msg).

Rows (``--only`` takes these ids):

zmq_plain   raw pyzmq PUSH/PULL, ``await sock.recv()`` per message; RTT DEALER -> ROUTER, the
            same style. The sender sends non-blocking and awaits only when the HWM is reached.
zmq_drain   raw pyzmq PUSH/PULL, the receiver drains with ``recv(zmq.NOBLOCK)`` and awaits
            only when the socket would block; RTT DEALER -> ROUTER, the same style.
zmq_proxy   the drain style through a third process running libzmq's ``zmq.proxy`` (PULL/PUSH,
            ROUTER/DEALER; no Python per message): the floor for any brokered design.
pantheon    ``Bus(transport=ZmqTransport(...))`` in each process, joined by a broker process
            (``run_broker``) that keeps the directory; messages go node to node. Full
            Envelope, acknowledgements on: ``await bus.emit`` per message to a remote
            subscriber; RTT with ``await bus.request`` to a remote responder.
redis       Redis pub/sub (redis-py asyncio), ``await r.publish`` per message; RTT ping/pong
            over two channels. tcp only.
redis_pipe  the same with publishes pipelined 100 at a time (what a tuned client can do).
nats        NATS core (nats-py), ``await nc.publish`` per message (the client buffers);
            RTT ``nc.request``. tcp only.
rabbit      RabbitMQ (aio-pika), default exchange, transient messages, consumer acks per
            message (prefetch 1000), no publisher confirms; RTT with a reply queue. tcp only.
rabbit_conf the same with publisher confirms (each publish waits for the broker's ack).

A broker that is not reachable, or a client library that is not installed, gives a
``skipped: <why>`` row. The JSON (``benchmarks/results/zmq_bench.json`` by default) keeps every
repeat, the machine, and how much CPU other processes used during the run (the brokers'
own servers excluded).
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import itertools
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bus_bench import (  # noqa: E402  (sibling script: one definition of the machine report)
    cpu_jiffies,
    loop_factory,
    machine_info,
    own_cpu_seconds,
    pct,
)

from bus import Bus  # noqa: E402

mono_ns = time.monotonic_ns
perf_ns = time.perf_counter_ns
SCRIPT = str(Path(__file__).resolve())
EMAILS = ROOT / "scenarios" / "data" / "support_emails.jsonl"

PROFILES: dict[str, dict[str, Any]] = {
    "full": {
        "repeats": 5,
        "n_warm": 2_000,  # first warm-up, one way; the second is sized from it
        "tput_seconds": 1.0,  # aimed length of one timed one-way repeat
        "n_min": 2_000,
        "n_max": 400_000,
        "rtt_warm": 300,
        "rtt_seconds": 0.5,  # aimed length of one timed round-trip repeat
        "rtt_min": 1_000,
        "rtt_max": 10_000,
    },
    "quick": {
        "repeats": 3,
        "n_warm": 1_000,
        "tput_seconds": 0.2,
        "n_min": 1_000,
        "n_max": 60_000,
        "rtt_warm": 100,
        "rtt_seconds": 0.1,
        "rtt_min": 300,
        "rtt_max": 2_000,
    },
}

#: Where each broker is expected; ``--redis``, ``--nats`` and ``--amqp`` override them.
SERVERS = {"redis": "127.0.0.1:6379", "nats": "127.0.0.1:4222", "amqp": "127.0.0.1:5672"}
REDIS_PIPELINE = 100
RABBIT_PREFETCH = 1_000
READY_TIMEOUT = 30.0  # a child's start: imports, connect, subscribe
OP_TIMEOUT = 120.0  # one warm-up or measurement; a row that stalls this long has lost messages
#: Server processes whose CPU is part of a broker row, not other work on the machine.
BROKER_SERVERS = ("redis-server", "nats-server", "beam.smp")

TARGET_RATE = 300_000
TARGET_P50_US = 100.0
TARGET_P99_US = 300.0


# -- the payload ----------------------------------------------------------------------------


def support_email() -> dict[str, Any]:
    """The first well-formed inbox record, as the Observer publishes it (no labels)."""
    with EMAILS.open(encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "body" in record:
                return {k: v for k, v in record.items() if k != "expected"}
    raise RuntimeError(f"{EMAILS}: no well-formed email record")


PAYLOAD = support_email()
encode = msgspec.msgpack.Encoder().encode
decode = msgspec.msgpack.Decoder().decode


# -- child side: one adapter per system -----------------------------------------------------

Hit = Callable[[], None]


class Counter:
    """The receiver's count; stamps the time the awaited message arrives."""

    __slots__ = ("count", "done", "t_end", "target")

    def __init__(self) -> None:
        self.count = 0
        self.target = -1
        self.t_end = 0
        self.done: asyncio.Future[None] | None = None

    def arm(self, n: int) -> asyncio.Future[None]:
        self.target = self.count + n
        self.done = asyncio.get_running_loop().create_future()
        return self.done

    def __call__(self) -> None:
        self.count += 1
        if self.count == self.target:
            self.t_end = mono_ns()
            assert self.done is not None
            self.done.set_result(None)


class Adapter(abc.ABC):
    """One messaging system as the four roles see it. Each role calls its ``start_*`` once,
    then its operation per command; ``close`` releases whatever was opened."""

    def __init__(self, endpoint: str, token: str) -> None:
        self.endpoint = endpoint
        self.token = token
        self.tasks: list[asyncio.Task[None]] = []

    def spawn(self, coro: Any) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coro))

    @abc.abstractmethod
    async def start_sink(self, hit: Hit) -> dict[str, Any]:
        """Subscribe; call ``hit()`` per message received (after decoding it)."""

    @abc.abstractmethod
    async def start_source(self) -> None: ...

    @abc.abstractmethod
    async def send(self, n: int) -> None:
        """Send ``n`` messages, each encoded afresh, as fast as the client allows."""

    @abc.abstractmethod
    async def start_echo(self) -> dict[str, Any]:
        """Answer every request with its payload, decoded and re-encoded."""

    @abc.abstractmethod
    async def start_ping(self) -> None: ...

    @abc.abstractmethod
    async def ping(self) -> None:
        """One round trip: send the payload, wait for the reply, decode it."""

    async def stats(self) -> dict[str, Any]:
        """What the system itself counted, for the JSON (Pantheon: the transport's acks)."""
        return {}

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class RawZmq(Adapter):
    """Raw pyzmq: PUSH/PULL one way, DEALER/ROUTER round trip. The bound side (sink, echo)
    reports the real endpoint, so ``tcp://127.0.0.1:*`` picks a free port."""

    drain = False

    def _socket(self, kind: int) -> Any:
        import zmq.asyncio

        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(kind)
        self.sync = zmq.Socket.shadow(self.sock.underlying)
        return self.sock

    def _bind(self, kind: int) -> dict[str, Any]:
        import zmq

        sock = self._socket(kind)
        sock.bind(self.endpoint)
        return {"endpoint": sock.getsockopt_string(zmq.LAST_ENDPOINT)}

    async def start_sink(self, hit: Hit) -> dict[str, Any]:
        import zmq

        info = self._bind(zmq.PULL)
        self.spawn(self._pull_drain(hit) if self.drain else self._pull_plain(hit))
        return info

    async def _pull_plain(self, hit: Hit) -> None:
        recv = self.sock.recv
        while True:
            decode(await recv())
            hit()

    async def _pull_drain(self, hit: Hit) -> None:
        import zmq

        recv_nowait, recv = self.sync.recv, self.sock.recv
        noblock, again = zmq.NOBLOCK, zmq.Again
        while True:
            try:
                data = recv_nowait(noblock)
            except again:
                data = await recv()
            decode(data)
            hit()

    async def start_source(self) -> None:
        import zmq

        self._socket(zmq.PUSH).connect(self.endpoint)

    async def send(self, n: int) -> None:
        import zmq

        send_nowait, send = self.sync.send, self.sock.send
        noblock, again = zmq.NOBLOCK, zmq.Again
        for _ in range(n):
            data = encode(PAYLOAD)
            try:
                send_nowait(data, noblock)
            except again:
                await send(data)

    async def start_echo(self) -> dict[str, Any]:
        import zmq

        info = self._bind(zmq.ROUTER)
        self.spawn(self._echo())
        return info

    async def _recv_multipart(self) -> list[bytes]:
        if self.drain:
            import zmq

            try:
                return self.sync.recv_multipart(zmq.NOBLOCK)  # type: ignore[no-any-return]
            except zmq.Again:
                pass
        return await self.sock.recv_multipart()  # type: ignore[no-any-return]

    async def _echo(self) -> None:
        while True:
            ident, data = await self._recv_multipart()
            await self.sock.send_multipart([ident, encode(decode(data))])

    async def start_ping(self) -> None:
        import zmq

        self._socket(zmq.DEALER).connect(self.endpoint)

    async def ping(self) -> None:
        await self.sock.send(encode(PAYLOAD))
        (data,) = await self._recv_multipart()
        decode(data)

    async def close(self) -> None:
        await super().close()
        self.sock.close(linger=0)
        self.ctx.term()


class RawZmqDrain(RawZmq):
    drain = True


class RawZmqProxied(RawZmqDrain):
    """The drain style through a broker: both sides connect to a ``zmq.proxy`` process, so
    the server side connects where it would bind (a DEALER, not a ROUTER, for the echo: the
    proxy's DEALER hands it the client's identity frame, which it sends back)."""

    def _bind(self, kind: int) -> dict[str, Any]:
        import zmq

        self._socket(zmq.DEALER if kind == zmq.ROUTER else kind).connect(self.endpoint)
        return {}


def run_proxy(role: str, endpoint: str) -> None:
    """The broker of the zmq_proxy row: libzmq's own ``zmq.proxy`` (C, no Python per
    message) between a frontend the clients connect to and a backend the servers connect to.
    It runs in a thread; stdin closing or a ``quit`` line ends the process."""
    import threading

    import zmq

    ctx = zmq.Context()
    kinds = (zmq.PULL, zmq.PUSH) if role == "proxy_pipe" else (zmq.ROUTER, zmq.DEALER)
    ends = []
    for side, kind in zip(("front", "back"), kinds, strict=True):
        sock = ctx.socket(kind)
        sock.bind(endpoint.replace(".sock", f"-{side}.sock") if "ipc://" in endpoint else endpoint)
        ends.append(sock)
    threading.Thread(target=zmq.proxy, args=ends, daemon=True).start()
    say(
        ready=True,
        front=ends[0].getsockopt_string(zmq.LAST_ENDPOINT),
        back=ends[1].getsockopt_string(zmq.LAST_ENDPOINT),
    )
    for line in sys.stdin:
        if line.strip() and json.loads(line)["cmd"] == "quit":
            break
    say(bye=True)
    sys.stdout.flush()
    os._exit(0)  # the proxy thread blocks in C with no clean way out; nothing is left to save


class Redis(Adapter):
    """Redis pub/sub with redis-py's asyncio client; ``pipeline`` > 0 batches publishes."""

    pipeline = 0

    async def _connect(self) -> Any:
        import redis.asyncio as redis

        host, port = self.endpoint.rsplit(":", 1)
        self.r = redis.Redis(host=host, port=int(port))
        await self.r.ping()
        return self.r

    async def _subscribe(self, channel: str) -> Any:
        self.ps = self.r.pubsub()
        await self.ps.subscribe(channel)
        confirm = await self.ps.get_message(timeout=10.0)
        if not confirm or confirm["type"] != "subscribe":
            raise RuntimeError(f"redis: no subscribe confirmation for {channel}: {confirm!r}")
        self.messages = self.ps.listen()
        return self.ps

    async def start_sink(self, hit: Hit) -> dict[str, Any]:
        await self._connect()
        await self._subscribe(f"{self.token}.data")
        self.spawn(self._sink(hit))
        return {}

    async def _sink(self, hit: Hit) -> None:
        async for m in self.messages:
            if m["type"] == "message":
                decode(m["data"])
                hit()

    async def start_source(self) -> None:
        await self._connect()

    async def send(self, n: int) -> None:
        channel = f"{self.token}.data"
        if not self.pipeline:
            publish = self.r.publish
            for _ in range(n):
                await publish(channel, encode(PAYLOAD))
            return
        left = n
        while left:
            k = min(left, self.pipeline)
            pipe = self.r.pipeline(transaction=False)
            for _ in range(k):
                pipe.publish(channel, encode(PAYLOAD))
            await pipe.execute()
            left -= k

    async def start_echo(self) -> dict[str, Any]:
        await self._connect()
        await self._subscribe(f"{self.token}.ping")
        self.spawn(self._echo())
        return {}

    async def _echo(self) -> None:
        pong = f"{self.token}.pong"
        async for m in self.messages:
            if m["type"] == "message":
                await self.r.publish(pong, encode(decode(m["data"])))

    async def start_ping(self) -> None:
        await self._connect()
        await self._subscribe(f"{self.token}.pong")
        self.ping_channel = f"{self.token}.ping"

    async def ping(self) -> None:
        await self.r.publish(self.ping_channel, encode(PAYLOAD))
        async for m in self.messages:
            if m["type"] == "message":
                decode(m["data"])
                return

    async def close(self) -> None:
        await super().close()
        if hasattr(self, "ps"):
            await self.ps.aclose()
        await self.r.aclose()


class RedisPipelined(Redis):
    pipeline = REDIS_PIPELINE


class Nats(Adapter):
    """NATS core with nats-py: publish is buffered by the client, request uses its inbox."""

    async def _connect(self) -> Any:
        import nats

        self.nc = await nats.connect(f"nats://{self.endpoint}", allow_reconnect=False)
        return self.nc

    async def start_sink(self, hit: Hit) -> dict[str, Any]:
        nc = await self._connect()

        async def cb(msg: Any) -> None:
            decode(msg.data)
            hit()

        await nc.subscribe(f"{self.token}.data", cb=cb)
        await nc.flush()  # the server has the subscription before we say ready
        return {}

    async def start_source(self) -> None:
        await self._connect()

    async def send(self, n: int) -> None:
        publish, subject = self.nc.publish, f"{self.token}.data"
        for _ in range(n):
            await publish(subject, encode(PAYLOAD))
        await self.nc.flush()

    async def start_echo(self) -> dict[str, Any]:
        nc = await self._connect()

        async def cb(msg: Any) -> None:
            await msg.respond(encode(decode(msg.data)))

        await nc.subscribe(f"{self.token}.ping", cb=cb)
        await nc.flush()
        return {}

    async def start_ping(self) -> None:
        await self._connect()
        self.subject = f"{self.token}.ping"

    async def ping(self) -> None:
        reply = await self.nc.request(self.subject, encode(PAYLOAD), timeout=10.0)
        decode(reply.data)

    async def close(self) -> None:
        await super().close()
        await self.nc.close()


class Rabbit(Adapter):
    """RabbitMQ with aio-pika: default exchange, transient messages, consumer acks."""

    confirms = False

    async def _connect(self) -> Any:
        import aio_pika

        self.conn = await aio_pika.connect(
            host=self.endpoint.rsplit(":", 1)[0],
            port=int(self.endpoint.rsplit(":", 1)[1]),
            login="guest",
            password="guest",
        )
        self.ch = await self.conn.channel(publisher_confirms=self.confirms)
        await self.ch.set_qos(prefetch_count=RABBIT_PREFETCH)
        return self.ch

    async def _queue(self, name: str) -> Any:
        q = await self.ch.declare_queue(name, auto_delete=True)
        await q.purge()
        return q

    async def start_sink(self, hit: Hit) -> dict[str, Any]:
        await self._connect()
        q = await self._queue(f"{self.token}.data")

        async def cb(message: Any) -> None:
            decode(message.body)
            await message.ack()
            hit()

        await q.consume(cb)
        return {}

    async def start_source(self) -> None:
        await self._connect()

    async def send(self, n: int) -> None:
        from aio_pika import Message

        publish, key = self.ch.default_exchange.publish, f"{self.token}.data"
        for _ in range(n):
            await publish(Message(encode(PAYLOAD)), routing_key=key)

    async def start_echo(self) -> dict[str, Any]:
        from aio_pika import Message

        await self._connect()
        q = await self._queue(f"{self.token}.rpc")
        exchange = self.ch.default_exchange

        async def cb(message: Any) -> None:
            reply = Message(encode(decode(message.body)), correlation_id=message.correlation_id)
            await exchange.publish(reply, routing_key=message.reply_to)
            await message.ack()

        await q.consume(cb)
        return {}

    async def start_ping(self) -> None:
        await self._connect()
        self.replies = await self.ch.declare_queue(exclusive=True)
        self.waiting: dict[str, asyncio.Future[bytes]] = {}
        self.ids = itertools.count()

        async def on_reply(message: Any) -> None:
            fut = self.waiting.pop(message.correlation_id, None)
            if fut is not None and not fut.done():
                fut.set_result(message.body)

        await self.replies.consume(on_reply, no_ack=True)

    async def ping(self) -> None:
        from aio_pika import Message

        corr = str(next(self.ids))
        fut = asyncio.get_running_loop().create_future()
        self.waiting[corr] = fut
        message = Message(encode(PAYLOAD), correlation_id=corr, reply_to=self.replies.name)
        await self.ch.default_exchange.publish(message, routing_key=f"{self.token}.rpc")
        decode(await fut)

    async def close(self) -> None:
        await super().close()
        await self.conn.close()


class RabbitConfirms(Rabbit):
    confirms = True


class Pantheon(Adapter):
    """Pantheon's own bus in each process, joined by ``ZmqTransport`` (a directory broker;
    messages go node to node)."""

    async def _bus(self) -> Any:
        from bus.backends.zeromq import ZmqTransport

        self.bus = Bus(transport=ZmqTransport(self.endpoint))
        await self.bus.start()
        return self.bus

    async def _await_remote(self, topic: str) -> None:
        """The ready handshake: the other node's subscription has reached us."""
        deadline = time.monotonic() + READY_TIMEOUT
        while not self.bus.transport.has_remote(topic):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no remote subscriber for {topic} within {READY_TIMEOUT}s")
            await asyncio.sleep(0.01)

    async def start_sink(self, hit: Hit) -> dict[str, Any]:
        bus = await self._bus()

        async def handler(env: Any) -> None:
            hit()

        bus.on("bench.data", handler, name="sink")
        return {}

    async def start_source(self) -> None:
        await self._bus()
        await self._await_remote("bench.data")

    async def send(self, n: int) -> None:
        emit = self.bus.emit
        for _ in range(n):
            await emit("bench.data", PAYLOAD)

    async def start_echo(self) -> dict[str, Any]:
        bus = await self._bus()

        async def echo(env: Any) -> Any:
            return env.payload

        bus.on("bench.ping", echo, name="echo")
        return {}

    async def start_ping(self) -> None:
        await self._bus()
        await self._await_remote("bench.ping")

    async def ping(self) -> None:
        await self.bus.request("bench.ping", PAYLOAD, timeout=10.0)

    async def stats(self) -> dict[str, Any]:
        await self.bus.drain(timeout=10.0)  # every send settled (acknowledged) first
        return dict(self.bus.transport.stats())

    async def close(self) -> None:
        await super().close()
        await self.bus.aclose()


ADAPTERS: dict[str, type[Adapter]] = {
    "zmq_plain": RawZmq,
    "zmq_drain": RawZmqDrain,
    "zmq_proxy": RawZmqProxied,
    "pantheon": Pantheon,
    "redis": Redis,
    "redis_pipe": RedisPipelined,
    "nats": Nats,
    "rabbit": Rabbit,
    "rabbit_conf": RabbitConfirms,
}


def say(**msg: Any) -> None:
    sys.stdout.write(json.dumps(msg, default=str) + "\n")
    sys.stdout.flush()


def latency_summary(samples: list[int]) -> dict[str, float]:
    samples.sort()
    return {
        "n": len(samples),
        "p50_us": pct(samples, 0.50) / 1e3,
        "p99_us": pct(samples, 0.99) / 1e3,
        "p999_us": pct(samples, 0.999) / 1e3,
        "mean_us": sum(samples) / len(samples) / 1e3,
        "max_us": samples[-1] / 1e3,
    }


async def child(row: str, role: str, endpoint: str, token: str) -> None:
    """One side of one measurement: set up, say ``ready``, then obey commands from stdin."""
    adapter = ADAPTERS[row](endpoint, token)
    loop = asyncio.get_running_loop()
    counter = Counter()
    starts = {
        "sink": lambda: adapter.start_sink(counter),
        "source": adapter.start_source,
        "echo": adapter.start_echo,
        "ping": adapter.start_ping,
    }
    info = await starts[role]()
    say(ready=True, **(info or {}))
    try:
        while True:
            # Only between measurements: the thread sits in readline while nothing runs.
            line = await loop.run_in_executor(None, sys.stdin.readline)
            cmd = json.loads(line) if line.strip() else {"cmd": "quit"}
            op = cmd["cmd"]
            if op == "quit":
                say(bye=True, received=counter.count, stats=await adapter.stats())
                return
            if op == "expect":
                done = counter.arm(cmd["n"])
                say(armed=True)
                try:
                    await asyncio.wait_for(done, cmd["deadline"])
                except TimeoutError:
                    say(done=False, received=counter.count - (counter.target - cmd["n"]))
                else:
                    say(done=True, t_end=counter.t_end)
            elif op == "send":
                t0 = mono_ns()
                await adapter.send(cmd["n"])
                say(t_start=t0, t_sent=mono_ns())
            elif op == "ping":
                ping = adapter.ping
                samples = []
                for _ in range(cmd["n"]):
                    t = perf_ns()
                    await ping()
                    samples.append(perf_ns() - t)
                say(**latency_summary(samples))
            else:
                raise ValueError(f"child: unknown command {op!r}")
    finally:
        await adapter.close()


# -- parent side: orchestration -------------------------------------------------------------


class BenchError(Exception):
    """A measurement that could not complete; the row shows it instead of a number."""


class Child:
    """A child process spoken to in JSON lines; its stderr goes to a log file."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str, log: Path) -> None:
        self.proc = proc
        self.name = name
        self.log = log
        self.bye: dict[str, Any] | None = None

    @classmethod
    async def spawn(
        cls, row: str, role: str, endpoint: str, token: str, loop_name: str, logdir: Path
    ) -> Child:
        log = logdir / f"{row}-{role}-{token}.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, SCRIPT, "--_child", row, role, "--_endpoint", endpoint,
                "--_token", token, "--loop", loop_name,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err,
                cwd=ROOT,
            )  # fmt: skip
        return cls(proc, f"{row} {role}", log)

    def _stderr_tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else "no output"

    async def read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            raise BenchError(f"{self.name}: no answer within {timeout:.0f}s") from None
        if not line:
            await self.proc.wait()
            raise BenchError(
                f"{self.name} exited with {self.proc.returncode}: {self._stderr_tail()}"
            )
        return json.loads(line)  # type: ignore[no-any-return]

    async def tell(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()

    async def ask(self, timeout: float, **cmd: Any) -> dict[str, Any]:
        await self.tell(**cmd)
        return await self.read(timeout)

    async def quit(self) -> dict[str, Any]:
        """Ask the child to close its side and exit; returns its last words (counts)."""
        if self.bye is None:
            self.bye = {}
            self.bye = await self.ask(10.0, cmd="quit")
        return self.bye

    async def close(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(BenchError, OSError, ValueError):
                await self.quit()
            try:
                await asyncio.wait_for(self.proc.wait(), 10.0)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


@dataclass(frozen=True)
class Row:
    id: str
    label: str
    transports: tuple[str, ...]
    needs: str  # the module the client side imports
    server: str | None = None  # the SERVERS key of a broker that must be listening
    broker: bool = False  # Pantheon: start our own broker per measurement
    proxy: bool = False  # raw pyzmq through a zmq.proxy process


ROWS = (
    Row("zmq_plain", "raw pyzmq PUSH/PULL, await recv()", ("ipc", "tcp"), "zmq"),
    Row("zmq_drain", "raw pyzmq PUSH/PULL, drain NOBLOCK", ("ipc", "tcp"), "zmq"),
    Row("zmq_proxy", "raw pyzmq, drain, via a zmq.proxy broker", ("ipc", "tcp"), "zmq", proxy=True),
    Row(
        "pantheon",
        "Pantheon Bus over ZmqTransport (direct, acks)",
        ("ipc", "tcp"),
        "bus.backends.zeromq",
        broker=True,
    ),
    Row("redis", "Redis pub/sub (redis-py)", ("tcp",), "redis", "redis"),
    Row("redis_pipe", "Redis pub/sub, publish pipelined x100", ("tcp",), "redis", "redis"),
    Row("nats", "NATS (nats-py)", ("tcp",), "nats", "nats"),
    Row("rabbit", "RabbitMQ (aio-pika), no confirms", ("tcp",), "aio_pika", "amqp"),
    Row("rabbit_conf", "RabbitMQ (aio-pika), publisher confirms", ("tcp",), "aio_pika", "amqp"),
)
BROKER_ROWS = ("redis", "redis_pipe", "nats", "rabbit", "rabbit_conf")
INSTALL_HINT = {
    "zmq": "pip install -e '.[zmq]'",
    "redis": "pip install -e '.[bench]'",
    "nats": "pip install -e '.[bench]'",
    "aio_pika": "pip install -e '.[bench]'",
}


def skip_reason(row: Row, servers: dict[str, str]) -> str | None:
    """Why this row cannot run here, or None."""
    try:
        found = importlib.util.find_spec(row.needs) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        if row.broker:
            return f"{row.needs} is not importable (the ZeroMQ transport is not in this tree)"
        return f"{row.needs} is not installed ({INSTALL_HINT[row.needs]})"
    if row.server is not None:
        host, port = servers[row.server].rsplit(":", 1)
        try:
            with socket.create_connection((host, port), timeout=1.0):
                pass
        except OSError as exc:
            return f"nothing listening on {host}:{port} ({exc.__class__.__name__})"
    return None


def clamp(x: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(x)))


class Measure:
    """Runs one row on one transport: one-way throughput, then round trip."""

    def __init__(self, row: Row, transport: str, cfg: dict[str, Any], ctx: RunContext) -> None:
        self.row = row
        self.transport = transport
        self.cfg = cfg
        self.ctx = ctx
        self.seq = 0
        #: Processes whose CPU one message costs: client, server, and the broker if any.
        self.pids: dict[str, int] = {}

    def _cpu(self) -> dict[str, float]:
        """CPU seconds so far of every process of this measurement (all their threads, so
        libzmq's I/O threads too); for the broker rows, of the broker servers."""
        out = {role: proc_cpu(pid) for role, pid in self.pids.items()}
        if self.row.server is not None:
            out["broker"] = broker_server_cpu()
        return out

    def _cpu_per(self, before: dict[str, float], n: int) -> dict[str, float]:
        after = self._cpu()
        return {role: (after[role] - before[role]) / n * 1e6 for role in before}

    def _endpoint(self) -> str:
        self.seq += 1
        if self.row.server is not None:
            return self.ctx.servers[self.row.server]
        if self.transport == "ipc":
            return f"ipc://{self.ctx.tmp}/{self.row.id}-{self.seq}.sock"
        return "tcp://127.0.0.1:0" if self.row.broker else "tcp://127.0.0.1:*"

    def _token(self) -> str:
        return f"pzb{os.getpid()}x{self.row.id}x{self.transport}x{self.seq}"

    @contextlib.asynccontextmanager
    async def _pair(self, server_role: str, client_role: str) -> Any:
        """A server child, then a client child that connects to it (through our broker for
        Pantheon); both are closed, and the broker stopped, whatever happens."""
        async with contextlib.AsyncExitStack() as stack:
            endpoint = self._endpoint()
            token = self._token()
            spawn = self.ctx.spawn
            client_endpoint = None
            if self.row.broker:
                from bus.backends.zeromq import run_broker

                known = set(children_of(os.getpid()))
                endpoint = await stack.enter_async_context(run_broker(endpoint))
                brokers = [pid for pid in children_of(os.getpid()) if pid not in known]
                if len(brokers) != 1:
                    raise BenchError(f"cannot tell the broker process among {brokers}")
                self.pids = {"broker": brokers[0]}
            elif self.row.proxy:
                role = "proxy_pipe" if server_role == "sink" else "proxy_rpc"
                proxy = await spawn(self.row.id, role, endpoint, token)
                stack.push_async_callback(proxy.close)
                ends = await proxy.read(READY_TIMEOUT)
                endpoint, client_endpoint = ends["back"], ends["front"]
                self.pids = {"broker": proxy.proc.pid}
            server = await spawn(self.row.id, server_role, endpoint, token)
            stack.push_async_callback(server.close)
            ready = await server.read(READY_TIMEOUT)
            client_endpoint = client_endpoint or ready.get("endpoint", endpoint)
            client = await spawn(self.row.id, client_role, client_endpoint, token)
            stack.push_async_callback(client.close)
            await client.read(READY_TIMEOUT)
            self.pids.update(client=client.proc.pid, server=server.proc.pid)
            try:
                yield server, client
            finally:
                self.pids = {}

    async def throughput(self) -> dict[str, Any]:
        cfg = self.cfg
        async with self._pair("sink", "source") as (sink, source):

            async def once(n: int, timeout: float) -> dict[str, Any]:
                armed = await sink.ask(READY_TIMEOUT, cmd="expect", n=n, deadline=timeout)
                assert armed.get("armed"), armed
                cpu = self._cpu()
                sent = await source.ask(timeout + 5, cmd="send", n=n)
                done = await sink.read(timeout + 5)
                if not done.get("done"):
                    raise BenchError(
                        f"receiver got {done.get('received')} of {n} messages in {timeout:.0f}s"
                    )
                return {
                    "n": n,
                    "msgs_per_s": n * 1e9 / (done["t_end"] - sent["t_start"]),
                    "sender_msgs_per_s": n * 1e9 / (sent["t_sent"] - sent["t_start"]),
                    "cpu_us_per_msg": self._cpu_per(cpu, n),
                }

            warm = await once(cfg["n_warm"], OP_TIMEOUT)
            n2 = clamp(warm["msgs_per_s"] * cfg["tput_seconds"] / 2, cfg["n_min"], cfg["n_max"])
            warm2 = await once(n2, OP_TIMEOUT)
            n = clamp(warm2["msgs_per_s"] * cfg["tput_seconds"], cfg["n_min"], cfg["n_max"])
            n = max(cfg["n_min"], round(n, -3))
            timeout = max(30.0, 20 * n / warm2["msgs_per_s"])
            reps = [await once(n, timeout) for _ in range(cfg["repeats"])]
            bye = await sink.quit()
            stats = {"receiver": bye.get("stats"), "sender": (await source.quit()).get("stats")}
        expected = cfg["n_warm"] + n2 + n * cfg["repeats"]
        if bye.get("received") != expected:
            raise BenchError(f"receiver counted {bye.get('received')}, {expected} were sent")
        return {"n": n, "warmup": [warm, warm2], "repeats": reps, "stats": stats}

    async def rtt(self) -> dict[str, Any]:
        cfg = self.cfg
        async with self._pair("echo", "ping") as (echo, ping):
            warm = await ping.ask(OP_TIMEOUT, cmd="ping", n=cfg["rtt_warm"])
            k = clamp(cfg["rtt_seconds"] / (warm["mean_us"] / 1e6), cfg["rtt_min"], cfg["rtt_max"])
            timeout = max(30.0, 20 * k * warm["mean_us"] / 1e6)
            reps = []
            for _ in range(cfg["repeats"]):
                cpu = self._cpu()
                rep = await ping.ask(timeout, cmd="ping", n=k)
                reps.append({**rep, "cpu_us_per_trip": self._cpu_per(cpu, k)})
            stats = {"server": (await echo.quit()).get("stats"),
                     "client": (await ping.quit()).get("stats")}  # fmt: skip
        return {"n": k, "warmup": warm, "repeats": reps, "stats": stats}


@dataclass
class RunContext:
    tmp: Path
    loop_name: str
    log: Callable[[str], None]
    servers: dict[str, str]

    async def spawn(self, row: str, role: str, endpoint: str, token: str) -> Child:
        return await Child.spawn(row, role, endpoint, token, self.loop_name, self.tmp)


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


CPU_ORDER = ("client", "broker", "server")


def cpu_medians(reps: list[dict[str, float]]) -> dict[str, float]:
    """Per process and in total, the median over repeats of CPU microseconds per message."""
    out = {role: median([r[role] for r in reps]) for role in CPU_ORDER if role in reps[0]}
    out["total"] = median([sum(r.values()) for r in reps])
    return out


def fmt_cpu(cpu: dict[str, float] | None, split: bool) -> str:
    """``total (client+broker+server)``: where a message's CPU goes, process by process."""
    if not cpu:
        return "-"
    total = f"{cpu['total']:.1f}"
    if not split:
        return total
    return total + " (" + "+".join(f"{cpu[r]:.1f}" for r in CPU_ORDER if r in cpu) + ")"


def summarize_cell(res: dict[str, Any]) -> dict[str, Any]:
    """Medians over the repeats of one row on one transport."""
    out: dict[str, Any] = {}
    tput = res.get("throughput")
    if isinstance(tput, dict):
        out["msgs_per_s"] = median([r["msgs_per_s"] for r in tput["repeats"]])
        out["sender_msgs_per_s"] = median([r["sender_msgs_per_s"] for r in tput["repeats"]])
        out["cpu_us_per_msg"] = cpu_medians([r["cpu_us_per_msg"] for r in tput["repeats"]])
    elif tput is not None:
        out["throughput_error"] = tput
    rtt = res.get("rtt")
    if isinstance(rtt, dict):
        for key in ("p50_us", "p99_us", "p999_us"):
            out[key] = median([r[key] for r in rtt["repeats"]])
        out["cpu_us_per_trip"] = cpu_medians([r["cpu_us_per_trip"] for r in rtt["repeats"]])
    elif rtt is not None:
        out["rtt_error"] = rtt
    return out


def evaluate(summary: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets for Pantheon, each with its measured value and PASS/MISS."""
    rows: list[dict[str, Any]] = []

    def add(name: str, value: float | None, target: str, ok: bool | None, note: str = "") -> None:
        rows.append({"target": name, "value": value, "bound": target, "pass": ok, "note": note})

    def cell(row: str, tr: str) -> dict[str, Any]:
        return summary.get(row, {}).get(tr, {})

    ipc = cell("pantheon", "ipc")
    rate, p50, p99 = ipc.get("msgs_per_s"), ipc.get("p50_us"), ipc.get("p99_us")
    add("Pantheon ipc one way", rate, f">= {TARGET_RATE:,} msg/s",
        None if rate is None else rate >= TARGET_RATE)  # fmt: skip
    add("Pantheon ipc RTT p50", p50, f"<= {TARGET_P50_US:g} us",
        None if p50 is None else p50 <= TARGET_P50_US)  # fmt: skip
    add("Pantheon ipc RTT p99", p99, f"<= {TARGET_P99_US:g} us",
        None if p99 is None else p99 <= TARGET_P99_US)  # fmt: skip
    brokers = {row: cell(row, "tcp") for row in BROKER_ROWS if "msgs_per_s" in cell(row, "tcp")}
    for tr in ("ipc", "tcp"):
        ours = cell("pantheon", tr)
        for key, better, what in (
            ("msgs_per_s", max, "one way"),
            ("p50_us", min, "RTT p50"),
            ("p99_us", min, "RTT p99"),
        ):
            have = {r: c[key] for r, c in brokers.items() if key in c}
            if not have:
                add(f"Pantheon {tr} {what} ahead of every broker", ours.get(key), "no broker ran",
                    None)  # fmt: skip
                continue
            best_row = better(have, key=have.__getitem__)
            best = have[best_row]
            mine = ours.get(key)
            ok = None if mine is None else (mine > best if key == "msgs_per_s" else mine < best)
            unit = "msg/s" if key == "msgs_per_s" else "us"
            op = ">" if key == "msgs_per_s" else "<"
            bound = f"{op} {best_row} {fmt_num(best)} {unit}"
            add(f"Pantheon {tr} {what} ahead of every broker", mine, bound, ok)
    return rows


# -- output ---------------------------------------------------------------------------------


def fmt_num(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.0f}" if v >= 1000 else f"{v:,.1f}"


def mark(ok: bool | None, md: bool) -> str:
    if ok is None:
        return ""
    if md:
        return " ✅" if ok else " ❌"
    return " PASS" if ok else " MISS"


def table_rows(
    summary: dict[str, dict[str, Any]], status: dict[str, dict[str, str]], md: bool
) -> list[list[str]]:
    out = []
    for row in ROWS:
        if row.id not in summary:
            continue
        for tr in row.transports:
            c = summary[row.id].get(tr)
            if c is None:
                continue
            st = status[row.id][tr]
            if st != "ok" and not c:
                out.append([row.label, tr, "-", "-", "-", "-", "-", st])
                continue
            checks: dict[str, bool | None] = {"rate": None, "p50": None, "p99": None}
            if row.id == "pantheon" and tr == "ipc":
                if "msgs_per_s" in c:
                    checks["rate"] = c["msgs_per_s"] >= TARGET_RATE
                if "p50_us" in c:
                    checks["p50"] = c["p50_us"] <= TARGET_P50_US
                    checks["p99"] = c["p99_us"] <= TARGET_P99_US
            note = "; ".join(c[k] for k in ("throughput_error", "rtt_error") if k in c)
            if row.server is not None:
                note = ("tcp only" + (f"; {note}" if note else "")).strip()
            out.append([
                row.label,
                tr,
                fmt_num(c.get("msgs_per_s")) + mark(checks["rate"], md),
                fmt_cpu(c.get("cpu_us_per_msg"), split=True),
                fmt_num(c.get("p50_us")) + mark(checks["p50"], md),
                fmt_num(c.get("p99_us")) + mark(checks["p99"], md),
                fmt_cpu(c.get("cpu_us_per_trip"), split=False),
                note,
            ])  # fmt: skip
    return out


HEADERS = [
    "system",
    "transport",
    "one way msg/s",
    "CPU us/msg (send+broker+recv)",
    "RTT p50 us",
    "RTT p99 us",
    "CPU us/trip",
    "note",
]


def print_table(rows: list[list[str]], targets: list[dict[str, Any]], title: str) -> None:
    print(title)
    widths = [max(len(r[i]) for r in [HEADERS, *rows]) for i in range(len(HEADERS))]
    for r in [HEADERS, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print()
    print("Targets (issue 5):")
    for t in targets:
        verdict = {True: "PASS", False: "MISS", None: "n/a"}[t["pass"]]
        print(f"  {verdict:4}  {t['target']}: {fmt_num(t['value'])} ({t['bound']})")


def markdown(rows: list[list[str]], targets: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|---|---|---:|---:|---:|---:|---:|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "| target | measured | bound | |", "|---|---:|---|---|"]
    for t in targets:
        verdict = {True: "✅ PASS", False: "❌ MISS", None: "n/a"}[t["pass"]]
        lines.append(f"| {t['target']} | {fmt_num(t['value'])} | {t['bound']} | {verdict} |")
    return "\n".join(lines)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(command name, parent pid) of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.index("(") + 1 : text.rindex(")")], int(
        text[text.rindex(")") + 2 :].split()[1]
    )


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def proc_cpu(pid: int) -> float:
    """CPU seconds so far of every thread of ``pid``, from the scheduler's own clock
    (``schedstat``): exact, where the tick-sampled ``utime``/``stime`` of ``stat`` misjudge
    processes that sleep and wake thousands of times a second."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that just ended
                total += int((task / "schedstat").read_text().split()[0])
    except OSError:
        raise BenchError(f"process {pid} is gone") from None
    return total / 1e9


def children_of(pid: int) -> list[int]:
    return [p for p in _pids() if (_proc_stat(p) or ("", 0))[1] == pid]


def broker_server_cpu() -> float:
    """CPU seconds used so far by the broker servers the rows talk to (Redis, NATS,
    RabbitMQ): their work is part of those rows, not other load on the machine."""
    total = 0.0
    for pid in _pids():
        stat = _proc_stat(pid)
        if stat is not None and stat[0] in BROKER_SERVERS:
            with contextlib.suppress(BenchError):
                total += proc_cpu(pid)
    return total


async def run_all(
    rows: list[Row], transports: set[str], cfg: dict[str, Any], ctx: RunContext
) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    raw: dict[str, Any] = {}
    status: dict[str, dict[str, str]] = {}
    for row in rows:
        trs = [t for t in row.transports if t in transports]
        if not trs:
            continue
        raw[row.id] = {}
        status[row.id] = {}
        why = skip_reason(row, ctx.servers)
        for tr in trs:
            if why is not None:
                raw[row.id][tr] = {"skipped": why}
                status[row.id][tr] = f"skipped: {why}"
                ctx.log(f"{row.id} {tr}: skipped: {why}")
                continue
            m = Measure(row, tr, cfg, ctx)
            cell: dict[str, Any] = {}
            errors = []
            for kind in ("throughput", "rtt"):
                ctx.log(f"{row.id} {tr}: {kind}")
                try:
                    cell[kind] = await (m.throughput() if kind == "throughput" else m.rtt())
                except BenchError as exc:
                    cell[kind] = f"error: {exc}"
                    errors.append(f"error: {kind}: {exc}")
                    ctx.log(f"{row.id} {tr}: {kind} error: {exc}")
            raw[row.id][tr] = cell
            status[row.id][tr] = "; ".join(errors) if errors else "ok"
    return raw, status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, 3 repeats")
    ap.add_argument("--only", help="comma-separated row ids: " + ",".join(r.id for r in ROWS))
    ap.add_argument("--transports", default="ipc,tcp", help="comma-separated: ipc,tcp")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                    help="event loop of every child (pantheon runs on uvloop)")  # fmt: skip
    ap.add_argument("--repeats", type=int, help="override the number of timed repeats")
    for kind, where in SERVERS.items():
        ap.add_argument(f"--{kind}", default=where, metavar="HOST:PORT",
                        help=f"where the {kind} server listens (default {where})")  # fmt: skip
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "zmq_bench.json"))
    ap.add_argument("--markdown", action="store_true", help="also print the tables as Markdown")
    ap.add_argument("--_child", nargs=2, metavar=("ROW", "ROLE"), help=argparse.SUPPRESS)
    ap.add_argument("--_endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--_token", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._child:
        row_id, role = args._child
        if role.startswith("proxy_"):
            run_proxy(role, args._endpoint)
        try:
            with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
                runner.run(child(row_id, role, args._endpoint, args._token))
        except Exception as exc:
            traceback.print_exc()
            # The parent quotes the last line of our stderr in the row: make it the cause.
            print(f"{type(exc).__name__}: {exc}".rstrip(": "), file=sys.stderr)
            return 1
        return 0

    known = {r.id: r for r in ROWS}
    wanted = [s.strip() for s in args.only.split(",")] if args.only else list(known)
    unknown = [w for w in wanted if w not in known]
    if unknown:
        ap.error(f"--only: unknown row(s) {', '.join(unknown)}; known: {', '.join(known)}")
    transports = {s.strip() for s in args.transports.split(",") if s.strip()}
    if not transports or not transports <= {"ipc", "tcp"}:
        ap.error(f"--transports: expected ipc and/or tcp, got {args.transports!r}")
    servers = {kind: getattr(args, kind) for kind in SERVERS}
    for kind, where in servers.items():
        host, _, port = where.rpartition(":")
        if not host or not port.isdigit():
            ap.error(f"--{kind}: expected HOST:PORT, got {where!r}")
    cfg = dict(PROFILES["quick" if args.quick else "full"])
    if args.repeats:
        if args.repeats < 1:
            ap.error("--repeats must be >= 1")
        cfg["repeats"] = args.repeats

    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    info = machine_info()
    info["libzmq"] = _libzmq()
    for dist in ("pyzmq", "redis", "nats-py", "aio-pika"):
        info[dist] = _version(dist)
    info["servers"] = {
        "redis": _server_version(["redis-server", "--version"]),
        "nats": _server_version(["nats-server", "--version"]),
        "rabbitmq": _server_version(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"]),
    }
    busy0, total0, steal0 = cpu_jiffies()
    own0, servers0 = own_cpu_seconds(), broker_server_cpu()
    tmp = Path(tempfile.mkdtemp(prefix="pzb-"))  # short: ipc paths must stay under 107 bytes
    try:
        ctx = RunContext(tmp, args.loop, log, servers)
        with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
            raw, status = runner.run(run_all([known[w] for w in wanted], transports, cfg, ctx))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - started
    busy1, total1, steal1 = cpu_jiffies()
    hz = os.sysconf("SC_CLK_TCK")
    ours = (own_cpu_seconds() - own0) + (broker_server_cpu() - servers0)
    other = (busy1 - busy0) / hz - ours
    load = {
        "wall_s": wall,
        "other_work_cores": max(0.0, other / wall),
        "steal_fraction": (steal1 - steal0) / max(1, total1 - total0),
        "loadavg_end": os.getloadavg(),
    }
    load["busy"] = load["other_work_cores"] > 0.2 or load["steal_fraction"] > 0.05

    summary = {
        row: {tr: summarize_cell(cell) for tr, cell in cells.items()} for row, cells in raw.items()
    }
    targets = evaluate(summary)
    rows = table_rows(summary, status, md=False)
    title = "ZeroMQ benchmark, two processes on loopback (medians)"
    if load["busy"]:
        title += " - PRELIMINARY: machine busy"
    print_table(rows, targets, title)
    print(
        f"payload: {len(encode(PAYLOAD))} B msgpack; loop: {args.loop}; machine: "
        f"{info['cpu_model']}, {info['cpus']} CPUs, Python {info['python']}; other work: "
        f"{load['other_work_cores']:.2f} cores, steal {load['steal_fraction']:.1%}; "
        f"wall {wall:.0f} s"
    )
    if args.markdown:
        print(markdown(table_rows(summary, status, md=True), targets))
    out = {
        "benchmark": "zmq_bench",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "profile": "quick" if args.quick else "full",
        "loop": args.loop,
        "config": cfg,
        "payload_bytes": len(encode(PAYLOAD)),
        "machine": info,
        "load": load,
        "preliminary": load["busy"],
        "status": status,
        "summary": summary,
        "targets": targets,
        "raw": raw,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_json = path.with_suffix(path.suffix + ".tmp")
    tmp_json.write_text(json.dumps(out, indent=2, default=str))
    tmp_json.replace(path)
    print(f"wrote {path}")
    failed = [s for cells in status.values() for s in cells.values() if s.startswith("error")]
    return 1 if failed else 0


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _server_version(cmd: list[str]) -> str | None:
    """What a broker server says its version is, if it is installed here."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _libzmq() -> str | None:
    try:
        import zmq
    except ImportError:
        return None
    return str(zmq.zmq_version())


if __name__ == "__main__":
    raise SystemExit(main())
