"""Budgets: how many tokens and dollars a run, or one agent, may spend on model calls.

A scenario's ``budget:`` gives limits per scope: ``run`` (every agent of the team in this
process together) and each agent by name. :meth:`agents.Agent.chat` asks its
:class:`BudgetGuard` before every model call; once a scope is spent, further calls of that
scope raise :class:`BudgetExceeded`, whose ``dead_letter_reason`` makes the bus dead-letter
the message at once under the reason ``budget`` (no retry: waiting does not refill a budget).

Concurrency. The check reserves: each call in flight holds back the largest call its scope
has seen so far (the whole remaining budget before the first call has settled), and a call
that would push spent plus reservations to the limit waits for calls in flight to settle
instead of passing. So the spend passes a limit of N by less than one call (as long as no
call uses more than the largest one before it), whatever the concurrency: "N, plus at most
the call that crossed it".

Replay. The admission is the effect ``budget.admit``: recorded live, served on replay, so a
replay refuses exactly the calls the run refused, in whatever order its calls finish; the
spend is counted from the (recorded) answers in both.

Scope. A guard's ledgers live in one process. Under ``pantheon run`` on ZeroMQ or NATS the
driver keeps them for the whole team: a node's agents are charged to them over the node's
control channel (``pantheon.runner._budget_relay``), so the ``run`` budget, and an agent's budget
across a group's members, hold team-wide.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agents._errors import AgentError

__all__ = [
    "BUDGET_EFFECT",
    "RUN_SCOPE",
    "Budget",
    "BudgetExceeded",
    "BudgetGuard",
    "BudgetLedger",
    "BudgetState",
    "BudgetUnavailable",
    "budget_guards",
]

#: The scope name of the run-wide budget (an agent's scope is ``agent:<name>``).
RUN_SCOPE = "run"

#: The effect a model call's admission is recorded as.
BUDGET_EFFECT = "budget.admit"


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits of one scope: ``tokens`` (input plus output) and ``cost_usd``; ``None``: no
    limit on that measure."""

    tokens: int | None = None
    cost_usd: float | None = None

    def __post_init__(self) -> None:
        if self.tokens is not None and self.tokens < 0:
            raise ValueError(f"a token budget must not be negative, got {self.tokens}")
        if self.cost_usd is not None and not (self.cost_usd >= 0 and math.isfinite(self.cost_usd)):
            raise ValueError(f"a cost budget must be a finite amount >= 0, got {self.cost_usd}")


class BudgetExceeded(AgentError, RuntimeError):
    """A model call was refused because its scope's budget is spent.

    Built from one message (a replay rebuilds it so): the scope is the quoted name the
    message starts with."""

    #: Read by the bus: the message is dead-lettered at once, with this reason.
    dead_letter_reason: ClassVar[str] = "budget"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        _, _, rest = message.partition("'")
        self.scope = rest.partition("'")[0]


class BudgetUnavailable(AgentError, RuntimeError):
    """A model call could not be admitted because its budget's ledgers cannot be reached
    (a node whose driver is gone): the call fails like any failed effect (retries, then the
    dead letter queue) rather than spend without a bound."""


@dataclass(frozen=True, slots=True)
class BudgetState:
    """One scope's account, as a run summary reports it."""

    scope: str
    tokens: int
    cost_usd: float
    limit_tokens: int | None
    limit_cost_usd: float | None
    refused: int

    @property
    def stopped(self) -> bool:
        """Whether the budget refused at least one call."""
        return self.refused > 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
            "limit_tokens": self.limit_tokens,
            "limit_cost_usd": self.limit_cost_usd,
            "refused": self.refused,
            "stopped": self.stopped,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BudgetState:
        """The state :meth:`as_dict` gave (``stopped`` is derived, so not read)."""
        return cls(
            str(data["scope"]), int(data["tokens"]), float(data["cost_usd"]),
            data["limit_tokens"], data["limit_cost_usd"], int(data["refused"]),
        )  # fmt: skip


