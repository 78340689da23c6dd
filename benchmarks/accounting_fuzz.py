"""Random workloads against the in-process bus: is every published message accounted once?

Each seed builds a bus with a dozen subscriptions covering every way a message can end
(handled; dead-lettered as ``failed``, ``filter_error`` or ``circuit_open``; declined by a
filter or sampled out; shed; refused by a ``reject`` or a timed-out ``block`` mailbox), then
runs a seeded random sequence of operations on it: ``emit``, ``emit_nowait``, bursts of
concurrent emits, ``request``, ``dlq.redrive()``, ``off()`` and ``on()`` of subscriptions
mid-run (one handler even unsubscribes itself), forced breakers, slow handlers, retries
with backoff on a fake clock, and chains of messages emitted from inside handlers.

The ledger is kept from the outside, through the public API only (``emit``,
``emit_nowait``, ``request``, ``on``, ``off``, ``drain``, ``stats``, ``dlq``, ``breaker``),
so it holds whatever the bus's internals look like. Every message carries a unique serial
as its payload. For each subscription the ledger knows which serials were offered to it
(the topic matched while it was subscribed), which its handler completed, which its
filter declined and which an emit was refused for; the DLQ says which ended there. After
a final drain, per subscription:

* nothing ended twice or was never offered: ``handled + dead-lettered + declined +
  refused`` is a sub-multiset of ``offered``;
* what is left unaccounted by serial is exactly what the bus says it sampled out or shed
  without listing (``filtered - declined``, ``shed - shed entries listed``);
* a message taken back from the DLQ by ``redrive()`` ends visibly again: it is never
  sampled out (it was chosen once already);
* the bus's own equation holds: ``published == delivered + dead_lettered + shed`` (and,
  between steps mid-run, every tenth, ``+ queued + in_flight``).

Anything else is an unaccounted message, and a drain that does not finish is a hang.

Run: ``python benchmarks/accounting_fuzz.py --seeds 200`` (exit 1 on any unaccounted
message; ``--json FILE`` writes the per-seed figures). tests/bus/test_bus_accounting_fuzz.py
runs a few seeds of the same workload in the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bus import (
    BreakerPolicy,
    Bus,
    CircuitOpenError,
    Envelope,
    NoRouteError,
    Priority,
    QueueFullError,
    RequestTimeout,
    Retry,
    matches,
)
from bus.testing import FakeClock

#: The ledger decides who was offered what with the bus's own public ``matches``.
TOPICS = ["a.x", "a.y", "b.x", "b.y", "r.q", "a.b.x"]
CHAIN_TOPIC = "c.z"
#: The bus's breaker reports (``system.breaker.<subscription>``, and a publisher breaker's
#: ``system.breaker.publish:a.x``, four tokens); only the watcher takes them: the other
#: patterns start with a literal other than ``system`` or have two tokens.
SYSTEM_PATTERNS = {"watcher": "system.breaker.>"}


class Failed(Exception):
    """What the fuzz's handlers raise when told to fail."""


@dataclass
class Spec:
    """One subscription: its pattern, options, and how its handler behaves."""

    name: str
    pattern: str
    options: dict[str, Any]
    kind: str = "ok"  # ok | flaky | poison | relay | answer | slow | quitter
    filtered: bool = False


@dataclass
class Sub:
    """The ledger of one subscription, kept from the outside."""

    spec: Spec
    active: bool = True
    offered: Counter[int] = field(default_factory=Counter)
    handled: Counter[int] = field(default_factory=Counter)
    declined: Counter[int] = field(default_factory=Counter)
    refused: Counter[int] = field(default_factory=Counter)
    redriven: Counter[int] = field(default_factory=Counter)
    calls: Counter[int] = field(default_factory=Counter)
    final: Any = None  # its stats, kept when it unsubscribed (stats() forgets it then)


