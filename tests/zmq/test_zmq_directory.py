"""Hostile directory entries: a rogue HELLO at a real broker, a rogue directory at a node.

Without CURVE anyone who reaches the broker can join. A HELLO with an endpoint libzmq
refuses used to make every node log a traceback and apply the directory halfway; now the
broker refuses it (counted, answered with RESET) and each node checks every entry of a
directory again (counted as ``directory_dropped``), applying the good ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import msgspec
import pytest
import zmq
import zmq.asyncio
from zmq_helpers import eventually

from bus import Bus
from bus.backends.zeromq import Broker, ZmqTransport
from bus.backends.zeromq._wire import (
    DEFAULT_MAX_FRAME,
    PROTOCOL,
    Directory,
    DirectoryAck,
    Hello,
    PeerInfo,
    Welcome,
    control_up_decoder,
)

enc = msgspec.msgpack.Encoder()
KEY = zmq.curve_keypair()[0]

#: (name, data endpoint, key) no node can link to, and what the refusal says.
HOSTILE: list[tuple[str, str, bytes | None, str]] = [
    ("r-text", "not an endpoint", None, "must be tcp://host:port or ipc://path"),
    ("r-port", "tcp://127.0.0.1:99999", None, "port from 1 to 65535"),
    ("r-empty", "tcp://", None, "port from 1 to 65535"),
    ("r-scheme", "udp://127.0.0.1:5", None, "must be tcp://host:port or ipc://path"),
    ("r-wild", "tcp://*:5", None, "no IPv4 address or host name"),
    ("r-v6", "tcp://[nope]:5", None, "no IPv6 address"),
    ("r-ipc", "ipc://" + "x" * 200, None, "ipc path must be 1 to 107 bytes"),
    ("r-key", "tcp://127.0.0.1:5", b"short", "CURVE key must be 40 bytes"),
    ("r/slash", "tcp://127.0.0.1:5", None, "must be printable and have no '/'"),
    ("r\x1besc", "tcp://127.0.0.1:5", None, "must be printable and have no '/'"),
    ("", "tcp://127.0.0.1:5", None, "node name must be 1 to 255 characters"),
]


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    async with Broker("tcp://127.0.0.1:0") as running:
        yield running


async def test_a_rogue_hello_is_refused_counted_and_never_reaches_a_node(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    assert broker.endpoint is not None
    caplog.set_level(logging.WARNING)
    ctx = zmq.asyncio.Context()
    async with (
        Bus(transport=ZmqTransport(broker.endpoint, node="a")) as a,
        Bus(transport=ZmqTransport(broker.endpoint, node="b")) as b,
    ):
        got: list[object] = []
        b.on("t", lambda env: got.append(env.payload), name="b")
        await b.transport.sync()
        rogue = ctx.socket(zmq.DEALER)
        rogue.setsockopt(zmq.LINGER, 0)
        rogue.connect(broker.endpoint)
        try:
            for name, data, key, why in HOSTILE:
                hello = Hello(PROTOCOL, name, 1, 10, 0, [("steal", ">")], data, key)
                await rogue.send(enc.encode(hello))
                async with asyncio.timeout(10):
                    reset = msgspec.msgpack.decode(await rogue.recv())
                assert reset[0] == 14, reset  # RESET, with the reason
                assert reset[1].startswith("refused: ") and why in reset[1], (name, reset)
            stats = broker.stats()
            assert stats["refused_hellos"] == len(HOSTILE)
            assert set(stats["nodes"]) == {"a", "b"}
            # The nodes never heard of it, and still talk to each other.
            await a.emit("t", "still served")
            await eventually(lambda: got == ["still served"])
            for node in (a, b):
                t = node.transport.stats()
                assert set(t["peers"]) == {"b", "a"} - {t["node"]}
                assert t["directory_dropped"] == 0
        finally:
            rogue.close(0)
            ctx.term()
    assert tracebacks(caplog) == []
    refusals = [r for r in caplog.records if r.getMessage().startswith("refused HELLO #")]
    assert len(refusals) == 10  # the first ten are logged, then every thousandth


async def test_a_node_drops_bad_directory_entries_and_applies_the_rest(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    # A directory can lie too (a rogue "broker" at the address a node was given): each
    # node checks every entry itself, and the good ones still apply.
    assert broker.endpoint is not None
    caplog.set_level(logging.WARNING)
    ctx = zmq.asyncio.Context()
    fake = ctx.socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    fake.bind("tcp://127.0.0.1:0")
    endpoint = fake.getsockopt_string(zmq.LAST_ENDPOINT)
    decode_up = control_up_decoder(DEFAULT_MAX_FRAME).decode
    try:
        async with Bus(transport=ZmqTransport(broker.endpoint, node="good")) as good:
            good_info = PeerInfo(
                "good",
                good.transport._incarnation,
                good.transport.data_endpoint,
                None,
                10,
                [("g", "t")],
            )
            bad = [PeerInfo(name, 1, data, key, 10, [("x", ">")]) for name, data, key, _ in HOSTILE]
            bad += [
                PeerInfo("victim", 1, "tcp://127.0.0.1:5", None, 10, []),  # its own name
                PeerInfo("r-credit", 1, "tcp://127.0.0.1:5", None, 0, []),
            ]
            # Listed twice (restarted before the broker lost its old self): the last wins.
            stale = PeerInfo("good", 2, "tcp://127.0.0.1:5", None, 10, [("old", "o")])

            async def serve() -> None:
                ident, frame = await fake.recv_multipart()
                assert isinstance(decode_up(frame), Hello)
                await fake.send_multipart(
                    [ident, enc.encode(Welcome("fake", 1.0, 3, 1 << 20, 1, "boot:fake", 0))]
                )
                directory = Directory(1, [bad[0], stale, *bad[1:], good_info])
                await fake.send_multipart([ident, enc.encode(directory)])
                while True:  # until the node says it applied it
                    ident, frame = await fake.recv_multipart()
                    msg = decode_up(frame)
                    if isinstance(msg, DirectoryAck):
                        assert msg.version == 1
                        return

            server = asyncio.ensure_future(serve())
            async with Bus(transport=ZmqTransport(endpoint, node="victim")) as victim:
                async with asyncio.timeout(10):
                    await server
                t = victim.transport.stats()
                assert t["directory_dropped"] == len(bad)
                assert set(t["peers"]) == {"good"}
                assert t["peers"]["good"]["data"] == good.transport.data_endpoint
                assert victim.transport.has_remote("t")
                assert not victim.transport.has_remote("anything.else")
    finally:
        fake.close(0)
        ctx.term()
    assert tracebacks(caplog) == []
    dropped = [m for m in map(logging.LogRecord.getMessage, caplog.records) if "dropped" in m]
    assert len(dropped) == 10
    assert "'r-text'" in dropped[0] and "must be tcp://host:port" in dropped[0]
