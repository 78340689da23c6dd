"""The broker restarts under live traffic: the nodes join the new one, and what they hold
is neither handled twice nor dead-lettered, though the new broker's first directories list
only the nodes that have joined it so far."""

from __future__ import annotations

import asyncio

from zmq_helpers import eventually

from bus import Bus
from bus.backends.zeromq import Broker, ZmqTransport


async def test_a_restarted_broker_loses_and_repeats_nothing() -> None:
    async with Broker("tcp://127.0.0.1:0", heartbeat=0.1, liveness=3) as first:
        endpoint = first.endpoint
        assert endpoint is not None
        pub = Bus(transport=ZmqTransport(endpoint, node="pub", heartbeat=0.1))
        sub = Bus(transport=ZmqTransport(endpoint, node="sub", heartbeat=0.1))
        await pub.start()
        await sub.start()
        gate = asyncio.Event()
        got: list[int] = []

        async def held(env: object) -> None:
            await gate.wait()
            got.append(env.payload)  # type: ignore[attr-defined]

        sub.on("t", held, name="s")
        await sub.transport.sync()
        for i in range(20):
            await pub.emit("t", i)
        await eventually(lambda: sub.stats().subscribers["s"].published == 20)
    # The old broker is gone, with sub holding 20 messages pub has not seen settled. sub
    # stays silent until pub has joined the new broker and heard its directory (listing
    # nobody else), the case where a publisher must not take sub for lost.
    session = sub.transport._session
    quiet = session.send
    session.send = lambda frame: None  # type: ignore[method-assign]
    try:
        async with Broker(endpoint, heartbeat=0.1, liveness=3) as second:
            await eventually(lambda: len(second._nodes) == 1, what="pub re-joined")
            await eventually(lambda: pub.transport.stats()["connected"])
            session.send = quiet  # type: ignore[method-assign]
            await eventually(lambda: len(second._nodes) == 2, what="sub re-joined")
            await eventually(
                lambda: all(t.stats()["connected"] for t in (pub.transport, sub.transport))
            )
            gate.set()
            for i in range(20, 30):
                await pub.emit("t", i)
            await pub.drain(timeout=10)
            assert sorted(got) == list(range(30))  # each once
            assert len(pub.dlq) == 0
            links = pub.transport.stats()
            assert (links["redelivered"], links["node_lost"], links["peers_lost"]) == (0, 0, 0)
    finally:
        await sub.aclose()
        await pub.aclose()
