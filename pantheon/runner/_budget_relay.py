"""Budgets and the rate limit across processes: a node's agents are charged to the driver's
ledgers and take their turn at the driver's limiter.

A scenario's ``budget:`` bounds the run (and each agent) as a whole. In a multi-process run
(``transport.kind: zmq`` or ``nats``) each node builds the team from the scenario, and a
ledger kept per process would let every node spend the whole run budget (two nodes under a
run budget of N tokens: 2N). So the ledgers live in the driver only: each node agent's
:class:`agents.BudgetGuard` is a :class:`RemoteBudgetGuard`, which asks the driver's
:class:`BudgetRelay` over the node's control channel (the JSON lines of ``pantheon node
--control``, see ``pantheon.runner._multiprocess``), and the relay admits, settles and refuses the
call on the very guard a driver agent of that name would use. The bound is the one a
single process keeps ("N, plus at most the call that crossed it", see
:mod:`agents._budget`), now team-wide.

Why ask per call and not lease slices of the budget to the nodes: a lease bounds the
overshoot by the slices handed out (each node may spend its slice after another has run
the budget dry), or needs a slice small enough to cost a round trip per few calls anyway;
asking per call keeps the single-process bound exactly, and the round trip (a control line
each way over a local pipe, about 0.1 ms; ``benchmarks/budget_link_bench.py``) is noise
beside a model call of 100 ms to seconds. Settling and releasing a call are one-way lines.

The admission is still the node's effect ``budget.admit``: recorded in the node's journal,
so a replay refuses exactly the calls the run refused, without any driver.

The provider's rate limit (``provider.rate_limit``) is the model server's meter on the
team's key, so it too holds team-wide: a node agent's limiter is a
:class:`RemoteRateLimiter`, which asks the driver's one :class:`agents.RateLimiter` for
each call's turn (FIFO across every process) and settles the call's tokens there. Each
process keeping its own would let N nodes send N times the limit, and the server answer
429s. The turn is taken inside the model call's effect, as in one process: a replay serves
the call and asks nobody.

The wire, one JSON object per line:

* node -> driver: ``{"event": "budget", "op": "admit" | "refused", "id": N, "agent":
  NAME}`` (``refused`` with ``"scope"``: count a refusal, and say whether it is the scope's
  first, to be published as ``system.budget``), answered by ``{"cmd": "budget", "id": N}``
  (admitted), ``{..., "refused": MESSAGE}`` (:class:`agents.BudgetExceeded`), ``{...,
  "state": {...} | null}`` (the scope's :class:`agents.BudgetState` to publish) or ``{...,
  "error": "..."}``;
* node -> driver: ``{"event": "budget", "op": "rate", "id": N, "agent": NAME}`` (a model
  call's turn at the rate limiter), answered once the turn came by ``{"cmd": "budget",
  "id": N, "entry": E}`` (or ``"error"``);
* node -> driver, not answered: ``{"event": "budget", "op": "settle", "agent": NAME,
  "tokens": T, "cost": C, "reserved": bool}``, ``{"event": "budget", "op": "release",
  "agent": NAME}`` and ``{"event": "budget", "op": "rate_settle", "agent": NAME,
  "entry": E, "tokens": T}``.

Failures. A node that dies holding reservations would keep other calls waiting for calls
that will never settle: the relay gives back every reservation the lost node held (what
it spent before is counted; what its calls in flight would have spent is not, since no
answer came). A node whose driver is gone cannot be admitted: its calls fail with
:class:`agents.BudgetUnavailable` (the handler fails, is retried, then dead-lettered), never
spend unbounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from agents import (
    BudgetExceeded,
    BudgetGuard,
    BudgetState,
    BudgetUnavailable,
    RateLimit,
    RateLimiter,
)
from pantheon._errors import DriverGone

__all__ = [
    "BUDGET_COMMAND",
    "BUDGET_EVENT",
    "BudgetDriverGone",
    "BudgetRelay",
    "NodeBudgetLink",
    "RemoteBudgetGuard",
    "RemoteRateLimiter",
]


class BudgetDriverGone(BudgetUnavailable, DriverGone):
    """A node's model call asked for admission after its driver died (or was waiting then)."""


log = logging.getLogger("pantheon.budget")

#: The node's event (a request or a settlement) and the driver's answer.
BUDGET_EVENT = "budget"
BUDGET_COMMAND = "budget"