class BudgetLedger:
    """What one scope has spent and holds reserved for calls in flight."""

    __slots__ = (
        "_changed",
        "announced",
        "budget",
        "cost",
        "in_flight",
        "largest_cost",
        "largest_tokens",
        "refused",
        "scope",
        "settled",
        "tokens",
    )

    def __init__(self, scope: str, budget: Budget) -> None:
        self.scope = scope
        self.budget = budget
        self.tokens = 0
        self.cost = 0.0
        self.in_flight = 0
        self.settled = 0
        self.largest_tokens = 0
        self.largest_cost = 0.0
        self.refused = 0
        #: Whether ``system.budget`` was published for this scope (once per scope).
        self.announced = False
        self._changed: asyncio.Event | None = None

    def spent(self) -> bool:
        b = self.budget
        return (b.tokens is not None and self.tokens >= b.tokens) or (
            b.cost_usd is not None and self.cost >= b.cost_usd
        )

    def _crowded(self) -> bool:
        """Whether the calls in flight, at the largest size seen, may reach the limit: a new
        call waits for them. Before any call settled, one in flight fills the budget."""
        if not self.in_flight:
            return False
        b = self.budget
        if not self.settled:
            return b.tokens is not None or b.cost_usd is not None
        return (
            b.tokens is not None
            and self.tokens + (self.in_flight + 1) * self.largest_tokens > b.tokens
        ) or (
            b.cost_usd is not None
            and self.cost + (self.in_flight + 1) * self.largest_cost > b.cost_usd
        )

    def refusal(self) -> BudgetExceeded:
        b = self.budget
        limits = []
        if b.tokens is not None:
            limits.append(f"{self.tokens} of {b.tokens} tokens")
        if b.cost_usd is not None:
            limits.append(f"${self.cost:.6f} of ${b.cost_usd}")
        return BudgetExceeded(f"budget '{self.scope}' spent: {', '.join(limits)}")

    async def changed(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def settle(self, tokens: int, cost: float, reserved: bool) -> None:
        """Count one answered call; ``reserved``: it held a reservation, now given back."""
        self.tokens += tokens
        self.cost += cost
        self.settled += 1
        self.largest_tokens = max(self.largest_tokens, tokens)
        self.largest_cost = max(self.largest_cost, cost)
        if reserved:
            self.in_flight -= 1
        self._wake()

    def release(self) -> None:
        """Give back the reservation of a call that failed (it spent nothing we know of)."""
        self.in_flight -= 1
        self._wake()

    def state(self) -> BudgetState:
        return BudgetState(
            self.scope, self.tokens, self.cost, self.budget.tokens, self.budget.cost_usd,
            self.refused,
        )  # fmt: skip


class BudgetGuard:
    """The ledgers one agent's calls are charged to (its own, the run's), admitted together."""

    __slots__ = ("ledgers",)

    def __init__(self, ledgers: Iterable[BudgetLedger]) -> None:
        self.ledgers = tuple(ledgers)

    async def admit(self) -> None:
        """Wait while calls in flight may fill a scope; refuse if one is spent; else
        reserve a place in every scope. Raises :class:`BudgetExceeded`."""
        while True:
            for ledger in self.ledgers:
                if ledger.spent():
                    raise ledger.refusal()
            crowded = next((ledger for ledger in self.ledgers if ledger._crowded()), None)
            if crowded is None:
                break
            await crowded.changed()
        for ledger in self.ledgers:
            ledger.in_flight += 1

    def refused(self, scope: str) -> BudgetLedger | None:
        """Count a refusal in ``scope``; its ledger if ``system.budget`` is still to be said."""
        for ledger in self.ledgers:
            if ledger.scope == scope:
                ledger.refused += 1
                if not ledger.announced:
                    ledger.announced = True
                    return ledger
        return None

    async def count_refusal(self, scope: str) -> BudgetState | None:
        """Count a refusal in ``scope``; its state if it is the scope's first, which the
        agent publishes as ``system.budget`` (a node's guard asks the driver's ledgers)."""
        ledger = self.refused(scope)
        return ledger.state() if ledger is not None else None

    def settle(self, tokens: int, cost: float, reserved: bool) -> None:
        for ledger in self.ledgers:
            ledger.settle(tokens, cost, reserved)

    def release(self) -> None:
        for ledger in self.ledgers:
            ledger.release()


def budget_guards(
    run: Budget | None, agents: Mapping[str, Budget], names: Iterable[str]
) -> tuple[dict[str, BudgetGuard], list[BudgetLedger]]:
    """A guard per agent name charged to its own budget and the run's (only the scopes that
    have one; an agent under neither gets no guard), and every ledger, run first."""
    shared = BudgetLedger(RUN_SCOPE, run) if run is not None else None
    ledgers = [shared] if shared is not None else []
    guards: dict[str, BudgetGuard] = {}
    for name in names:
        own = agents.get(name)
        mine = [shared] if shared is not None else []
        if own is not None:
            ledger = BudgetLedger(f"agent:{name}", own)
            ledgers.append(ledger)
            mine.append(ledger)
        if mine:
            guards[name] = BudgetGuard(mine)
    return guards, ledgers
