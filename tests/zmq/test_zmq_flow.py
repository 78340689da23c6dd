"""Credit across the wire, requests that fail remotely, heartbeats and the clock offset."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import types

import pytest
from zmq_helpers import eventually

import bus.backends.zeromq as zeromq
from bus import Bus, Envelope
from bus.backends.zeromq import (
    Broker,
    EncodeError,
    RemoteHandlerError,
    ZmqTransport,
    run_broker,
)


async def test_a_slow_remote_consumer_slows_the_publisher_within_bounded_memory() -> None:
    window, credit, mailbox = 50, 20, 10
    async with (
        run_broker() as endpoint,
        Bus(transport=ZmqTransport(endpoint, node="pub", window=window)) as pub,
        Bus(transport=ZmqTransport(endpoint, node="sub", credit=credit)) as sub,
    ):
        gate = asyncio.Event()
        got: list[int] = []

        @sub.on("work", name="slow", max_queue=mailbox)
        async def slow(env: Envelope) -> None:
            await gate.wait()
            got.append(env.payload)

        await sub.transport.sync()
        peak = 0

        async def publish() -> None:
            nonlocal peak
            for i in range(300):
                await pub.emit("work", i)
                peak = max(peak, pub.transport.stats()["in_flight"])

        publishing = asyncio.create_task(publish())
        await eventually(lambda: pub.transport.stats()["in_flight"] == window)
        await asyncio.sleep(0.05)  # not synchronisation: a window in which nothing may move
        assert not publishing.done()  # emit is waiting for credit, not buffering without end
        assert pub.transport.stats()["in_flight"] == window
        assert sub.stats().subscribers["slow"].queued <= mailbox
        gate.set()
        await publishing
        await pub.drain()
        assert got == list(range(300))
        assert peak <= window


async def test_one_group_name_with_different_patterns_on_two_nodes() -> None:
    # "audit" on x takes a.*, on y b.*: a b.* message from x must reach y's member, and an
    # a.* message from y must reach x's, though both nodes have a member of the group.
    async with (
        run_broker() as endpoint,
        Bus(transport=ZmqTransport(endpoint, node="x")) as x,
        Bus(transport=ZmqTransport(endpoint, node="y")) as y,
    ):
        at_x: list[str] = []
        at_y: list[str] = []
        x.on("a.*", lambda env: at_x.append(env.topic), name="audit")
        y.on("b.*", lambda env: at_y.append(env.topic), name="audit")
        await x.transport.sync()
        await y.transport.sync()
        await x.emit("b.1")
        await y.emit("a.1")
        await x.emit("a.2")  # x's own member: handled at x only, never also at y
        await x.drain()
        await y.drain()
        assert sorted(at_x) == ["a.1", "a.2"]
        assert at_y == ["b.1"]


async def test_a_group_member_leaving_under_traffic_loses_nothing() -> None:
    # b leaves group "w" while pub streams to it and c: what pub routed to b before it
    # heard is still handled at b, so each message is handled exactly once (or, arriving
    # later than every barrier, dead-lettered at b as unsubscribed: never marked done unseen).
    async with (
        run_broker() as endpoint,
        Bus(transport=ZmqTransport(endpoint, node="pub")) as pub,
        Bus(transport=ZmqTransport(endpoint, node="b")) as b,
        Bus(transport=ZmqTransport(endpoint, node="c")) as c,
    ):
        at_b: list[int] = []
        at_c: list[int] = []
        b.on("work", lambda env: at_b.append(env.payload), name="w")
        c.on("work", lambda env: at_c.append(env.payload), name="w")
        await b.transport.sync()
        await c.transport.sync()
        n = 4000

        async def publish() -> None:
            for i in range(n):
                await pub.emit("work", i)
                if i % 50 == 0:
                    await asyncio.sleep(0)  # batches of 50, so b's off() lands mid-stream

        publishing = asyncio.create_task(publish())
        await eventually(lambda: len(at_b) >= 300, what="b handling its share")
        await b.off("w")
        left_at = len(at_b)
        await publishing
        await pub.drain()
        assert left_at < n // 2  # b left with most of the stream still to come
        unsubscribed = [e.envelope.payload for e in b.dlq.entries(reason="unsubscribed")]
        handled = at_b + at_c
        assert len(handled) == len(set(handled))  # none twice
        assert sorted(handled + unsubscribed) == list(range(n))  # none lost
        assert len(at_b) == left_at  # and none handled at b after it left


async def test_a_remote_handler_failure_fails_the_request_with_its_type() -> None:
    async with (
        run_broker() as endpoint,
        Bus(transport=ZmqTransport(endpoint)) as asker,
        Bus(transport=ZmqTransport(endpoint)) as answerer,
    ):

        @answerer.on("divide", name="divider")
        async def divide(env: Envelope) -> float:
            return 1 / env.payload

        await answerer.transport.sync()
        assert await asker.request("divide", 4) == 0.25
        with pytest.raises(RemoteHandlerError, match="ZeroDivisionError") as info:
            await asker.request("divide", 0)
        assert info.value.error_type == "ZeroDivisionError"


async def test_a_payload_msgpack_cannot_carry_is_refused_at_emit() -> None:
    async with (
        run_broker() as endpoint,
        Bus(transport=ZmqTransport(endpoint)) as a,
        Bus(transport=ZmqTransport(endpoint)) as b,
    ):
        b.on("x", lambda env: None, name="x")
        await b.transport.sync()
        with pytest.raises(EncodeError, match=r"'x'.*not msgpack-encodable"):
            await a.emit("x", object())
        assert a.transport.stats()["in_flight"] == 0


@pytest.fixture
def elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes take the broker for one on another machine: they estimate their clock."""
    monkeypatch.setattr("bus.backends.zeromq._control.clock_domain", lambda: "boot:another-machine")


