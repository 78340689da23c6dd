"""Nodes in their own processes: delivery, consumer groups, requests and lineage."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from zmq_helpers import child_node, eventually

from bus import Bus
from bus.backends.zeromq import ZmqTransport, run_broker


async def test_a_node_in_another_process_handles_what_this_bus_publishes(
    tmp_path: Path,
) -> None:
    async with (
        run_broker() as endpoint,
        child_node(endpoint, "worker", "orders", "orders.*", tmp_path / "w.log") as child,
        Bus(transport=ZmqTransport(endpoint, node="publisher")) as bus,
    ):
        assert bus.transport.has_remote("orders.created")
        assert not bus.transport.has_remote("billing.created")  # exact glob, not a prefix
        sent = [await bus.emit("orders.created", {"n": i}) for i in range(200)]
        await bus.emit("billing.created", "nobody remote wants this")
        await bus.drain()  # waits until the child settled every message
        assert child.handled() == [env.id for env in sent]


async def test_competing_consumers_share_the_load_and_handle_each_message_once(
    tmp_path: Path,
) -> None:
    async with (
        run_broker() as endpoint,
        child_node(
            endpoint, "w1", "billing", "jobs.*", tmp_path / "w1.log", "--delay", "0.001"
        ) as w1,
        child_node(
            endpoint, "w2", "billing", "jobs.*", tmp_path / "w2.log", "--delay", "0.001"
        ) as w2,
        Bus(transport=ZmqTransport(endpoint, node="publisher")) as bus,
    ):
        ids = [(await bus.emit("jobs.run", i)).id for i in range(600)]
        await bus.drain()
        handled = Counter(w1.handled() + w2.handled())
        assert set(handled) == set(ids)
        assert max(handled.values()) == 1  # each message went to exactly one member
        # Least-loaded picking with round-robin ties: both members carry real load.
        assert min(len(w1.handled()), len(w2.handled())) > 600 // 5


async def test_a_request_is_answered_by_a_node_in_another_process(tmp_path: Path) -> None:
    async with (
        run_broker() as endpoint,
        child_node(endpoint, "oracle", "oracle", "ask.*", tmp_path / "o.log"),
        Bus(transport=ZmqTransport(endpoint, node="asker")) as bus,
    ):
        answers = await asyncio.gather(*(bus.request("ask.double", i) for i in range(20)))
        assert answers == [{"node": "oracle", "doubled": 2 * i} for i in range(20)]


async def test_trace_and_causation_cross_the_wire_unchanged(tmp_path: Path) -> None:
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with (
        run_broker() as endpoint,
        child_node(endpoint, "tracer", "traced", "traced.*", tmp_path / "t.log") as child,
        Bus(transport=ZmqTransport(endpoint, node="origin")) as bus,
    ):
        got = []
        bus.on("root", got.append, name="local-root")
        root = await bus.emit("root", "r")
        await bus.drain()
        root.trace = trace  # as a tracer would have stamped it at publish
        follow = await bus.emit("traced.step", "x", cause=root)
        await bus.drain()
        await eventually(lambda: child.lines(), what="the child handled the message")
        [line] = child.lines()
        assert line == [str(follow.id), "traced.step", trace, str(root.id)]