def base_specs() -> list[Spec]:
    """The fixed subscriptions of every seed; the seed picks their options' numbers."""
    return [
        Spec("plain", "a.*", {}),
        Spec(
            "shedder",
            "*.x",
            # Only CRITICAL waiting: a CRITICAL newcomer blocks (never shed) this long.
            {"overflow": "shed", "max_queue": 3, "block_timeout": 0.002},
            kind="slow",
        ),
        Spec("rejecter", "b.*", {"overflow": "reject", "max_queue": 2}, kind="slow"),
        Spec(
            "blocker",
            "*.y",
            {"overflow": "block", "max_queue": 2, "block_timeout": 0.002},
            kind="slow",
        ),
        Spec(
            "sampled",
            "*.x",
            {"sample_rate": 0.5, "filter": True, "retry": Retry(attempts=2)},
            kind="flaky",
            filtered=True,
        ),
        Spec(
            "wild_breaker",
            "*.y",
            {
                "breaker": BreakerPolicy(consecutive_failures=2, cooldown=1.0, probe_timeout=2.0),
                "retry": Retry(attempts=2, backoff=0.5),
                "concurrency": 2,
            },
            kind="flaky",
        ),
        Spec("poisoned", "a.>", {"retry": Retry(attempts=3, backoff=0.25)}, kind="poison"),
        Spec("relay", "a.y", {"retry": Retry(attempts=2)}, kind="relay"),
        Spec(
            "sink",
            CHAIN_TOPIC,
            {"overflow": "shed", "max_queue": 4, "block_timeout": 0.002},
            kind="slow",
        ),
        Spec("answerer", "r.q", {"concurrency": 2}, kind="answer"),
        Spec(
            "asker_breaker",
            "*.q",
            {"breaker": BreakerPolicy(consecutive_failures=1, cooldown=0.5)},
            kind="flaky",
        ),
        Spec("quitter", "b.x", {}, kind="quitter"),
    ]


def dynamic_spec(n: int, rng: random.Random) -> Spec:
    """A subscription added mid-run (and perhaps removed again)."""
    pattern = rng.choice(["a.*", "a.>", "*.x", "b.y", "*.y"])
    options: dict[str, Any] = {
        "overflow": rng.choice(["block", "shed", "reject"]),
        "max_queue": rng.randint(1, 4),
        "block_timeout": 0.002,
    }
    kind = rng.choice(["ok", "flaky", "slow"])
    filtered = rng.random() < 0.3
    if filtered:
        options["filter"] = True
    if rng.random() < 0.3:
        options["sample_rate"] = rng.choice([0.25, 0.5, 0.75])
    if rng.random() < 0.5:
        options["retry"] = Retry(attempts=rng.randint(1, 3))
    return Spec(f"dyn{n}", pattern, options, kind=kind, filtered=filtered)