@pytest.mark.usefixtures("elsewhere")
async def test_heartbeats_estimate_the_clock_offset_to_the_broker() -> None:
    # Quick heartbeats for a quick sample, but a long liveness: with the default 3 a stall
    # of 0.15 s on a loaded machine would lose the broker and fail ``broker_lost == 0``.
    async with (
        run_broker(heartbeat=0.05, liveness=40) as endpoint,
        Bus(transport=ZmqTransport(endpoint, heartbeat=0.05, liveness=40)) as node,
    ):
        await eventually(lambda: node.transport.stats()["rtt_ns"] > 0, what="a heartbeat")
        stats = node.transport.stats()
        # Same machine, same clock in truth: the estimate is within the heartbeat's round trip.
        assert stats["clock_shared"] is False
        assert abs(stats["clock_offset_ns"]) <= stats["rtt_ns"]
        assert stats["connected"] and stats["broker_lost"] == 0


async def test_a_node_on_the_brokers_machine_takes_the_brokers_clock_exactly() -> None:
    async with (
        run_broker() as endpoint,
        Bus(transport=ZmqTransport(endpoint, node="a")) as a,
        Bus(transport=ZmqTransport(endpoint, node="b")) as b,
    ):
        got: list[int] = []

        @b.on("t", name="t")
        async def took(env: Envelope) -> None:
            got.append(env.created)

        await b.transport.sync()
        sent = await a.emit("t", 1)
        await eventually(lambda: bool(got), what="the message")
        # Not an estimate: both read this machine's monotonic clock, and the move to the
        # broker's reference and back cancels to the nanosecond.
        assert a.transport.stats()["clock_shared"] and b.transport.stats()["clock_shared"]
        assert got == [sent.created]


@pytest.mark.usefixtures("elsewhere")
async def test_the_clock_offset_is_measured_right_after_joining() -> None:
    # Heartbeats an hour apart: the only clock sample is the ping sent on joining.
    async with (
        run_broker(heartbeat=3600) as endpoint,
        Bus(transport=ZmqTransport(endpoint, heartbeat=3600)) as node,
    ):
        await eventually(lambda: node.transport.stats()["rtt_ns"] > 0, what="the join's ping")
        stats = node.transport.stats()
        assert abs(stats["clock_offset_ns"]) <= stats["rtt_ns"]


