"""What a NATS takeover rests on, below the runtime: a group fed from the stream alone
(``fed_remotely``), each message observed once per bus, and what a handler emits again for
the same message stored once."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from nats_helpers import eventually

from bus import Bus, Envelope
from bus.backends.nats import NatsServer, NatsTransport
from bus.backends.nats._consumers import Consumers


class Published:
    """A publish observer: every envelope id its bus shows its observers."""

    def __init__(self) -> None:
        self.ids: Counter[int] = Counter()

    def on_publish(self, env: Envelope) -> None:
        self.ids[env.id] += 1


async def test_a_fed_group_takes_even_its_own_bus_s_messages_from_the_stream(
    server: NatsServer,
) -> None:
    """``worker`` runs on two buses, fed from the stream on both: a message published on
    one is not handed to its own member in memory but shared through the stream like any
    other. Each is handled once in all, and each bus shows each message to its observers
    once, also the ones it published and took back (``looped``)."""
    a = NatsTransport(server.url, team="fed", node="a", fed_remotely=["worker", "audit"])
    b = NatsTransport(server.url, team="fed", node="b", fed_remotely=["worker"])
    handled: dict[str, list[int]] = {"a": [], "b": []}
    seen_a = Published()
    async with Bus(transport=a) as bus_a, Bus(transport=b) as bus_b:
        bus_a.observe(seen_a)
        # Two groups on bus a match jobs.*: a message that reaches both is observed once.
        bus_a.on("jobs.*", lambda env: handled["a"].append(env.payload), name="worker")
        bus_a.on("jobs.*", lambda env: None, name="audit")
        bus_b.on("jobs.*", lambda env: handled["b"].append(env.payload), name="worker")
        await a.sync()
        await b.sync()
        await eventually(lambda: a.has_remote("jobs.new") and b.has_remote("jobs.new"))
        sent = [await bus_a.emit("jobs.new", n) for n in range(40)]
        await eventually(lambda: len(handled["a"]) + len(handled["b"]) >= 40)
        await bus_a.drain(timeout=20)
        stats = a.stats()
    assert sorted(handled["a"] + handled["b"]) == list(range(40))
    # Nothing was handed over in memory: what a's own member handled came through the
    # stream, each message twice to a (worker when a took it, audit always).
    assert stats["looped"] == len(handled["a"]) + 40 and stats["received"] == 0
    assert all(seen_a.ids[env.id] == 1 for env in sent)


async def test_what_a_handler_emits_again_for_the_same_message_is_stored_once(
    server: NatsServer,
) -> None:
    """A member that handles a message another member already handled (it died before
    its ack arrived) emits the same messages again; they are named after their cause,
    emitter and ordinal (``Nats-Msg-Id``), so the stream keeps the first of each and the
    team downstream sees every outcome once. A further emit of the same handling is new."""
    one = NatsTransport(server.url, team="rehandle", node="one")
    two = NatsTransport(server.url, team="rehandle", node="two")
    sink = NatsTransport(server.url, team="rehandle", node="sink")
    got: list[object] = []
    # The message both members handled (its id and handler, as a redelivery carries them).
    cause = Envelope("orders.new", {"order": 7}, id=424242, correlation_id=424242, source="bill")
    async with (
        Bus(transport=one) as bus_one,
        Bus(transport=two) as bus_two,
        Bus(transport=sink) as bus_sink,
    ):
        bus_sink.on("orders.billed", lambda env: got.append(env.payload), name="ship")
        await sink.sync()
        await eventually(lambda: one.has_remote("orders.billed"))
        await eventually(lambda: two.has_remote("orders.billed"))
        await bus_one.emit("orders.billed", "first outcome", cause=cause)
        await bus_one.drain(timeout=20)
        await bus_two.emit("orders.billed", "the same, handled again", cause=cause)
        await bus_two.drain(timeout=20)
        await bus_one.emit("orders.billed", "a second outcome", cause=cause)
        await bus_one.drain(timeout=20)
        await eventually(lambda: len(got) >= 2)
        await bus_sink.drain(timeout=20)
    assert got == ["first outcome", "a second outcome"]
    assert two.stats()["duplicates"] == 1
    assert one.stats()["duplicates"] == 0


def warm_trio(server: NatsServer, team: str) -> tuple[NatsTransport, ...]:
    """A publisher, and ``worker``'s group on ``primary`` and, warm behind it, ``standby``."""
    return (
        NatsTransport(server.url, team=team, node="pub"),
        NatsTransport(server.url, team=team, node="primary", fed_remotely=["worker"]),
        NatsTransport(
            server.url, team=team, node="standby", fed_remotely=["worker"],
            warm={"worker": ["primary"]},
        ),
    )  # fmt: skip


