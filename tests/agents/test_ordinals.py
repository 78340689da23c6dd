"""Input numbers carried in ids (``agents.InputOrdinals``, ``agents.input_ordinal``): what a
``messages`` fault window reads in any process, and what an id-less payload's fault draw is
keyed by."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agents import (
    Agent,
    AgentOptions,
    Fault,
    FaultMark,
    InputItem,
    InputOrdinals,
    Observer,
    input_ordinal,
)
from agents._ordinals import MAX_ORDINAL
from bus import Bus, Envelope, Retry


def test_inputs_are_numbered_per_topic_and_read_back_from_their_ids() -> None:
    ordinals = InputOrdinals()
    emails = [ordinals.stamp("email") for _ in range(3)]
    malformed = [ordinals.stamp("malformed") for _ in range(2)]
    assert None not in emails and None not in malformed
    assert [input_ordinal(i) for i in emails if i is not None] == [0, 1, 2]
    assert [input_ordinal(i) for i in malformed if i is not None] == [0, 1]
    # Unique, across topics and across streams (another run, another process), as ids
    # must be: the ZeroMQ and NATS duplicate filters drop a repeated one.
    other = InputOrdinals()
    again = [other.stamp("email") for _ in range(3)]
    assert len(set(emails) | set(malformed) | set(again)) == 8
    # The number survives SQLite's signed storage of an id's top half.
    for i in emails:
        assert i is not None
        wrapped = i - 2**64 if i > 2**63 - 1 else i
        assert input_ordinal(wrapped) == input_ordinal(i)


def test_an_ordinary_id_carries_no_number() -> None:
    assert input_ordinal(Envelope.new("t").id) is None
    assert all(input_ordinal(Envelope.new("t").correlation_id) is None for _ in range(1000))


def test_a_given_number_is_kept_and_the_next_ones_follow_it() -> None:
    ordinals = InputOrdinals()
    assert input_ordinal(ordinals.stamp("t", 41) or 0) == 41
    assert input_ordinal(ordinals.stamp("t") or 0) == 42
    assert input_ordinal(ordinals.stamp("t", 7) or 0) == 7  # an earlier one: no going back
    assert input_ordinal(ordinals.stamp("t") or 0) == 43
    # A number given twice (two Observers' inputs on one topic, re-run): two ids.
    twice = {ordinals.stamp("t", 42), ordinals.stamp("t", 42)}
    assert len(twice) == 2 and {input_ordinal(i or 0) for i in twice} == {42}
    assert ordinals.stamp("t", MAX_ORDINAL + 1) is None  # past what an id holds
    assert ordinals.stamp("t", -1) is None


async def _items(*topics: str) -> AsyncIterator[InputItem]:
    for n, topic in enumerate(topics):
        yield InputItem(topic, {"n": n})


async def test_an_observer_s_inputs_and_all_they_cause_carry_their_number() -> None:
    seen: list[tuple[str, int | None]] = []
    async with Bus() as bus:

        async def relay(env: Envelope) -> None:
            await bus.emit("relayed", env.payload)

        bus.on("in.*", relay, name="relay")
        bus.on("relayed", lambda env: seen.append((env.payload["n"], env.correlation_id)))
        observer = Observer(source=_items("in.a", "in.b", "in.a", "in.a", "in.b"))
        await observer.attach(bus)
        await observer.start()
        await observer.done.wait()
        await bus.drain()
    by_n = {n: input_ordinal(cid) for n, cid in seen}
    assert by_n == {0: 0, 1: 0, 2: 1, 3: 2, 4: 1}  # per topic, in publish order


class _Windowed(Agent):
    subscriptions = ("work",)

    def __init__(self, **kw: Any) -> None:
        super().__init__("w", **kw)
        self.handled: list[Any] = []

    async def handle(self, env: Envelope) -> None:
        self.handled.append(env.payload)


async def test_the_window_is_the_input_s_number_not_when_this_process_saw_it() -> None:
    """Messages caused by inputs 0..5, handled in reverse order by an agent that never
    saw the inputs published (as on a node): always-failing inside ``until: 3`` means
    exactly the messages of inputs 0, 1 and 2 fail, whatever order they come in; a message
    of no input stands past the latest input the agent has seen."""
    ordinals = InputOrdinals()
    ids = [ordinals.stamp("in") or 0 for _ in range(6)]
    fault = Fault(failure_rate=1.0, until=FaultMark(messages=3))
    agent = _Windowed(fault=fault, options=AgentOptions(retry=Retry(attempts=1), breaker=None))
    async with Bus() as bus:
        await agent.attach(bus)
        for n in reversed(range(6)):
            cause = Envelope("in", {"n": n}, id=ids[n], correlation_id=ids[n])
            await bus.emit("work", {"n": n}, cause=cause)
        await bus.drain()
        # Input 5 was the latest seen: a sample of no input stands at 6, outside.
        await bus.emit("work", {"n": 99})
        await bus.drain()
        failed = sorted(d.envelope.payload["n"] for d in bus.dlq.entries())
    assert failed == [0, 1, 2]
    assert sorted(p["n"] for p in agent.handled) == [3, 4, 5, 99]


async def test_an_id_less_payload_fails_the_same_messages_on_every_run() -> None:
    """The draw of a payload with no id is keyed by its input's number and hop, never by
    its envelope id (random per process): two runs with the same seed and fresh ids fail
    the same messages."""

    async def failures() -> list[int]:
        ordinals = InputOrdinals()
        agent = _Windowed(
            fault=Fault(failure_rate=0.5),
            seed=7,
            options=AgentOptions(retry=Retry(attempts=1), breaker=None),
        )
        async with Bus() as bus:
            await agent.attach(bus)
            for n in range(40):
                i = ordinals.stamp("in") or 0
                cause = Envelope("in", None, id=i, correlation_id=i)
                await bus.emit("work", [n], cause=cause)
            await bus.drain()
            return sorted(d.envelope.payload[0] for d in bus.dlq.entries())

    first = await failures()
    assert 0 < len(first) < 40
    assert await failures() == first
