"""One contract every transport keeps, run against each transport factory.

A *transport factory* is an async context manager that sets up whatever the transport needs
(nothing for in-process; a broker process and sockets for ZeroMQ) and yields a callable making
one new, unstarted :class:`~bus.Transport` per bus on that network. To run the whole suite
against another transport, add its factory to ``TRANSPORT_FACTORIES``, e.g.::

    @asynccontextmanager
    async def zeromq_network():
        async with run_broker() as endpoint:
            yield lambda: ZmqTransport(endpoint)

    TRANSPORT_FACTORIES.append(pytest.param(zeromq_network, id="zeromq"))

The tests only rely on what the contract promises, never on in-process timing: delivery is
awaited with ``eventually`` (a deadline, not a sleep), and "nothing arrived" is checked
after a later matching message sent on the same link has arrived.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest

from bus import (
    Bus,
    Envelope,
    InProcessHub,
    InProcessTransport,
    Priority,
    Transport,
    TransportError,
)

MakeTransport = Callable[[], Transport]


@asynccontextmanager
async def in_process_network() -> AsyncIterator[MakeTransport]:
    hub = InProcessHub()
    yield lambda: InProcessTransport(hub)


@asynccontextmanager
async def zeromq_network() -> AsyncIterator[MakeTransport]:
    """A broker in its own process; every bus a node with its own DEALER socket."""
    from bus.backends.zeromq import ZmqTransport, run_broker

    async with run_broker() as endpoint:
        yield lambda: ZmqTransport(endpoint)


@asynccontextmanager
async def nats_network() -> AsyncIterator[MakeTransport]:
    """A throwaway ``nats-server -js`` on a free loopback port; one team per network, every
    bus a node of it with its own connection."""
    from bus.backends.nats import NatsServer, NatsTransport

    server = await asyncio.to_thread(NatsServer().start)
    try:
        yield lambda: NatsTransport(server.url, team="contract", storage="memory")
    finally:
        await asyncio.to_thread(server.stop)


TRANSPORT_FACTORIES: list[Any] = [
    pytest.param(in_process_network, id="in-process"),
    pytest.param(zeromq_network, id="zeromq"),
    pytest.param(nats_network, id="nats"),
]


async def eventually(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not predicate():  # noqa: ASYNC110 - a transport offers nothing to wait on
                await asyncio.sleep(0.001)
    except TimeoutError:
        pytest.fail(f"not delivered within {timeout}s")


async def subscribed(*buses: Bus) -> None:
    """Advertising is eventually consistent across processes: wait on the contract's
    barrier (``Transport.sync``) until each bus's subscriptions are visible everywhere."""
    for bus in buses:
        await bus.transport.sync()


class Network:
    """Buses joined by one transport factory; closes every bus it made."""

    def __init__(self, make_transport: MakeTransport, stack: AsyncExitStack) -> None:
        self.make_transport = make_transport
        self._stack = stack

    async def bus(self, **options: Any) -> Bus:
        return await self._stack.enter_async_context(
            Bus(transport=self.make_transport(), **options)
        )


@pytest.fixture(params=TRANSPORT_FACTORIES)
async def network(request: pytest.FixtureRequest) -> AsyncIterator[Network]:
    async with request.param() as make_transport, AsyncExitStack() as stack:
        yield Network(make_transport, stack)