async def test_many_requests_in_flight_get_their_own_answers() -> None:
    # Replies travel with DONE frames in multi-frame messages both ways; each must still
    # reach its own request, in any interleaving.
    async with (
        run_broker() as endpoint,
        Bus(transport=ZmqTransport(endpoint)) as asker,
        Bus(transport=ZmqTransport(endpoint)) as answerer,
    ):
        answerer.on("sq", lambda env: env.payload * env.payload, name="sq")
        await answerer.transport.sync()
        answers = await asyncio.gather(*(asker.request("sq", i) for i in range(500)))
        assert answers == [i * i for i in range(500)]
        await asker.drain(timeout=10)
        assert asker.transport.stats()["acked"] == asker.transport.stats()["sent"] == 500


def test_the_package_exports_exactly_its_public_names() -> None:
    public = {
        name
        for name, value in vars(zeromq).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(zeromq.__all__) == public


def test_importing_bus_and_its_backends_package_does_not_import_pyzmq() -> None:
    code = "import sys, bus, bus.backends; print(json.dumps('zmq' in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) is False


async def test_batches_split_at_frame_size_batch_count_and_credit_and_keep_order() -> None:
    # Small frames, small batches and little credit: the publisher cuts what it sends at
    # every one of these limits. Topic t.x also goes to "b" on the publisher itself, so
    # its copies for the remote "a" carry explicit names; t.r is a request.
    async with (
        Broker("tcp://127.0.0.1:0", max_frame=4096) as broker,
        Bus(transport=ZmqTransport(str(broker.endpoint), max_frame=4096, batch_max=7)) as pub,
        Bus(transport=ZmqTransport(str(broker.endpoint), max_frame=4096, credit=10)) as sub,
    ):
        got: dict[str, list[int]] = {"a": [], "a-requests": [], "b-local": []}
        sub.on(
            "t.*",
            lambda env: got["a-requests" if env.topic == "t.r" else "a"].append(env.payload[0]),
            name="a",
        )
        sub.on("t.r", lambda env: -env.payload[0], name="r")
        pub.on("t.x", lambda env: got["b-local"].append(env.payload[0]), name="b")
        sub.on("t.x", lambda env: None, name="b")
        await sub.transport.sync()
        await pub.transport.sync()
        sizes = [(i * 379) % 1500 for i in range(400)]
        topics = ["t.x" if i % 3 == 0 else "t.y" for i in range(400)]
        for i, (topic, size) in enumerate(zip(topics, sizes, strict=True)):
            await pub.emit(topic, [i, "p" * size])
        answers = await asyncio.gather(*(pub.request("t.r", [i, ""]) for i in range(50)))
        await pub.drain(timeout=10)
        assert answers == [-i for i in range(50)]
        assert got["a"] == list(range(400))  # every message once, in order
        # The requests matched t.* too (at HIGH priority they may overtake queued ones).
        assert sorted(got["a-requests"]) == list(range(50))
        assert got["b-local"] == [i for i in range(400) if topics[i] == "t.x"]
        stats = pub.transport.stats()
        assert stats["acked"] == stats["sent"] == 450  # one copy each: one node has every match
        assert stats["frames_out"] >= 450 // 7
        assert sub.transport.stats()["received"] == 450
        assert broker.stats()["frames_in"] < 100  # control only: no message went through it


async def test_relinks_leave_one_inbound_link_per_peer() -> None:
    # Issue #14 item 11: every relink made a new DEALER identity, and the receiver kept the
    # state of each old one for as long as the publishing node lived.
    async with (
        run_broker() as endpoint,
        Bus(transport=ZmqTransport(endpoint, node="pub")) as pub,
        Bus(transport=ZmqTransport(endpoint, node="sub")) as sub,
    ):
        got: list[int] = []
        sub.on("x", lambda env: got.append(env.payload), name="x")
        await sub.transport.sync()
        await pub.emit("x", 0)
        await pub.drain(timeout=10)
        peer = pub.transport._directory.peers["sub"]
        for i in range(1, 6):
            pub.transport._out.relink(peer)
            await pub.emit("x", i)
            await pub.drain(timeout=10)
        await eventually(lambda: len(got) == 6, what="every message delivered")
        assert sorted(got) == list(range(6))
        assert len(sub.transport._inbox.links) == 1
        assert sub.transport.stats()["links_in"] == 1
