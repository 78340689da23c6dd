"""A node SIGKILLed mid-stream: what it held goes to the surviving member of its group,
or back to the publisher's DLQ as ``node_lost``. Nothing goes missing."""

from __future__ import annotations

import asyncio
from pathlib import Path

from zmq_helpers import child_node, eventually

from bus import Bus
from bus.backends.zeromq import ZmqTransport, run_broker

HEARTBEAT = 0.2  # with liveness 3: a dead node is noticed within 0.6 s


async def _publish(bus: Bus, n: int) -> list[int]:
    return [(await bus.emit("jobs.run", i)).id for i in range(n)]


async def test_a_killed_member_s_messages_go_to_the_survivor(tmp_path: Path) -> None:
    beat = ("--delay", "0.002", "--heartbeat", str(HEARTBEAT))
    async with (
        run_broker(heartbeat=HEARTBEAT) as endpoint,
        child_node(endpoint, "w1", "work", "jobs.*", tmp_path / "w1.log", *beat) as w1,
        child_node(endpoint, "w2", "work", "jobs.*", tmp_path / "w2.log", *beat) as w2,
        Bus(transport=ZmqTransport(endpoint, node="pub", heartbeat=HEARTBEAT, window=64)) as bus,
    ):
        publishing = asyncio.create_task(_publish(bus, 3000))
        await eventually(lambda: len(w1.handled()) >= 200, what="w1 handled 200")
        w1.kill()
        await w1.proc.wait()
        ids = await publishing
        await bus.drain(timeout=30)
        handled = set(w1.handled()) | set(w2.handled())
        lost = {e.envelope.id for e in bus.dlq.entries(reason="node_lost")}
        assert handled | lost == set(ids)  # nothing missing
        assert not lost  # a survivor existed, so everything was redelivered to it
        assert len(w2.handled()) > 0
        assert bus.transport.stats()["in_flight"] == 0


async def test_a_killed_sole_consumer_s_messages_are_dead_lettered_as_node_lost(
    tmp_path: Path,
) -> None:
    async with (
        run_broker(heartbeat=HEARTBEAT) as endpoint,
        child_node(
            endpoint, "only", "solo", "jobs.*", tmp_path / "w.log",
            "--delay", "0.01", "--heartbeat", str(HEARTBEAT),
        ) as worker,
        Bus(transport=ZmqTransport(endpoint, node="pub", heartbeat=HEARTBEAT)) as bus,
    ):  # fmt: skip
        ids = await _publish(bus, 500)
        await eventually(lambda: len(worker.handled()) >= 20, what="20 handled")
        worker.kill()
        await bus.drain(timeout=30)
        handled = set(worker.handled())
        lost = bus.dlq.entries(reason="node_lost")
        assert handled | {e.envelope.id for e in lost} == set(ids)
        assert lost, "the worker died holding messages; they must be dead-lettered"
        assert {e.subscriber for e in lost} == {"solo"}
        assert all(e.error_type == "PeerLost" for e in lost)
        assert bus.stats().dlq_size == len(lost)
        assert bus.transport.stats()["node_lost"] == len(lost)
