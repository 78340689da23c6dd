"""The accounting invariant, checked by a Hypothesis state machine.

For every subscription, at every step: ``published == delivered + dead_lettered + shed +
queued + in_flight``, and each shed or dead-lettered message is listed in the DLQ with its
reason. After a drain, ``queued`` and ``in_flight`` are zero, so the equality is strict.

Beyond the bus's own counters the machine keeps a model: the ids of the messages each
subscription accepted (matched, not refused, not filtered out). After a drain, the ids its
handler completed plus the ids listed for it in the DLQ are exactly that set, each once: no
message is lost, duplicated or delivered to the wrong subscriber.

The bus runs on a private event loop owned by the machine; each rule runs one coroutine to
completion on it, so between rules nothing moves and the counters can be read consistently.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
from collections import Counter
from types import SimpleNamespace
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bus import (
    BreakerPolicy,
    Bus,
    CircuitOpenError,
    Envelope,
    Priority,
    QueueFullError,
    Retry,
)
from bus.testing import FakeClock

TOPICS = ["a.x", "a.y", "b.x", "b.y"]


def declines(payload: int) -> bool:
    return payload % 5 == 0


def picky_filter(payload: int) -> bool:
    if payload % 7 == 0:
        raise ValueError(f"cannot judge {payload}")
    return not declines(payload)


class Behaviour:
    """A handler whose speed and failures the machine controls."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = 0
        self.completed: list[int] = []

    async def __call__(self, env: Envelope) -> None:
        await self.gate.wait()
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("told to fail")
        self.completed.append(env.id)


class Relay(Behaviour):
    """Emits a follow-up from inside its handler, so chains and lineage are exercised too."""

    def __init__(self, bus: Bus) -> None:
        super().__init__()
        self.bus = bus
        self.emitted: list[int] = []

    async def __call__(self, env: Envelope) -> None:
        await self.gate.wait()
        follow_up = await self.bus.emit("c.z", env.payload, env.priority)
        assert follow_up.causation_id == env.id and follow_up.source == "relay"
        self.emitted.append(follow_up.id)
        await super().__call__(env)


# name -> (pattern, options). Patterns are chosen so they never match the bus's own
# ``system.breaker.*`` events, which the model does not predict (the "watcher" counts them).
SUBSCRIPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "blocker": ("a.*", {"overflow": "block", "max_queue": 2, "block_timeout": 0.002}),
    "shedder": ("?.x", {"overflow": "shed", "max_queue": 2, "block_timeout": 0.002}),
    "rejecter": ("[ab].*", {"overflow": "reject", "max_queue": 3}),
    "picky": ("b.*", {"filter": picky_filter, "retry": Retry(attempts=2)}),
    "pool": (
        "[ab].?",
        {
            "concurrency": 3,
            "max_queue": 4,
            "overflow": "shed",
            "block_timeout": 0.002,
            "breaker": BreakerPolicy(consecutive_failures=2, cooldown=1.0),
        },
    ),
    "relay": ("a.y", {"retry": Retry(attempts=2)}),
    "sink": ("c.*", {"max_queue": 5, "overflow": "shed", "block_timeout": 0.002}),
}
#: Subscriptions whose accepted messages come from the emit rule (the sink's come from relay).
EMITTED_TO = [name for name in SUBSCRIPTIONS if name != "sink"]
NAMES = sorted(SUBSCRIPTIONS)


class BusMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.bus = Bus(clock=self.clock)
        self.behaviour: dict[str, Behaviour] = {}
        self.accepted: dict[str, list[int]] = {name: [] for name in NAMES}
        self.last_published: Envelope | None = None
        self.system_events = 0
        self.run(self._setup())

    async def _setup(self) -> None:
        await self.bus.start()
        for name in NAMES:
            pattern, options = SUBSCRIPTIONS[name]
            self.behaviour[name] = Relay(self.bus) if name == "relay" else Behaviour()
            self.bus.on(pattern, self.behaviour[name], name=name, **options)

        def watch(env: Envelope) -> None:
            self.system_events += 1

        self.bus.on("system.*", watch, name="watcher")
        self.bus.observe(SimpleNamespace(on_publish=self._published))

    def _published(self, env: Envelope) -> None:
        if env.topic in TOPICS:
            self.last_published = env

    def accepted_by(self, name: str) -> list[int]:
        if name == "sink":
            relay = self.behaviour["relay"]
            assert isinstance(relay, Relay)
            return relay.emitted
        return self.accepted[name]

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    # -- rules ------------------------------------------------------------------------------

    @rule(
        topic=st.sampled_from(TOPICS),
        priority=st.sampled_from(list(Priority)),
        payload=st.integers(min_value=1, max_value=100),
    )
    def emit(self, topic: str, priority: Priority, payload: int) -> None:
        self.last_published = None
        refused: set[str] = set()
        try:
            self.run(self.bus.emit(topic, payload, priority))
        except QueueFullError as exc:
            refused = set(exc.subscribers)
        except CircuitOpenError:
            assert self.last_published is None  # failed fast: nothing was published
            return
        env = self.last_published
        assert env is not None and env.payload == payload
        for name in EMITTED_TO:
            pattern, options = SUBSCRIPTIONS[name]
            if not fnmatch.fnmatchcase(topic, pattern) or name in refused:
                continue
            if "filter" in options and payload % 7 and declines(payload):
                continue
            self.accepted[name].append(env.id)

    @rule(name=st.sampled_from(NAMES))
    def fail_next_message(self, name: str) -> None:
        self.behaviour[name].fail_next += 1

    @rule(name=st.sampled_from(NAMES))
    def make_slow(self, name: str) -> None:
        self.behaviour[name].gate.clear()

    @rule(name=st.sampled_from(NAMES))
    def make_fast(self, name: str) -> None:
        self.behaviour[name].gate.set()

    @rule(turns=st.integers(min_value=1, max_value=30))
    def let_workers_run(self, turns: int) -> None:
        async def spin() -> None:
            for _ in range(turns):
                await asyncio.sleep(0)

        self.run(spin())

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0]))
    def advance_clock(self, seconds: float) -> None:
        self.run(self.clock.advance(seconds))

    @precondition(lambda self: len(self.bus.dlq) > 0)
    @rule()
    def redrive(self) -> None:
        # A full mailbox may refuse a redriven entry: it then stays listed, and counted.
        with contextlib.suppress(QueueFullError):
            self.run(self.bus.dlq.redrive())

    @rule()
    def drain(self) -> None:
        for b in self.behaviour.values():
            b.gate.set()
        self.run(self.bus.drain(timeout=5.0))
        self.check_drained()

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def every_message_is_accounted_for(self) -> None:
        stats = self.bus.stats().subscribers
        for name, s in stats.items():
            assert s.published == (
                s.delivered + s.dead_lettered + s.shed + s.queued + s.in_flight
            ), (name, s)
            listed = Counter(e.reason == "shed" for e in self.bus.dlq.entries(subscriber=name))
            assert listed[True] == s.shed, name
            assert listed[False] == s.dead_lettered, name
        for name in NAMES:
            assert len(self.behaviour[name].completed) == stats[name].delivered, name
        assert stats["watcher"].published == self.system_events + (
            stats["watcher"].queued + stats["watcher"].in_flight
        )

    @invariant()
    def nothing_is_handled_twice_or_unasked(self) -> None:
        for name in NAMES:
            handled = self.behaviour[name].completed
            listed = [e.envelope.id for e in self.bus.dlq.entries(subscriber=name)]
            assert len(set(handled)) == len(handled), name
            assert not set(handled) & set(listed), name
            assert set(handled) | set(listed) <= set(self.accepted_by(name)), name

    def check_drained(self) -> None:
        stats = self.bus.stats().subscribers
        for name, s in stats.items():
            assert s.queued == 0 and s.in_flight == 0, name
            assert s.published == s.delivered + s.dead_lettered + s.shed, (name, s)
        for name in NAMES:
            listed = [e.envelope.id for e in self.bus.dlq.entries(subscriber=name)]
            ended = Counter(self.behaviour[name].completed) + Counter(listed)
            assert ended == Counter(self.accepted_by(name)), name
        assert self.bus.outstanding == 0

    def teardown(self) -> None:
        try:
            for b in self.behaviour.values():
                b.gate.set()
            self.run(self.bus.aclose(drain=True, timeout=5.0))
            assert not self.bus.dlq.entries(reason="bus_closed")
            self.check_drained()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()


BusMachine.TestCase.settings = settings(max_examples=250, stateful_step_count=35, deadline=None)
TestBusInvariant = BusMachine.TestCase