class RemoteBudgetGuard(BudgetGuard):
    """A node agent's guard: every question goes to the driver's guard of the same agent."""

    __slots__ = ("agent", "link")

    def __init__(self, link: NodeBudgetLink, agent: str) -> None:
        super().__init__(())
        self.link = link
        self.agent = agent

    async def admit(self) -> None:
        answer = await self.link.ask(self.agent, "admit")
        refused = answer.get("refused")
        if isinstance(refused, str):
            raise BudgetExceeded(refused)

    async def count_refusal(self, scope: str) -> BudgetState | None:
        answer = await self.link.ask(self.agent, "refused", scope=scope)
        state = answer.get("state")
        return BudgetState.from_dict(state) if isinstance(state, dict) else None

    def settle(self, tokens: int, cost: float, reserved: bool) -> None:
        self.link.tell(self.agent, "settle", tokens=tokens, cost=cost, reserved=reserved)

    def release(self) -> None:
        self.link.tell(self.agent, "release")


class RemoteRateLimiter(RateLimiter):
    """A node agent's rate limiter: each call's turn is taken at the driver's limiter.

    Its own ``admitted`` and ``waited`` stay 0: the team's counts are the driver's."""

    __slots__ = ("agent", "link")

    def __init__(self, link: NodeBudgetLink, agent: str, limit: RateLimit) -> None:
        super().__init__(limit)
        self.link = link
        self.agent = agent

    async def acquire(self) -> list[float]:
        answer = await self.link.ask(self.agent, "rate")
        return [float(answer["entry"]), 0.0]

    def settle(self, entry: list[float], tokens: int) -> None:
        self.link.tell(self.agent, "rate_settle", entry=int(entry[0]), tokens=tokens)


class NodeBudgetLink:
    """A node's end: sends its agents' budget questions to the driver and takes the answers.

    ``say(event, **fields)`` writes one event line to the driver (the node's stdout).
    :meth:`tap` reads the driver's lines before anyone else, so an answer is taken at once
    even while the node's control loop waits on something else (a ``stop`` draining the
    very handlers that wait for an admission)."""

    def __init__(self, node: str, say: Callable[..., None]) -> None:
        self.node = node
        self._say = say
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        #: Questions whose asker stopped waiting (its handler was cancelled): the agent and
        #: the question, to give a budget reservation back if the driver admits it all the
        #: same (a rate turn given to nobody counts as a call in the window, on the safe side).
        self._abandoned: dict[int, tuple[str, str]] = {}
        self._next = 0
        self._gone: str | None = None
        #: What a question fails with once ``_gone`` (see ``driver_gone``).
        self._gone_error: type[BudgetUnavailable] = BudgetDriverGone

    def serve(self, agents: Iterable[Any]) -> None:
        """Charge every agent of ``agents`` that is under a budget to the driver's ledgers,
        and give every one under a rate limit its turns at the driver's limiter."""
        for agent in agents:
            if agent.budget is not None:
                agent.budget = RemoteBudgetGuard(self, agent.name)
            if agent.rate_limiter is not None:
                agent.rate_limiter = RemoteRateLimiter(self, agent.name, agent.rate_limiter.limit)

    async def ask(self, agent: str, op: str, **fields: Any) -> dict[str, Any]:
        """Send one question and wait for the driver's answer."""
        if self._gone is not None:
            raise self._gone_error(self._gone_message(agent))
        self._next += 1
        rid = self._next
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = future
        try:
            try:
                self._say(BUDGET_EVENT, op=op, id=rid, agent=agent, **fields)
            except (OSError, ValueError) as exc:  # stdout closed under us: the driver is gone
                raise BudgetDriverGone(
                    f"node {self.node!r}: agent {agent!r} cannot reach the driver's budget "
                    f"({type(exc).__name__}: {exc})"
                ) from None
            answer = await future
        finally:
            self._waiting.pop(rid, None)
            if op in ("admit", "rate") and (future.cancelled() or not future.done()):
                self._abandoned[rid] = (agent, op)
        error = answer.get("error")
        if error is not None:
            raise BudgetUnavailable(f"node {self.node!r}, agent {agent!r}: {error}")
        return answer

    def tell(self, agent: str, op: str, **fields: Any) -> None:
        """Send one settlement; nobody answers it (once the driver is gone, nobody reads)."""
        if self._gone is not None:
            return
        try:
            self._say(BUDGET_EVENT, op=op, agent=agent, **fields)
        except (OSError, ValueError) as exc:
            log.warning("node %s: budget %s of %s not sent: %s", self.node, op, agent, exc)

    def answered(self, command: Mapping[str, Any]) -> None:
        rid = command.get("id")
        future = self._waiting.get(rid) if isinstance(rid, int) else None
        if isinstance(rid, int) and (asked := self._abandoned.pop(rid, None)) is not None:
            agent, op = asked
            if op == "admit" and not {"refused", "error"} & command.keys():
                self.tell(agent, "release")  # admitted for a call that will not be made
            return
        if future is None or future.done():
            log.warning("node %s: a budget answer %r, which nobody waits for", self.node, rid)
            return
        future.set_result(dict(command))

    def driver_gone(self, why: str, dead: bool = True) -> None:
        """Nothing more comes from the driver: fail every waiting question, and every
        later one, saying ``why``; with :class:`BudgetDriverGone` if the driver died
        (``dead``), else (the node stopped listening) the plain ``BudgetUnavailable``."""
        self._gone = why
        self._gone_error = BudgetDriverGone if dead else BudgetUnavailable
        for future in list(self._waiting.values()):
            if not future.done():
                future.set_exception(self._gone_error(self._gone_message(None)))

    def _gone_message(self, agent: str | None) -> str:
        who = f"agent {agent!r} on node {self.node!r}" if agent else f"node {self.node!r}"
        return f"{who} cannot be admitted to a model call: {self._gone}"