class TransportContract:
    """The contract tests. A subclass runs them once per factory in ``TRANSPORT_FACTORIES``."""

    async def test_delivers_to_another_bus(self, network: Network) -> None:
        a = await network.bus()
        b = await network.bus()
        got: list[Envelope] = []
        b.on("orders.*", got.append, name="b-orders")
        await subscribed(b)
        payload = {"id": 7}
        sent = await a.emit("orders.created", payload)
        await eventually(lambda: got)
        assert len(got) == 1
        assert got[0].id == sent.id and got[0].topic == "orders.created"
        assert got[0].payload == payload

    async def test_delivers_to_every_matching_bus(self, network: Network) -> None:
        a = await network.bus()
        receivers = [await network.bus() for _ in range(3)]
        got: list[list[object]] = [[] for _ in receivers]
        for i, r in enumerate(receivers):
            r.on(">", lambda env, i=i: got[i].append(env.payload), name=f"r{i}")
        await subscribed(*receivers)
        for n in range(5):
            await a.emit("x", n)
        await eventually(lambda: all(len(g) == 5 for g in got))
        assert got == [[0, 1, 2, 3, 4]] * 3

    async def test_no_delivery_to_a_bus_whose_patterns_do_not_match(self, network: Network) -> None:
        a = await network.bus()
        b = await network.bus()
        got: list[str] = []
        b.on("billing.*", lambda env: got.append(env.topic), name="billing")
        await subscribed(b)
        await a.emit("orders.created")
        await a.emit("billing.x")
        await a.emit("billingx")
        await a.emit("billing.done")  # the marker: once it arrived, the others had their chance
        await eventually(lambda: "billing.done" in got)
        assert got == ["billing.x", "billing.done"]

    async def test_local_subscribers_are_not_delivered_twice(self, network: Network) -> None:
        a = await network.bus()
        b = await network.bus()
        at_a: list[object] = []
        at_b: list[object] = []
        a.on("t.*", lambda env: at_a.append(env.payload), name="local")
        b.on("t.*", lambda env: at_b.append(env.payload), name="remote")
        await subscribed(a, b)
        for n in range(3):
            await a.emit("t.x", n)
        await eventually(lambda: len(at_b) == 3)
        await a.emit("t.marker", "end")
        await eventually(lambda: "end" in at_b)
        await a.drain()
        assert at_a == [0, 1, 2, "end"]
        assert at_b == [0, 1, 2, "end"]
        assert a.stats().subscribers["local"].published == 4

    async def test_has_remote_reflects_other_buses_patterns(self, network: Network) -> None:
        a = await network.bus()
        b = await network.bus()
        b.on("only.*", lambda env: None, name="narrow")
        a.on(">", lambda env: None, name="local-all")
        await eventually(lambda: a.transport.has_remote("only.this"))
        assert not a.transport.has_remote("something.else")  # its own "*" is not remote
        await eventually(lambda: b.transport.has_remote("anything"))  # a's "*" is, for b
        await a.off("local-all")
        await eventually(lambda: not b.transport.has_remote("anything"))
        assert b.transport.has_remote("only.this") is False

    async def test_priority_and_lineage_are_preserved(self, network: Network) -> None:
        # Buses of one run share its session (on NATS it is also the scope of their
        # consumer groups: another session's never reach them).
        a = await network.bus(session_id="sess-a")
        b = await network.bus(session_id="sess-a")
        back_at_a: list[Envelope] = []
        at_b: list[Envelope] = []
        a.on("answer", back_at_a.append, name="a-answers")

        @b.on("question", name="b-responder")
        async def responder(env: Envelope) -> None:
            at_b.append(env)
            await b.emit("answer", "42", Priority.HIGH)

        await subscribed(a, b)
        root = await a.emit("question", "?", Priority.CRITICAL)
        await eventually(lambda: back_at_a)
        q, ans = at_b[0], back_at_a[0]
        assert q.priority == Priority.CRITICAL
        assert (q.id, q.correlation_id, q.causation_id, q.hops, q.session_id) == (
            root.id,
            root.id,
            None,
            0,
            "sess-a",
        )
        assert ans.priority == Priority.HIGH
        assert ans.causation_id == root.id
        assert ans.correlation_id == root.id
        assert ans.hops == 1
        assert ans.source == "b-responder"
        assert ans.session_id == "sess-a"

    async def test_priority_orders_the_receiving_mailbox(self, network: Network) -> None:
        a = await network.bus()
        b = await network.bus()
        hold = asyncio.Event()
        order: list[str] = []

        @b.on("w", name="worker")
        async def worker(env: Envelope) -> None:
            if env.payload == "first":
                await hold.wait()
            order.append(env.payload)

        await subscribed(b)
        await a.emit("w", "first")
        await eventually(lambda: b.stats().subscribers["worker"].in_flight == 1)
        await a.emit("w", "normal", Priority.NORMAL)
        await a.emit("w", "high", Priority.HIGH)
        await a.emit("w", "critical", Priority.CRITICAL)
        await eventually(lambda: b.stats().subscribers["worker"].queued == 3)
        hold.set()
        await eventually(lambda: len(order) == 4)
        assert order == ["first", "critical", "high", "normal"]

    async def test_a_message_from_another_bus_is_not_sent_back(self, network: Network) -> None:
        a = await network.bus()
        b = await network.bus()
        at_a: list[object] = []
        at_b: list[object] = []
        a.on("ping", lambda env: at_a.append(env.payload), name="a")
        b.on("ping", lambda env: at_b.append(env.payload), name="b")
        await subscribed(a, b)
        await b.emit("ping", "from b")
        await eventually(lambda: at_a)
        await a.emit("ping", "marker")
        await eventually(lambda: "marker" in at_b)
        await eventually(lambda: "marker" in at_a)
        assert at_a == ["from b", "marker"]
        assert at_b == ["from b", "marker"]

    async def test_a_new_subscription_is_reached_by_a_topic_already_routed(
        self, network: Network
    ) -> None:
        a = await network.bus()
        b = await network.bus()
        await a.emit("late.topic", "nobody yet")  # a caches "no remote interest"
        got: list[object] = []
        b.on("late.*", lambda env: got.append(env.payload), name="late")
        await eventually(lambda: a.transport.has_remote("late.topic"))
        await a.emit("late.topic", "now")
        await eventually(lambda: got)
        assert got == ["now"]

    async def test_closing_a_bus_stops_delivery_to_it(self, network: Network) -> None:
        a = await network.bus()
        b = await network.bus()
        c = await network.bus()
        at_b: list[object] = []
        at_c: list[object] = []
        b.on("t", lambda env: at_b.append(env.payload), name="b")
        c.on("t", lambda env: at_c.append(env.payload), name="c")
        await subscribed(b, c)
        await a.emit("t", 1)
        await eventually(lambda: at_b == [1] and at_c == [1])
        await b.aclose()
        await a.emit("t", 2)  # must not raise because b is gone
        await eventually(lambda: at_c == [1, 2])
        assert at_b == [1]

    async def test_messages_emitted_just_before_close_still_arrive(self, network: Network) -> None:
        a = await network.bus()
        b = await network.bus()
        got: list[int] = []
        b.on("t", lambda env: got.append(env.payload), name="b")
        await eventually(lambda: a.transport.has_remote("t"))
        for i in range(50):
            a.emit_nowait("t", i)
        await a.aclose()  # closing with unsent data must not drop it
        await eventually(lambda: len(got) == 50)
        assert sorted(got) == list(range(50))

    async def test_a_closed_transport_refuses_to_send(self, network: Network) -> None:
        a = await network.bus()
        b = await network.bus()
        got: list[object] = []
        b.on("t", lambda env: got.append(env.payload), name="b")
        await eventually(lambda: a.transport.has_remote("t"))
        transport = a.transport
        await a.aclose()
        with pytest.raises(TransportError):
            await transport.send(Envelope.new("t", "after close"))
        await asyncio.sleep(0.01)
        assert got == []


class TestTransportContract(TransportContract):
    """Every contract test, for every factory in ``TRANSPORT_FACTORIES``."""
