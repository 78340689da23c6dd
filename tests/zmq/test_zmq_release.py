"""A closing member gives its backlog back: the publisher redelivers it to another member of
the group instead of counting it settled (``Receipt.release`` on ZeroMQ)."""

from __future__ import annotations

import asyncio

from zmq_helpers import eventually

from bus import Bus, Envelope
from bus.backends.zeromq import ZmqTransport, run_broker

HEARTBEAT = 0.1


def node(endpoint: str, name: str) -> Bus:
    return Bus(transport=ZmqTransport(endpoint, node=name, heartbeat=HEARTBEAT))


async def test_a_closing_member_s_backlog_goes_to_another_member() -> None:
    async with run_broker(heartbeat=HEARTBEAT) as endpoint, node(endpoint, "pub") as pub:
        leaving = node(endpoint, "leaving")
        await leaving.start()
        gate = asyncio.Event()
        started: list[int] = []

        async def stuck(env: Envelope) -> None:
            started.append(env.payload)
            await gate.wait()  # never set: this member handles nothing to the end

        leaving.on("jobs.*", stuck, name="work")
        await leaving.transport.sync()
        await pub.transport.sync()
        for i in range(50):
            await pub.emit("jobs.run", i)
        await eventually(lambda: leaving.stats().subscribers["work"].published == 50)
        async with node(endpoint, "staying") as staying:
            got: list[int] = []
            staying.on("jobs.*", lambda env: got.append(env.payload), name="work")
            await staying.transport.sync()
            await leaving.aclose(drain=False)
            await pub.drain(timeout=10)
            await eventually(lambda: len(got) == 50, what="the backlog redelivered")
            assert sorted(got) == list(range(50))  # each once, none lost
            assert started  # the leaving member had taken them
            assert leaving.transport.stats()["released"] >= 1
            # The closing member lists nothing as its own dead letter: what it held went back.
            assert not leaving.dlq.entries()
            work = leaving.stats().subscribers["work"]
            assert work.dead_lettered == 0
            assert work.released == 50 - work.delivered
            assert work.published == work.delivered + work.released
            assert pub.transport.stats()["redelivered"] == 50
            assert not pub.dlq.entries()  # nothing dead-lettered at the publisher
            assert pub.transport.stats()["in_flight"] == 0
