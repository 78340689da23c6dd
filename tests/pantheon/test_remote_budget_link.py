"""The budget and rate-limit link between a node and its driver, in one process: a node's
:class:`RemoteBudgetGuard` wired to the driver's :class:`BudgetRelay` as the control pipe
would carry them (the real run is tests/cluster/test_remote_budget.py). What a pipe cannot
show cheaply: a lost node's reservations given back, a node asking for an agent it does
not host, and a node whose driver is gone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

from agents import (
    Budget,
    BudgetExceeded,
    BudgetUnavailable,
    RateLimit,
    RateLimiter,
    budget_guards,
)
from bus.testing import FakeClock
from pantheon.runner._budget_relay import (
    BUDGET_COMMAND,
    BudgetRelay,
    NodeBudgetLink,
    RemoteBudgetGuard,
    RemoteRateLimiter,
)
from pantheon.runner._multiprocess import split_control

Send = Callable[[Mapping[str, Any]], Awaitable[bool]]


def recorder(into: list[dict[str, Any]]) -> Send:
    async def send(message: Mapping[str, Any]) -> bool:
        into.append(dict(message))
        return True

    return send


async def settle_tasks() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def wired(relay: BudgetRelay, node: str) -> NodeBudgetLink:
    """A node's link whose lines reach ``relay`` and whose answers come back, as JSON."""
    link: NodeBudgetLink

    async def send(message: Mapping[str, Any]) -> bool:
        link.answered(json.loads(json.dumps(message)))
        return True

    handle = relay.on_event(node, send)
    link = NodeBudgetLink(
        node, lambda event, **fields: handle(json.loads(json.dumps({"event": event, **fields})))
    )
    return link


async def test_two_nodes_spend_one_run_budget_and_the_first_refusal_is_announced_once() -> None:
    guards, [run] = budget_guards(Budget(tokens=12), {}, ["a", "b"])
    relay = BudgetRelay(guards, {"one": ["a"], "two": ["b"]})
    a = RemoteBudgetGuard(wired(relay, "one"), "a")
    b = RemoteBudgetGuard(wired(relay, "two"), "b")
    for guard in (a, b, a):  # 5 tokens each, one at a time: 15 of 12
        await guard.admit()
        guard.settle(5, 0.0, True)
    assert (run.tokens, run.in_flight) == (15, 0)
    for guard in (b, a):
        with pytest.raises(BudgetExceeded, match="budget 'run' spent: 15 of 12 tokens"):
            await guard.admit()
    first = await b.count_refusal("run")
    assert first is not None and first.scope == "run" and first.tokens == 15
    assert await a.count_refusal("run") is None  # one system.budget, whichever node was first
    assert run.refused == 2


async def test_an_agents_budget_holds_across_the_members_of_its_group() -> None:
    """One agent on two nodes (a group): both members are charged to its one ledger."""
    guards, [ledger] = budget_guards(None, {"a": Budget(tokens=10)}, ["a"])
    relay = BudgetRelay(guards, {"one": ["a"], "two": ["a"]})
    members = [RemoteBudgetGuard(wired(relay, node), "a") for node in ("one", "two")]
    for member in members:
        await member.admit()
        member.settle(5, 0.0, True)
    for member in members:
        with pytest.raises(BudgetExceeded, match="budget 'agent:a' spent: 10 of 10 tokens"):
            await member.admit()
    assert (ledger.scope, ledger.tokens, ledger.in_flight) == ("agent:a", 10, 0)


async def test_a_lost_node_gives_back_the_reservations_it_held() -> None:
    guards, [run] = budget_guards(Budget(tokens=10), {}, ["a", "b"])
    relay = BudgetRelay(guards, {"one": ["a"], "two": ["b"]})
    to_one: list[dict[str, Any]] = []
    to_two: list[dict[str, Any]] = []
    relay.on_event("one", recorder(to_one))({"op": "admit", "id": 1, "agent": "a"})
    await settle_tasks()
    assert to_one == [{"cmd": "budget", "id": 1}] and run.in_flight == 1
    # Before any call has settled, the call in flight may fill the budget: b waits ...
    relay.on_event("two", recorder(to_two))({"op": "admit", "id": 1, "agent": "b"})
    await settle_tasks()
    assert to_two == []
    # ... until node one is lost: its call will never settle, its reservation is given back.
    relay.lost("one")
    await settle_tasks()
    assert to_two == [{"cmd": "budget", "id": 1}] and run.in_flight == 1
    await relay.aclose()