class Workload:
    """One seed: a bus, its subscriptions, the ledger, and the random operations."""

    def __init__(self, seed: int, steps: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.steps = steps
        self.clock = FakeClock()
        # Publisher breakers too: refused and timed-out emits trip them, and an open one
        # fails an emit fast (CircuitOpenError, nothing published).
        self.bus = Bus(
            clock=self.clock, publisher_breaker=BreakerPolicy(consecutive_failures=2, cooldown=1.0)
        )
        self.subs: dict[str, Sub] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.serial = 0
        self.dynamic = 0
        self.system_seen: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()
        self.midrun: list[str] = []
        self.quit_at = self.rng.randint(5, 60)
        self.flaky_every = self.rng.choice([2, 3, 5])
        self.poison_every = self.rng.choice([4, 7, 11])

    # -- the ledger's side of publishing --------------------------------------------------------

    def _next_serial(self) -> int:
        self.serial += 1
        return self.serial

    def _offer(self, topic: str, serial: int) -> list[Sub]:
        """Record ``serial`` as offered to every subscription matching now; returns them."""
        matched = [s for s in self.subs.values() if s.active and matches(s.spec.pattern, topic)]
        for s in matched:
            s.offered[serial] += 1
        return matched

    def _refused(self, exc: QueueFullError, serial: int) -> None:
        for name in exc.subscribers:
            self.subs[name].refused[serial] += 1

    async def publish(self, how: str, topic: str, priority: Priority) -> None:
        """Publish one message ``how`` (emit, nowait, request), ledger first: the bus routes
        synchronously when called, so the subscriptions active now are the ones offered it."""
        serial = self._next_serial()
        # A publisher breaker or a request with no route publishes nothing: undo then.
        snapshot = {name: s.offered[serial] for name, s in self.subs.items()}
        self._offer(topic, serial)
        try:
            if how == "emit":
                await self.bus.emit(topic, serial, priority)
            elif how == "nowait":
                self.bus.emit_nowait(topic, serial, priority)
            else:
                await self.bus.request(topic, serial, timeout=0.02, priority=priority)
        except QueueFullError as exc:
            self._refused(exc, serial)
        except CircuitOpenError as exc:
            # The topic's publisher breaker fails fast before publishing; any other breaker
            # is a subscription's, which dead-lettered a request (published) as circuit_open.
            if exc.name.startswith("publish:"):
                self.ops["failed fast"] += 1
                self._unoffer(serial, snapshot)
        except NoRouteError:
            self._unoffer(serial, snapshot)
        except (RequestTimeout, Failed):
            pass  # the request itself was published and is accounted as any other

    def _unoffer(self, serial: int, snapshot: dict[str, int]) -> None:
        for name, s in self.subs.items():
            s.offered[serial] = snapshot.get(name, 0)

    # -- handlers ---------------------------------------------------------------------------

    def handler(self, spec: Spec) -> Callable[[Envelope], Any]:
        gate = self.gates.setdefault(spec.name, asyncio.Event())
        gate.set()

        async def handle(env: Envelope) -> Any:
            sub = self.subs[spec.name]
            serial = env.payload
            if not isinstance(serial, int):
                raise AssertionError(f"{spec.name} got a foreign payload {serial!r}")
            sub.calls[serial] += 1
            attempt = sub.calls[serial]
            if spec.kind == "slow":
                await gate.wait()
            elif spec.kind == "flaky" and (serial + attempt) % self.flaky_every == 0:
                raise Failed(f"{spec.name} fails {serial} on attempt {attempt}")
            elif spec.kind == "poison" and serial % self.poison_every == 0:
                raise Failed(f"{serial} is poison")
            elif spec.kind == "relay":
                await self.publish("emit", CHAIN_TOPIC, Priority(env.priority))
            elif spec.kind == "quitter" and serial >= self.quit_at and sub.active:
                # A handler that unsubscribes its own subscription (must not hang drain).
                sub.active = False
                sub.final = self.bus.stats().subscribers[spec.name]
                await self.bus.off(spec.name)
            sub.handled[serial] += 1
            return serial + 1 if spec.kind == "answer" else None

        return handle

    def subscribe(self, spec: Spec) -> None:
        options = dict(spec.options)
        if spec.filtered:
            sub_name = spec.name

            def keep(payload: Any) -> bool:
                if payload % 13 == 0:
                    raise ValueError(f"cannot judge {payload}")  # filter_error
                if payload % 5 == 0:
                    self.subs[sub_name].declined[payload] += 1
                    return False
                return True

            options["filter"] = keep
        self.subs[spec.name] = Sub(spec)
        self.bus.on(spec.pattern, self.handler(spec), name=spec.name, **options)

    def watch_system(self) -> None:
        for name, pattern in SYSTEM_PATTERNS.items():

            def watch(env: Envelope, name: str = name) -> None:
                self.system_seen[name] += 1

            self.bus.on(pattern, watch, name=name, max_queue=1_000_000)

    # -- operations -------------------------------------------------------------------------

    async def step(self) -> None:
        rng = self.rng
        op = rng.choices(
            [
                "emit",
                "nowait",
                "burst",
                "request",
                "slow",
                "fast",
                "spin",
                "clock",
                "redrive",
                "off",
                "on",
                "breaker",
                "drain",
            ],
            weights=[30, 15, 6, 5, 5, 5, 8, 5, 5, 2, 2, 2, 2],
        )[0]
        self.ops[op] += 1
        priority = rng.choice(list(Priority))
        if op in ("emit", "nowait"):
            await self.publish(op, rng.choice(TOPICS), priority)
        elif op == "burst":
            n = rng.randint(2, 8)
            await asyncio.gather(
                *(
                    self.publish("emit", rng.choice(TOPICS), rng.choice(list(Priority)))
                    for _ in range(n)
                )
            )
        elif op == "request":
            await self.publish("request", "r.q", priority)
        elif op == "slow":
            self.gates[rng.choice(sorted(self.gates))].clear()
        elif op == "fast":
            self.gates[rng.choice(sorted(self.gates))].set()
        elif op == "spin":
            for _ in range(rng.randint(1, 20)):
                await asyncio.sleep(0)
        elif op == "clock":
            await self.clock.advance(rng.choice([0.25, 0.5, 1.0, 2.5]))
        elif op == "redrive":
            await self.redrive(all_of_them=rng.random() < 0.5)
        elif op == "off":
            live = sorted(n for n, s in self.subs.items() if s.active and n.startswith("dyn"))
            if live:
                name = rng.choice(live)
                sub = self.subs[name]
                sub.active = False
                sub.final = self.bus.stats().subscribers[name]
                self.gates[name].set()  # off() waits for its queue to be handled
                await self.bus.off(name)
        elif op == "on":
            self.dynamic += 1
            self.subscribe(dynamic_spec(self.dynamic, rng))
        elif op == "breaker":
            name = rng.choice(["wild_breaker", "asker_breaker", "plain"])
            breaker = self.bus.breaker(name)
            if rng.random() < 0.5:
                breaker.force_open("fuzz")
            else:
                breaker.reset("fuzz")
        elif op == "drain":
            await self.settle()

    async def redrive(self, all_of_them: bool) -> None:
        entries = self.bus.dlq.entries()
        if not entries:
            return
        chosen = entries if all_of_them else self.rng.sample(entries, k=(len(entries) + 1) // 2)
        before = {e.entry_id: e for e in chosen}
        with contextlib.suppress(QueueFullError):
            # A full mailbox refuses a redriven entry: it then stays listed.
            await self.bus.dlq.redrive([e.entry_id for e in chosen])
        still = {e.entry_id for e in self.bus.dlq.entries()}
        for entry_id, entry in before.items():
            if entry_id not in still and entry.subscriber in self.subs:
                self.subs[entry.subscriber].redriven[entry.envelope.payload] += 1

    async def settle(self, rounds: int = 2000) -> bool:
        """Open every gate and move the fake clock until the bus is drained; False if it
        never is (a hang)."""
        for gate in self.gates.values():
            gate.set()
        for _ in range(rounds):
            try:
                # Short: what is left is mostly retries parked on the fake clock.
                await self.bus.drain(timeout=0.01)
                return True
            except TimeoutError:
                await self.clock.advance(2.0)
        return False

    def check_counters(self) -> None:
        """Between steps, mid-run: every subscription's counters add up with what it holds."""
        for name, s in self.bus.stats().subscribers.items():
            held = s.delivered + s.dead_lettered + s.shed + s.queued + s.in_flight
            if s.published != held:
                self.midrun.append(f"{name}: published {s.published} != {held} mid-run: {s}")

    # -- the verdict ------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        async with self.bus:
            self.watch_system()
            for spec in base_specs():
                self.subscribe(spec)
            for i in range(self.steps):
                await self.step()
                if not i % 10:  # stats() computes every latency summary: not every step
                    self.check_counters()
            drained = await self.settle()
            result = self.verdict(drained)
        return result

    def verdict(self, drained: bool) -> dict[str, Any]:
        stats = self.bus.stats().subscribers
        problems: list[str] = self.midrun[:5]
        unaccounted = 0
        published = 0
        for name, sub in self.subs.items():
            s = sub.final if sub.final is not None else stats[name]
            if sub.final is not None and name in stats:
                problems.append(f"{name}: still subscribed after off()")
            entries = self.bus.dlq.entries(subscriber=name)
            listed = Counter(e.envelope.payload for e in entries)
            listed_shed = sum(1 for e in entries if e.reason == "shed")
            if sub.final is not None:
                # Its counters from before off(): only what the off() let finish is later.
                s_filtered, s_shed = s.filtered, s.shed
            else:
                s_filtered, s_shed = s.filtered, s.shed
                if s.published != s.delivered + s.dead_lettered + s.shed:
                    problems.append(f"{name}: bus counters do not add up: {s}")
            known = sub.handled + listed + sub.declined + sub.refused
            extra = known - sub.offered
            missing = sub.offered - known
            sampled = s_filtered - sum(sub.declined.values())
            shed_unlisted = s_shed - listed_shed
            published += sum(sub.offered.values())
            if extra:
                problems.append(f"{name}: ended twice or never offered: {dict(extra)}")
                unaccounted += sum(extra.values())
            gap = sum(missing.values()) - sampled - shed_unlisted
            if gap:
                problems.append(
                    f"{name}: {sum(missing.values())} offered messages without an end, but "
                    f"{sampled} sampled out and {shed_unlisted} shed unlisted: "
                    f"{sorted(missing.elements())[:10]}"
                )
                unaccounted += abs(gap)
            lost_redriven = sum(n for x, n in missing.items() if x in sub.redriven)
            if lost_redriven > shed_unlisted:
                problems.append(f"{name}: {lost_redriven} redriven messages vanished")
                unaccounted += lost_redriven - shed_unlisted
        for name in SYSTEM_PATTERNS:
            w, seen = stats[name], self.system_seen[name]
            if not w.published == w.delivered == seen:
                problems.append(f"{name}: {seen} system events seen, stats {w}")
        if self.bus.dlq.evicted:
            problems.append(f"the DLQ evicted {self.bus.dlq.evicted} entries: ledger incomplete")
        if not drained:
            problems.append("drain never finished")
        return {
            "seed": self.seed,
            "messages": self.serial,
            "offers": published,
            "unaccounted": unaccounted,
            "drained": drained,
            "dead_letters": dict(self.bus.dlq.totals),
            "problems": problems,
            "ops": dict(self.ops),
        }


def run_seed(seed: int, steps: int = 150) -> dict[str, Any]:
    """One seed on a fresh event loop (as a test or the benchmark runs it)."""
    return asyncio.run(Workload(seed, steps).run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200, help="seeds 0..N-1 (default 200)")
    parser.add_argument("--first", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--steps", type=int, default=150, help="operations per seed")
    parser.add_argument("--json", type=Path, help="write every seed's figures here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    results = []
    for seed in range(args.first, args.first + args.seeds):
        r = run_seed(seed, args.steps)
        results.append(r)
        if r["problems"]:
            print(f"seed {seed}: {r['unaccounted']} unaccounted", *r["problems"], sep="\n  ")
    elapsed = time.perf_counter() - started
    bad = [r["seed"] for r in results if r["problems"]]
    totals: Counter[str] = Counter()
    for r in results:
        totals.update(r["dead_letters"])
    summary = {
        "seeds": args.seeds,
        "first": args.first,
        "steps": args.steps,
        "messages": sum(r["messages"] for r in results),
        "offers": sum(r["offers"] for r in results),
        "unaccounted": sum(r["unaccounted"] for r in results),
        "failing_seeds": bad,
        "dead_letters": dict(totals),
        "elapsed_s": round(elapsed, 1),
        "python": platform.python_version(),
        "machine": platform.platform(),
    }
    print(json.dumps(summary, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "seeds": results}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
