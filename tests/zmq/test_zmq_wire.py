"""Bad frames from a raw ZeroMQ socket, and the link protocol's loss and duplicate handling.

A raw DEALER speaks to a real broker here: it sends what no well-behaved node would (garbage,
oversized frames, skipped and repeated sequence numbers, a message id twice) and the test
checks that each is counted and dropped, a gap is detected and resent, and the broker keeps
serving the well-behaved nodes throughout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from zmq_helpers import eventually

from bus import Bus, Envelope
from bus.backends.zeromq import Broker, ZmqTransport
from bus.backends.zeromq._wire import (
    PROTOCOL,
    Hello,
    Nack,
    Pong,
    down_decoder,
)

MAX_FRAME = 4096
enc = msgspec.msgpack.Encoder()
decode = down_decoder().decode


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    async with Broker("tcp://127.0.0.1:0", max_frame=MAX_FRAME) as running:
        yield running


@pytest.fixture
async def raw(broker: Broker) -> AsyncIterator[zmq.asyncio.Socket]:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"raw")
    sock.setsockopt(zmq.LINGER, 0)
    assert broker.endpoint is not None
    sock.connect(broker.endpoint)
    yield sock
    sock.close(0)
    ctx.term()


def wire_env(id_: int, topic: str = "g.x", payload: Any = None) -> tuple[Any, ...]:
    return (topic, payload, 2, id_, None, id_, None, None, time.time_ns(), 0, None)


def data(seq: int, *ids: int) -> bytes:
    return enc.encode((5, seq, [("g.x", wire_env(i, payload=i), False) for i in ids]))


async def until(sock: zmq.asyncio.Socket, match: Callable[[Any], bool]) -> Any:
    """Read frames from the broker until one matches (others, e.g. DONE, are skipped)."""
    async with asyncio.timeout(10):
        while True:
            msg = decode(await sock.recv())
            if match(msg):
                return msg


async def test_malformed_and_oversized_frames_are_counted_dropped_and_survived(
    broker: Broker, raw: zmq.asyncio.Socket
) -> None:
    assert broker.endpoint is not None
    async with (
        Bus(transport=ZmqTransport(broker.endpoint, node="a", max_frame=MAX_FRAME)) as a,
        Bus(transport=ZmqTransport(broker.endpoint, node="b", max_frame=MAX_FRAME)) as b,
    ):
        got: list[object] = []
        b.on("t", lambda env: got.append(env.payload), name="b")
        await b.transport.sync()
        await raw.send(b"\xc1 not msgpack")  # 0xc1 is never valid msgpack
        await raw.send(enc.encode([99, "no such message"]))
        await raw.send(enc.encode((5, "seq must be an int", [])))
        await raw.send(enc.encode((1, PROTOCOL, 7, "types", "all", "wrong", [])))
        await raw.send_multipart([b"\xc1 one", b"\xc1 two"])  # two frames, both bad
        await raw.send(b"\x00" * (MAX_FRAME + 100))  # over the limit: counted, dropped
        await raw.send(b"\x00" * (4 * MAX_FRAME))  # over MAXMSGSIZE: ZeroMQ drops the link
        await eventually(
            lambda: broker.stats()["malformed"] >= 6 and broker.stats()["oversized"] >= 1,
            what=f"counted: {broker.stats()}",
        )
        await a.emit("t", "still served")
        await eventually(lambda: got == ["still served"])
        assert broker.stats()["malformed"] == 6
        assert broker.stats()["oversized"] == 1


async def test_a_gap_is_detected_and_resent_and_duplicates_are_dropped(
    broker: Broker, raw: zmq.asyncio.Socket
) -> None:
    assert broker.endpoint is not None
    async with Bus(transport=ZmqTransport(broker.endpoint, node="b")) as b:
        got: list[Envelope] = []
        b.on("g.*", got.append, name="g")
        await b.transport.sync()
        await raw.send(enc.encode(Hello(PROTOCOL, "raw", 1, 100, 0, [])))
        await until(raw, lambda m: type(m).__name__ == "Interest")
        await raw.send(data(0, 1001))
        await raw.send(data(2, 1003))  # frame 1 "lost" on the way
        nack = await until(raw, lambda m: isinstance(m, Nack))
        assert nack.expected == 1
        await raw.send(data(1, 1002))  # the sender resends from the gap on
        await raw.send(data(2, 1003))
        await raw.send(data(0, 1001))  # a replayed frame: a duplicate at the link
        await raw.send(data(3, 1001))  # a new frame repeating a message id
        await raw.send(data(4, 1004))
        await eventually(lambda: len(got) == 4, what=f"4 delivered, got {len(got)}")
        assert [env.id for env in got] == [1001, 1002, 1003, 1004]
        assert [env.payload for env in got] == [1001, 1002, 1003, 1004]
        assert broker.stats()["gaps"] == 1
        assert broker.stats()["duplicates"] == 1
        assert b.transport.stats()["duplicates"] == 1  # by message id, at the receiver


async def test_a_lost_last_frame_is_noticed_from_the_heartbeat(
    broker: Broker, raw: zmq.asyncio.Socket
) -> None:
    await raw.send(enc.encode(Hello(PROTOCOL, "raw", 1, 100, 0, [])))
    await until(raw, lambda m: type(m).__name__ == "Interest")
    await raw.send(data(0, 1))
    # Frames 1 and 2 never arrive, and nothing follows them; the heartbeat says 2 was sent.
    await raw.send(enc.encode((10, time.time_ns(), 2)))
    nack = await until(raw, lambda m: isinstance(m, Nack))
    assert nack.expected == 1
    pong = await until(raw, lambda m: isinstance(m, Pong))
    assert pong.t1 <= pong.t2 <= pong.t3


async def test_duplicate_ids_are_dropped_across_dedup_generations(
    broker: Broker, raw: zmq.asyncio.Socket
) -> None:
    assert broker.endpoint is not None
    async with Bus(transport=ZmqTransport(broker.endpoint, node="b", dedup_window=8)) as b:
        got: list[int] = []
        b.on("g.*", lambda env: got.append(env.id), name="g")
        await b.transport.sync()
        await raw.send(enc.encode(Hello(PROTOCOL, "raw", 1, 100, 0, [])))
        await until(raw, lambda m: type(m).__name__ == "Interest")
        await raw.send(data(0, *range(100, 120)))  # two generations of 8 roll over
        await raw.send(data(1, *range(112, 120)))  # the newest 8: all remembered
        await raw.send(data(2, 120))
        await eventually(lambda: got[-1:] == [120], what=f"the last one, got {got[-3:]}")
        assert got == [*range(100, 121)]
        assert b.transport.stats()["duplicates"] == 8