async def test_an_admission_its_asker_gave_up_is_given_back_when_it_comes() -> None:
    guards, [run] = budget_guards(Budget(tokens=10), {}, ["a", "b"])
    relay = BudgetRelay(guards, {"one": ["a", "b"]})
    link = wired(relay, "one")
    a, b = RemoteBudgetGuard(link, "a"), RemoteBudgetGuard(link, "b")
    await a.admit()  # in flight: before it settles, it may fill the budget
    waiting = asyncio.ensure_future(b.admit())
    await settle_tasks()
    waiting.cancel()  # b's handler is cancelled (a stop) while its admission waits
    a.settle(5, 0.0, True)
    await settle_tasks()
    # The driver admitted b after all; nobody makes that call, so the node gave it back.
    assert run.in_flight == 0 and run.tokens == 5
    await a.admit()
    a.settle(5, 0.0, True)
    assert run.tokens == 10 and run.in_flight == 0


async def test_a_node_cannot_charge_an_agent_it_does_not_host() -> None:
    guards, _ = budget_guards(Budget(tokens=10), {}, ["a", "b"])
    relay = BudgetRelay(guards, {"one": ["a"], "two": ["b"]})
    with pytest.raises(BudgetUnavailable, match=r"charged agent 'b', which it does not host"):
        await RemoteBudgetGuard(wired(relay, "one"), "b").admit()


async def test_a_node_whose_driver_is_gone_cannot_be_admitted() -> None:
    said: list[dict[str, Any]] = []
    link = NodeBudgetLink("one", lambda event, **fields: said.append(fields))
    stdin = asyncio.StreamReader()
    rest, tap = split_control(stdin, "one", {BUDGET_COMMAND: link.answered}, (link.driver_gone,))
    guard = RemoteBudgetGuard(link, "a")
    waiting = asyncio.ensure_future(guard.admit())
    await settle_tasks()
    assert said == [{"op": "admit", "id": 1, "agent": "a"}]
    stdin.feed_data(b'{"cmd": "status"}\n')  # not a budget answer: the control loop's
    stdin.feed_eof()
    await tap
    assert await rest.get() == b'{"cmd": "status"}\n' and await rest.get() == b""
    with pytest.raises(BudgetUnavailable, match="the driver of the run is gone"):
        await waiting
    with pytest.raises(BudgetUnavailable, match="cannot be admitted to a model call"):
        await guard.admit()


async def test_two_nodes_take_their_turns_at_the_drivers_one_rate_limiter() -> None:
    """Two calls per second for the team, asked from two nodes: the third waits until the
    first leaves the window, whichever node asks it, and tokens settle on the driver's log
    (each process keeping its own limiter would have let four go at once)."""
    clock = FakeClock()
    limiter = RateLimiter(RateLimit(requests=2, tokens=100, window=1.0), clock)
    relay = BudgetRelay({}, {"one": ["a"], "two": ["b"]}, limiter)
    a = RemoteRateLimiter(wired(relay, "one"), "a", limiter.limit)
    b = RemoteRateLimiter(wired(relay, "two"), "b", limiter.limit)
    first = await a.acquire()
    await b.acquire()
    calls = [asyncio.ensure_future(x.acquire()) for x in (a, b)]
    await settle_tasks()
    assert [c.done() for c in calls] == [False, False] and limiter.admitted == 2
    await clock.advance(1.0)
    await settle_tasks()
    assert [c.done() for c in calls] == [True, True]
    assert (limiter.admitted, limiter.waited) == (4, 2)
    assert first == [1.0, 0.0]  # the node holds the driver's entry id, not a log entry
    a.settle(calls[0].result(), 40)
    await settle_tasks()
    assert sorted(entry[1] for entry in limiter._log) == [0.0, 40.0]
    # Neither node's own limiter counts: the team's figures are the driver's.
    assert (a.admitted, b.admitted) == (0, 0)


async def test_a_rate_turn_for_an_agent_the_node_does_not_host_is_an_error() -> None:
    limiter = RateLimiter(RateLimit(requests=2, window=1.0))
    relay = BudgetRelay({}, {"one": ["a"]}, limiter)
    stranger = RemoteRateLimiter(wired(relay, "one"), "b", limiter.limit)
    with pytest.raises(BudgetUnavailable, match="does not host that agent"):
        await stranger.acquire()
    unlimited = RemoteRateLimiter(wired(BudgetRelay({}, {"one": ["a"]}), "one"), "a", limiter.limit)
    with pytest.raises(BudgetUnavailable, match="has no rate limit"):
        await unlimited.acquire()
    assert limiter.admitted == 0


async def test_rate_turns_never_settled_are_forgotten_once_out_of_the_window() -> None:
    """A call that failed, or a node that died, never settles its turn: the driver keeps
    none of them past the window."""
    clock = FakeClock()
    limiter = RateLimiter(RateLimit(requests=100, window=1.0), clock)
    relay = BudgetRelay({}, {"one": ["a"]}, limiter)
    a = RemoteRateLimiter(wired(relay, "one"), "a", limiter.limit)
    for _ in range(5):
        await a.acquire()  # never settled
    assert len(relay._turns) == 5
    await clock.advance(1.5)
    await a.acquire()
    assert len(relay._turns) == 1
