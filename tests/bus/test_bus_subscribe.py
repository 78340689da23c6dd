"""Subscribing, what a handler receives, and the lineage of what it emits."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from bus import Bus, BusClosedError, Envelope, InProcessTransport, Priority, current_envelope
from bus._transport import BusPort


async def test_decorator_form_returns_the_handler_and_subscribes(bus: Bus) -> None:
    got: list[Envelope] = []

    @bus.on("orders.created")
    async def on_created(env: Envelope) -> None:
        got.append(env)

    assert callable(on_created)  # the decorator hands the function back, not a wrapper
    assert on_created.__name__ == "on_created"
    await bus.emit("orders.created", {"id": 1})
    await bus.drain()
    assert [e.payload for e in got] == [{"id": 1}]
    assert "test_decorator_form_returns_the_handler_and_subscribes.<locals>.on_created" in (
        bus.subscriptions()
    )


async def test_call_form_with_name_and_sync_handler(bus: Bus) -> None:
    got: list[str] = []

    def plain(env: Envelope) -> None:  # a plain function works as well as a coroutine
        got.append(env.topic)

    returned = bus.on("a.*", plain, name="plain")
    assert returned is plain
    assert set(bus.subscriptions()) == {"plain"}
    await bus.emit("a.one")
    await bus.emit("b.one")
    await bus.emit("a.two")
    await bus.drain()
    assert got == ["a.one", "a.two"]


async def test_async_callable_object_is_awaited(bus: Bus) -> None:
    class Handler:
        def __init__(self) -> None:
            self.seen: list[object] = []

        async def __call__(self, env: Envelope) -> None:
            self.seen.append(env.payload)

    h = Handler()
    bus.on("x", h, name="obj")
    await bus.emit("x", 7)
    await bus.drain()
    assert h.seen == [7]


async def test_emit_returns_the_envelope_the_handler_receives(bus: Bus) -> None:
    got: list[Envelope] = []
    bus.on("t", got.append, name="rec")
    sent = await bus.emit("t", "p", Priority.HIGH)
    await bus.drain()
    assert isinstance(sent, Envelope)
    assert got == [sent]
    assert got[0] is sent
    assert sent.topic == "t" and sent.payload == "p" and sent.priority == Priority.HIGH
    assert sent.causation_id is None and sent.hops == 0 and sent.source is None
    assert sent.correlation_id == sent.id


async def test_payload_is_passed_by_reference(bus: Bus) -> None:
    got: list[object] = []
    bus.on("t", lambda env: got.append(env.payload), name="a")
    bus.on(">", lambda env: got.append(env.payload), name="b")
    payload = {"big": list(range(1000))}
    await bus.emit("t", payload)
    await bus.drain()
    assert len(got) == 2
    assert all(p is payload for p in got)


async def test_session_id_is_stamped_on_outside_messages() -> None:
    async with Bus(session_id="s-1") as b:
        env = await b.emit("t")
    assert env.session_id == "s-1"


async def test_ids_are_unique() -> None:
    async with Bus() as b:
        ids = {(await b.emit("t")).id for _ in range(1000)}
    assert len(ids) == 1000


async def test_emits_inside_a_handler_carry_lineage(bus: Bus) -> None:
    got: dict[str, Envelope] = {}

    @bus.on("step.one", name="first")
    async def first(env: Envelope) -> None:
        got["one"] = env
        await bus.emit("step.two", env.payload + 1)

    @bus.on("step.two", name="second")
    async def second(env: Envelope) -> None:
        got["two"] = env
        await bus.emit("step.three", env.payload + 1, Priority.CRITICAL)

    @bus.on("step.three", name="third")
    async def third(env: Envelope) -> None:
        got["three"] = env

    root = await bus.emit("step.one", 1)
    await bus.drain()
    one, two, three = got["one"], got["two"], got["three"]
    assert one is root
    assert (two.causation_id, two.correlation_id, two.hops, two.source) == (
        root.id,
        root.id,
        1,
        "first",
    )
    assert (three.causation_id, three.correlation_id, three.hops, three.source) == (
        two.id,
        root.id,
        2,
        "second",
    )
    assert three.payload == 3 and three.priority == Priority.CRITICAL
    assert len({root.id, two.id, three.id}) == 3


async def test_session_id_follows_the_cause_not_the_bus() -> None:
    async with Bus(session_id="bus-session") as b:
        got: list[Envelope] = []
        b.on("child", got.append, name="rec")

        @b.on("parent", name="parent")
        async def parent(env: Envelope) -> None:
            await b.emit("child")

        await b.publish(Envelope.new("parent", session_id="replayed"))
        await b.drain()
    assert got[0].session_id == "replayed"


async def test_cause_links_an_emit_made_outside_a_handler(bus: Bus) -> None:
    got: list[Envelope] = []
    bus.on("later", got.append, name="rec")
    root = await bus.emit("first")
    child = await bus.emit("later", cause=root)
    grandchild = await bus.emit("later", cause=child)
    await bus.drain()
    assert got == [child, grandchild]
    assert (child.causation_id, child.correlation_id, child.hops) == (root.id, root.id, 1)
    assert (grandchild.causation_id, grandchild.correlation_id, grandchild.hops) == (
        child.id,
        root.id,
        2,
    )


async def test_explicit_cause_inside_a_handler_wins_but_source_is_the_handler(bus: Bus) -> None:
    other = await bus.emit("unrelated")
    got: list[Envelope] = []
    bus.on("out", got.append, name="rec")

    @bus.on("in", name="relay")
    async def relay(env: Envelope) -> None:
        await bus.emit("out", cause=other)

    await bus.emit("in")
    await bus.drain()
    assert got[0].causation_id == other.id
    assert got[0].correlation_id == other.correlation_id
    assert got[0].source == "relay"


async def test_current_envelope_inside_and_outside_handlers(bus: Bus) -> None:
    seen: list[Envelope | None] = []

    @bus.on("t", name="h")
    async def h(env: Envelope) -> None:
        seen.append(current_envelope())

    env = await bus.emit("t")
    await bus.drain()
    assert seen == [env]
    assert current_envelope() is None


async def test_subscribing_while_running_starts_workers(bus: Bus) -> None:
    await bus.emit("t")  # nobody listens yet: counted, not delivered
    got: list[object] = []
    bus.on("t", lambda env: got.append(env.payload), name="late")
    await bus.emit("t", "now")
    await bus.drain()
    assert got == ["now"]


async def test_duplicate_subscription_name_is_refused(bus: Bus) -> None:
    bus.on("a", lambda env: None, name="dup")
    with pytest.raises(ValueError, match="dup"):
        bus.on("b", lambda env: None, name="dup")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"max_queue": 0}, "max_queue"),
        ({"overflow": "drop"}, "overflow"),
        ({"sample_rate": 0.0}, "sample_rate"),
        ({"sample_rate": 1.5}, "sample_rate"),
    ],
)
async def test_invalid_subscription_options_are_refused(
    bus: Bus, options: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        bus.on("t", lambda env: None, name="bad", **options)
    assert "bad" not in bus.subscriptions()


async def test_off_handles_queued_messages_then_stops(bus: Bus, gate) -> None:
    g = gate()
    got: list[int] = []

    @bus.on("t", name="sub")
    async def sub(env: Envelope) -> None:
        await g.wait()
        got.append(env.payload)

    for i in range(3):
        await bus.emit("t", i)
    closing = asyncio.create_task(bus.off("sub"))
    await asyncio.sleep(0)  # off() has now removed the route and waits for the mailbox
    await bus.emit("t", 99)  # after off() began: no longer routed to "sub"
    g.open()
    await closing
    await bus.emit("t", 100)
    await bus.drain()
    assert got == [0, 1, 2]
    assert "sub" not in bus.subscriptions()
    with pytest.raises(KeyError):
        await bus.off("sub")


async def test_emit_before_start_and_after_close_raises() -> None:
    b = Bus()
    with pytest.raises(BusClosedError):
        await b.emit("t")
    await b.start()
    await b.emit("t")
    await b.aclose()
    with pytest.raises(BusClosedError):
        await b.emit("t")
    with pytest.raises(BusClosedError):
        await b.start()


async def test_a_plain_function_returning_a_coroutine_is_awaited(bus: Bus) -> None:
    # ``bus.on("t", lambda env: agent.handle(env))`` is the natural way to wire a method;
    # the coroutine it returns must run, not be dropped with a "never awaited" warning.
    got: list[object] = []

    async def handle(env: Envelope) -> str:
        got.append(env.payload)
        return f"handled {env.payload}"

    bus.on("t", lambda env: handle(env), name="wired")
    await bus.emit("t", 1)
    await bus.drain()
    assert await bus.request("t", 2, timeout=1.0) == "handled 2"
    await bus.drain()
    assert got == [1, 2]


async def test_emit_many_delivers_in_order_and_counts(bus: Bus) -> None:
    got: list[int] = []
    bus.on("t", lambda env: got.append(env.payload), name="rec")
    assert await bus.emit_many("t", range(100)) == 100
    await bus.drain()
    assert got == list(range(100))
    assert bus.stats().topics["t"].published == 100


async def test_emit_many_waits_on_backpressure(bus: Bus, gate, until) -> None:
    g = gate()
    got: list[int] = []

    @bus.on("t", name="slow", max_queue=2, block_timeout=5.0)
    async def slow(env: Envelope) -> None:
        await g.wait()
        got.append(env.payload)

    sending = asyncio.create_task(bus.emit_many("t", range(10)))
    await until(lambda: g.waiting == 1)
    for _ in range(20):
        await asyncio.sleep(0)
    assert not sending.done()
    g.open()
    assert await asyncio.wait_for(sending, 1.0) == 10
    await bus.drain()
    assert got == list(range(10))


class _SlowToSync(InProcessTransport):
    """A transport whose other buses learn of a subscription change only when told."""

    def __init__(self) -> None:
        super().__init__()
        self.known = asyncio.Event()
        self.port: BusPort | None = None

    async def start(self, port: BusPort) -> None:
        await super().start(port)
        self.port = port

    async def sync(self) -> None:
        await self.known.wait()


async def test_off_still_takes_what_others_route_to_it_until_they_know() -> None:
    transport = _SlowToSync()
    async with Bus(transport=transport) as bus:
        got: list[int] = []
        bus.on("t", lambda env: got.append(env.payload), name="w")
        assert transport.port is not None
        deliver = transport.port.deliver
        leaving = asyncio.create_task(bus.off("w"))
        await asyncio.sleep(0)  # off() has removed the local route and waits on sync()
        await bus.emit("t", 0)  # a local publish no longer reaches it...
        deliver(Envelope.new("t", 1), ["w"])  # ...but another bus's, routed by name, does,
        deliver(Envelope.new("t", 2), None)  # and so does one routed by pattern
        transport.known.set()
        await leaving
        deliver(Envelope.new("t", 3), ["w"])  # later still: dead-lettered, not dropped
        await bus.drain()
        assert got == [1, 2]
        [late] = bus.dlq.entries()
        assert (late.envelope.payload, late.subscriber, late.reason) == (3, "w", "unsubscribed")


@pytest.mark.parametrize("priority", [3, -1, 99])
async def test_an_out_of_range_priority_is_refused_before_anything_is_counted(
    bus: Bus, priority: int
) -> None:
    seen: list[object] = []
    bus.on("t", seen.append, name="sub")
    published: list[Envelope] = []
    bus.observe(SimpleNamespace(on_publish=published.append))
    with pytest.raises(ValueError, match="priority"):
        await bus.emit("t", 1, priority)
    with pytest.raises(ValueError, match="priority"):
        bus.emit_nowait("t", 1, priority)
    await bus.drain()
    stats = bus.stats()
    assert stats.published == 0
    assert stats.subscribers["sub"].published == 0
    assert published == [] and seen == [] and bus.outstanding == 0


async def test_a_handler_unsubscribing_itself_does_not_hang_drain(bus: Bus) -> None:
    seen: list[object] = []

    async def quit_on_stop(env: Envelope) -> None:
        seen.append(env.payload)
        if env.payload == "stop":
            await bus.off("quitter")

    bus.on("t", quit_on_stop, name="quitter")
    await bus.emit("t", 1)
    await bus.emit("t", "stop")
    async with asyncio.timeout(2):
        await bus.drain()
    assert seen == [1, "stop"]
    assert "quitter" not in bus.subscriptions()
    assert len(bus.dlq) == 0


async def test_a_handler_unsubscribing_itself_with_a_backlog_handles_it_then_stops(
    bus: Bus,
) -> None:
    # Found by benchmarks/accounting_fuzz.py (seed 1): off() from the handler waited for the
    # mailbox to empty, which only that handler's own worker could do: drain() hung and the
    # queued messages were never handled.
    seen: list[object] = []

    async def quit_on_stop(env: Envelope) -> None:
        seen.append(env.payload)
        if env.payload == "stop":
            await bus.off("quitter")

    bus.on("t", quit_on_stop, name="quitter")
    for payload in ("stop", 1, 2, 3):
        bus.emit_nowait("t", payload)  # queued behind "stop" before its handler runs
    async with asyncio.timeout(2):
        await bus.drain()
    assert seen == ["stop", 1, 2, 3]
    assert "quitter" not in bus.subscriptions()
    await bus.emit("t", "after")  # no longer routed
    assert seen == ["stop", 1, 2, 3]
    assert len(bus.dlq) == 0 and bus.outstanding == 0
