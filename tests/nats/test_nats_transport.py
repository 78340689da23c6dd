"""What the NATS transport adds beyond the contract suite: request/reply over inboxes, the
directory in a key-value bucket, publish dedup by Nats-Msg-Id, topics NATS cannot carry."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from nats_helpers import eventually

from bus import Bus, EncodeError, Envelope, NoRouteError
from bus.backends.nats import NatsServer, NatsTransport, RemoteHandlerError


async def test_request_reply_over_an_inbox(server: NatsServer) -> None:
    opts = {"team": "rr", "max_deliver": 2, "backoff": (0.01, 0.05)}
    async with (
        Bus(transport=NatsTransport(server.url, **opts)) as asker,
        Bus(transport=NatsTransport(server.url, **opts)) as answerer,
    ):

        @answerer.on("math.double", name="doubler")
        async def double(env: Envelope) -> int:
            if env.payload < 0:
                raise ValueError(f"negative: {env.payload}")
            return int(env.payload) * 2

        await answerer.transport.sync()
        await eventually(lambda: asker.transport.has_remote("math.double"))
        assert await asker.request("math.double", 21, timeout=5) == 42
        with pytest.raises(RemoteHandlerError) as failed:
            await asker.request("math.double", -1, timeout=5)
        assert failed.value.error_type == "ValueError" and failed.value.topic == "math.double"
        assert "negative: -1" in str(failed.value)
        with pytest.raises(NoRouteError):
            await asker.request("math.nobody", 1, timeout=1)
        stats = asker.transport.stats()  # type: ignore[attr-defined]
        assert stats["replies_received"] >= 1


async def test_the_directory_is_a_key_value_bucket(server: NatsServer) -> None:
    """Each node's subscriptions are its entry in ``pantheon_nodes_<team>``, under its bus's
    session (``_`` for none); a closing node deletes it and the others stop routing to it."""
    a = NatsTransport(server.url, team="dir", node="alpha")
    b = NatsTransport(server.url, team="dir", node="beta")
    async with Bus(transport=a) as bus_a, Bus(transport=b) as bus_b:
        bus_b.on("orders.*", lambda env: None, name="orders")
        await b.sync()
        nc = await nats.connect(server.url)
        try:
            kv = await nc.jetstream().key_value("pantheon_nodes_dir")
            assert sorted(await kv.keys()) == ["_.alpha", "_.beta"]
            entry = await kv.get("_.beta")
            assert b"orders.*" in (entry.value or b"")
            assert a.stats()["peers"] == ["beta"] and a.has_remote("orders.new")
            await bus_b.aclose()
            await eventually(lambda: not a.has_remote("orders.new"))
            assert a.stats()["peers"] == []
            assert await kv.keys() == ["_.alpha"]
        finally:
            await nc.close()
        assert bus_a.transport is a


async def test_sync_ends_after_a_starved_node_forgot_a_peer_it_hears_again(
    server: NatsServer,
) -> None:
    """A loop starved past ``heartbeat * liveness`` forgets its peers while their refreshes
    wait in its queue; it hears them again a beat later. The peer never forgot it and has
    no new version to confirm, so ``sync`` must still count its earlier confirmation (it
    once waited for good: a run hung at start-up on a loaded machine)."""
    a = NatsTransport(server.url, team="lapse", node="alpha", heartbeat=0.2)
    b = NatsTransport(server.url, team="lapse", node="beta", heartbeat=0.2)
    async with Bus(transport=a) as bus_a, Bus(transport=b):
        bus_a.on("orders.*", lambda env: None, name="orders")
        async with asyncio.timeout(10):
            await a.sync()
        assert a.stats()["peers"] == ["beta"]
        # What the first tick after the stall does: every peer looks silent.
        a._directory.expire(time.monotonic() + 60, 0.6)
        assert a.stats()["peers"] == []
        await eventually(lambda: a.stats()["peers"] == ["beta"])
        async with asyncio.timeout(10):
            await a.sync()


async def test_a_publish_repeated_with_the_same_id_is_stored_once(server: NatsServer) -> None:
    async with (
        Bus(transport=NatsTransport(server.url, team="dedup")) as pub,
        Bus(transport=NatsTransport(server.url, team="dedup")) as sub,
    ):
        got: list[object] = []
        sub.on("t", lambda env: got.append(env.payload), name="t")
        await sub.transport.sync()
        await eventually(lambda: pub.transport.has_remote("t"))
        env = Envelope.new("t", "once")
        await pub.transport.send(env)
        await pub.transport.send(env)  # as a resend after a lost stream ack would
        await pub.emit("t", "marker")
        await eventually(lambda: "marker" in got)
        await pub.drain(timeout=5)
        assert got == ["once", "marker"]
        assert pub.transport.stats()["duplicates"] == 1  # type: ignore[attr-defined]


async def test_what_nats_cannot_carry_is_refused_at_publish(server: NatsServer) -> None:
    async with (
        Bus(transport=NatsTransport(server.url, team="bad")) as pub,
        Bus(transport=NatsTransport(server.url, team="bad")) as sub,
    ):
        sub.on(">", lambda env: None, name="all")
        await sub.transport.sync()
        await eventually(lambda: pub.transport.has_remote("ok"))
        with pytest.raises(EncodeError, match="cannot be a NATS subject"):
            await pub.emit("has space", 1)
        with pytest.raises(EncodeError, match="not msgpack-encodable"):
            await pub.emit("ok", object())
        with pytest.raises(EncodeError, match="max_payload"):
            await pub.emit("ok", "x" * 2_000_000)