class BudgetRelay:
    """The driver's end: admits, settles and refuses the nodes' calls on the driver's guards.

    ``guards`` maps each agent under a budget to the guard a driver agent of that name uses
    (charged to the driver's ledgers); ``hosts`` maps each node to the agents it hosts, so a
    node charging an agent it does not host is refused. ``limiter`` is the team's rate
    limiter, the one the driver's own agents wait at (None: the provider has no limit)."""

    def __init__(
        self,
        guards: Mapping[str, BudgetGuard],
        hosts: Mapping[str, Iterable[str]],
        limiter: RateLimiter | None = None,
    ) -> None:
        self.guards = dict(guards)
        self.hosts = {node: frozenset(agents) for node, agents in hosts.items()}
        self.limiter = limiter
        #: Rate turns the nodes took and have not settled yet: entry id -> the limiter's
        #: entry, whose tokens the settlement fills in.
        self._turns: dict[int, list[float]] = {}
        self._next_turn = 0
        #: Reservations each node's agents hold (admitted, not settled or released yet).
        self._held: dict[str, Counter[str]] = {}
        self._tasks: dict[str, set[asyncio.Future[Any]]] = {}
        self._lost: set[str] = set()

    def on_event(
        self, node: str, send: Callable[[Mapping[str, Any]], Awaitable[bool]]
    ) -> Callable[[Mapping[str, Any]], None]:
        """The handler of ``node``'s ``budget`` events; ``send`` writes one command line to
        the node (False once it is gone)."""
        held = self._held.setdefault(node, Counter())

        def handle(event: Mapping[str, Any]) -> None:
            op, agent, rid = event.get("op"), event.get("agent"), event.get("id")
            if op in ("rate", "rate_settle"):
                self._rate(node, event, send)
                return
            guard = self._guard(node, agent)
            if op in ("settle", "release"):
                if guard is None:
                    log.error("node %s settled a call of %r, which it cannot charge", node, agent)
                    return
                assert isinstance(agent, str)
                if op == "release":
                    guard.release()
                    held[agent] -= 1
                    return
                reserved = bool(event.get("reserved"))
                guard.settle(int(event.get("tokens", 0)), float(event.get("cost", 0.0)), reserved)
                held[agent] -= reserved
                return
            if not isinstance(rid, int) or isinstance(rid, bool):
                log.error("node %s sent a budget question without an id: %.200r", node, event)
                return
            answer: dict[str, Any] = {"cmd": BUDGET_COMMAND, "id": rid}
            if guard is None:
                hosted = ", ".join(sorted(self.hosts.get(node, ()))) or "none"
                answer["error"] = (
                    f"node {node!r} charged agent {agent!r}, which it does not host under a "
                    f"budget (it hosts: {hosted})"
                )
                self._spawn(node, send(answer))
            elif op == "admit":
                assert isinstance(agent, str)
                self._spawn(node, self._admit(node, agent, guard, answer, send))
            elif op == "refused":
                ledger = guard.refused(str(event.get("scope")))
                answer["state"] = ledger.state().as_dict() if ledger is not None else None
                self._spawn(node, send(answer))
            else:
                answer["error"] = f"unknown budget operation {op!r}"
                self._spawn(node, send(answer))

        return handle

    def _rate(
        self,
        node: str,
        event: Mapping[str, Any],
        send: Callable[[Mapping[str, Any]], Awaitable[bool]],
    ) -> None:
        """A node agent's rate turn, or its settlement."""
        agent, rid, limiter = event.get("agent"), event.get("id"), self.limiter
        if event.get("op") == "rate_settle":
            eid = event.get("entry")
            entry = self._turns.pop(eid, None) if isinstance(eid, int) else None
            if entry is not None and limiter is not None:
                limiter.settle(entry, int(event.get("tokens", 0)))
            return
        if not isinstance(rid, int) or isinstance(rid, bool):
            log.error("node %s sent a rate question without an id: %.200r", node, event)
            return
        answer: dict[str, Any] = {"cmd": BUDGET_COMMAND, "id": rid}
        if limiter is None or not isinstance(agent, str) or agent not in self.hosts.get(node, ()):
            hosted = ", ".join(sorted(self.hosts.get(node, ()))) or "none"
            why = (
                "the team's provider has no rate limit"
                if limiter is None
                else f"it does not host that agent (it hosts: {hosted})"
            )
            answer["error"] = f"node {node!r} asked a rate-limit turn for {agent!r}, but {why}"
            self._spawn(node, send(answer))
            return
        self._spawn(node, self._turn(limiter, answer, send))

    async def _turn(
        self,
        limiter: RateLimiter,
        answer: dict[str, Any],
        send: Callable[[Mapping[str, Any]], Awaitable[bool]],
    ) -> None:
        entry = await limiter.acquire()
        # A turn whose call failed, or whose node died, is never settled: once out of the
        # window its tokens count for nothing, so it is forgotten (the dict is in turn order).
        horizon = entry[0] - limiter.limit.window
        turns = self._turns
        while turns:
            oldest = next(iter(turns))
            if turns[oldest][0] > horizon:
                break
            del turns[oldest]
        self._next_turn += 1
        turns[self._next_turn] = entry
        answer["entry"] = self._next_turn
        await send(answer)

    def _guard(self, node: str, agent: object) -> BudgetGuard | None:
        if not isinstance(agent, str) or agent not in self.hosts.get(node, ()):
            return None
        return self.guards.get(agent)

    async def _admit(
        self,
        node: str,
        agent: str,
        guard: BudgetGuard,
        answer: dict[str, Any],
        send: Callable[[Mapping[str, Any]], Awaitable[bool]],
    ) -> None:
        try:
            await guard.admit()
        except BudgetExceeded as exc:
            answer["refused"] = str(exc)
        else:
            # No await between the check and the count: lost() either sees this reservation
            # or has already marked the node lost, never neither.
            if node in self._lost:
                guard.release()
                return
            self._held[node][agent] += 1
        await send(answer)

    def _spawn(self, node: str, work: Awaitable[Any]) -> None:
        tasks = self._tasks.setdefault(node, set())
        task = asyncio.ensure_future(work)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def on_lost(self, node: str) -> Callable[[Mapping[str, Any]], None]:
        """The handler of ``node``'s end of output: give back what it held."""
        return lambda _event: self.lost(node)

    def lost(self, node: str) -> None:
        """``node`` is gone: stop its admissions waiting, and give back its reservations."""
        self._lost.add(node)
        for task in self._tasks.pop(node, set()):
            task.cancel()
        for agent, count in self._held.pop(node, Counter()).items():
            guard = self.guards[agent]
            for _ in range(count):
                guard.release()
            if count:
                log.warning("node %s lost holding %d budget reservations of %s", node, count, agent)

    async def aclose(self) -> None:
        """Stop answering (nobody is left to ask)."""
        tasks = [task for node_tasks in self._tasks.values() for task in node_tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