async def test_a_warm_standby_pulls_nothing_until_the_node_ahead_of_it_is_gone(
    server: NatsServer,
) -> None:
    """``worker`` on ``primary`` and, warm, on ``standby``: while the primary is in the
    directory the standby takes no share (one instance keeps the state, as in one process);
    once it closes (its entry gone; a silent one leaves after ``heartbeat * liveness``), the
    standby pulls what is published next. Its other, ordinary group pulls throughout."""
    pub, primary, standby = warm_trio(server, "warm")
    handled: dict[str, list[int]] = {"primary": [], "standby": [], "audit": []}
    async with Bus(transport=pub) as bus_pub, Bus(transport=standby) as bus_standby:
        bus_standby.on("jobs.*", lambda env: handled["standby"].append(env.payload), name="worker")
        bus_standby.on("jobs.*", lambda env: handled["audit"].append(env.payload), name="audit")
        await standby.sync()
        # Alone so far: nobody is ahead of it, so it pulls.
        assert standby.stats()["standing_by"] == []
        async with Bus(transport=primary) as bus_primary:
            bus_primary.on(
                "jobs.*", lambda env: handled["primary"].append(env.payload), name="worker"
            )
            await primary.sync()
            await eventually(lambda: standby.stats()["standing_by"] == ["worker"])
            await eventually(lambda: pub.has_remote("jobs.new"))
            for n in range(40):
                await bus_pub.emit("jobs.new", n)
            await eventually(lambda: len(handled["primary"]) == 40 and len(handled["audit"]) == 40)
            await bus_pub.drain(timeout=20)
        assert (handled["primary"], handled["standby"]) == (list(range(40)), [])
        await eventually(lambda: standby.stats()["standing_by"] == [])
        for n in range(40, 60):
            await bus_pub.emit("jobs.new", n)
        await eventually(lambda: len(handled["standby"]) == 20)
        await bus_pub.drain(timeout=20)
    assert handled["standby"] == list(range(40, 60)) and handled["audit"] == list(range(60))


async def test_a_warm_standby_sees_its_primary_appear_while_it_opens_its_group(
    server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The standby works out "nobody ahead of me" and then opens its group (a consumer per
    lane: round trips); the primary's entry arrives meanwhile, when the group is in no list
    a directory change goes through. Once opened, it must still stand by."""
    pub, primary, standby = warm_trio(server, "race")
    opened = Consumers.open_group
    gate = asyncio.Event()

    async def slow_open(self: Consumers, name: str, pattern: str, passive: bool = False) -> Any:
        if self.node == "standby":
            await gate.wait()  # a slow add_consumer round trip
        return await opened(self, name, pattern, passive)

    monkeypatch.setattr(Consumers, "open_group", slow_open)
    handled: dict[str, list[int]] = {"primary": [], "standby": []}
    async with (
        Bus(transport=pub) as bus_pub,
        Bus(transport=standby) as bus_standby,
        Bus(transport=primary) as bus_primary,
    ):
        bus_standby.on("jobs.*", lambda env: handled["standby"].append(env.payload), name="worker")
        bus_primary.on("jobs.*", lambda env: handled["primary"].append(env.payload), name="worker")
        await primary.sync()
        await eventually(lambda: ("worker", "jobs.*") in getattr(
            standby._directory.others.get("primary"), "subs", ()
        ))  # fmt: skip
        gate.set()
        await standby.sync()
        assert standby.stats()["standing_by"] == ["worker"]
        await eventually(lambda: pub.has_remote("jobs.new"))
        for n in range(40):
            await bus_pub.emit("jobs.new", n)
        await eventually(lambda: len(handled["primary"]) == 40)
        await bus_pub.drain(timeout=20)
    assert handled == {"primary": list(range(40)), "standby": []}
