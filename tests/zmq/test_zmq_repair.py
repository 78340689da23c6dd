"""The data link repairs itself: lost DONEs and NACKs, a node declared lost that comes back,
and a lost node's work redelivered into a full local mailbox. Real sockets, one process;
a frame "lost in transit" is one the test keeps from being sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from zmq_helpers import eventually

from bus import Bus
from bus.backends.zeromq import Broker, ZmqTransport


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Broker, Bus, Bus]]:
    async with Broker("tcp://127.0.0.1:0", heartbeat=0.1, liveness=3) as broker:
        assert broker.endpoint is not None
        async with (
            Bus(transport=ZmqTransport(broker.endpoint, node="pub", heartbeat=0.1)) as pub,
            Bus(transport=ZmqTransport(broker.endpoint, node="sub", heartbeat=0.1)) as sub,
        ):
            yield broker, pub, sub


def lose_once(sub: Bus, what: str) -> dict[str, int]:
    """Drop the first DONE (``what="done"``) or NACK/reply (``"control"``) ``sub`` sends."""
    transport = sub.transport
    assert isinstance(transport, ZmqTransport)
    dropped = {what: 0}
    inbox = transport._inbox
    flush = inbox.flush

    def lossy() -> None:
        for link in inbox.dirty:
            if not dropped[what] and getattr(link, what):
                dropped[what] += 1
                setattr(link, what, [])
        flush()

    inbox.flush = lossy  # type: ignore[method-assign]
    return dropped


async def test_a_lost_done_is_said_again_and_the_publisher_drains(
    pair: tuple[Broker, Bus, Bus],
) -> None:
    _, pub, sub = pair
    got: list[int] = []
    sub.on("t", lambda env: got.append(env.payload), name="s")
    await sub.transport.sync()
    dropped = lose_once(sub, "done")
    for i in range(6):
        await pub.emit("t", i)
        await asyncio.sleep(0.01)
    await pub.drain(timeout=5)  # waits on the lost DONE until a LINK_PING repairs it
    assert dropped == {"done": 1}
    assert got == list(range(6))
    assert pub.transport.stats()["in_flight"] == 0


async def test_a_lost_frame_and_its_lost_nack_are_resent(pair: tuple[Broker, Bus, Bus]) -> None:
    _, pub, sub = pair
    got: list[int] = []
    sub.on("t", lambda env: got.append(env.payload), name="s")
    await sub.transport.sync()
    dropped = lose_once(sub, "control")
    transport = pub.transport
    assert isinstance(transport, ZmqTransport)
    out = transport._out
    send = out.send_data
    lost = []

    def lossy(peer: object, frame: bytes) -> None:
        if frame.startswith(b"\x93\x05\x01") and not lost:  # data frame 1, once
            lost.append(frame)
            return
        send(peer, frame)  # type: ignore[arg-type]

    out.send_data = lossy  # type: ignore[method-assign]
    for i in range(6):
        await pub.emit("t", i)
        await asyncio.sleep(0.01)
    await pub.drain(timeout=5)
    assert lost and dropped == {"control": 1}  # the frame and the NACK asking for it
    assert got == list(range(6))  # in order, each once
    assert sub.transport.stats()["gaps"] >= 2  # noticed again after the NACK was lost


async def test_a_node_declared_lost_and_back_gets_every_new_message(
    pair: tuple[Broker, Bus, Bus],
) -> None:
    broker, pub, sub = pair
    got: list[int] = []
    sub.on("t", lambda env: got.append(env.payload), name="s")
    await sub.transport.sync()
    for i in range(5):
        await pub.emit("t", i)
    await pub.drain(timeout=5)
    # The broker declares "sub" lost (as after a stall); it is reset and joins again with
    # the same incarnation, and "pub" links to it afresh.
    [node] = [n for n in broker._nodes.values() if n.name == "sub"]
    broker._lose(node)
    broker._flush()
    await eventually(lambda: "sub" not in pub.transport.stats()["peers"])
    await eventually(lambda: "sub" in pub.transport.stats()["peers"])
    for i in range(5, 10):
        await pub.emit("t", i)
    await pub.drain(timeout=5)
    assert got == list(range(10))  # none taken for a duplicate of the old link's frames
    assert sub.transport.stats()["rejoined"] == 1


async def test_a_lost_node_s_work_waits_for_room_in_a_full_local_mailbox(
    pair: tuple[Broker, Bus, Bus],
) -> None:
    broker, pub, sub = pair
    never = asyncio.Event()

    async def stuck(env: object) -> None:
        await never.wait()

    sub.on("t", stuck, name="g")
    await sub.transport.sync()
    for i in range(4):
        await pub.emit("t", i)
    await eventually(lambda: pub.transport.stats()["in_flight"] == 4)
    gate = asyncio.Event()
    got: list[int] = []

    async def slow(env: object) -> None:
        await gate.wait()
        got.append(env.payload)  # type: ignore[attr-defined]

    # The publisher joins group g itself, with a one-message blocking mailbox.
    pub.on("t", slow, name="g", max_queue=1, overflow="block")
    await pub.transport.sync()
    [node] = [n for n in broker._nodes.values() if n.name == "sub"]
    broker._lose(node)
    broker._flush()
    await eventually(lambda: pub.transport.stats()["redelivered"] == 4)
    gate.set()
    await eventually(lambda: sorted(got) == [0, 1, 2, 3], what=f"handled {got}")
    assert len(pub.dlq) == 0
    never.set()
