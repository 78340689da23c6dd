"""Building a team: the scenario's agents, configured and ready to attach to a bus.

Kept apart from the run loop and the report so that everything that needs a team (a run, a
replay, a redrive, a ZeroMQ node) builds it one way, and none of them imports the others.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agents import (
    Actor,
    Agent,
    AgentOptions,
    AgentUsage,
    AnthropicProvider,
    BudgetLedger,
    Fault,
    FaultMark,
    Guardian,
    Labels,
    Learner,
    ModelProvider,
    Monitor,
    Observer,
    OpenAIProvider,
    Outbox,
    Outcomes,
    RateLimiter,
    RuleProvider,
    budget_guards,
    total_usage,
)
from bus import Bus
from pantheon._errors import PantheonError
from pantheon.runner._inputs import jsonl_labels, open_input
from pantheon.scenario import FileInputConfig, JsonlInputConfig, Scenario
from pantheon.scenario.internals import agent_class, provider_class, resolve_handler

__all__ = [
    "AgentSetupError",
    "RemoteInput",
    "Setup",
    "Team",
    "build_team",
    "check_model",
    "sum_usage",
    "team_setup",
]

Setup = Callable[[Bus], Awaitable[None]]


class AgentSetupError(PantheonError, RuntimeError):
    """An agent's class raised while it was being built, before anything ran.

    Its constructor is user code: whatever it raises, ``SystemExit`` and
    ``KeyboardInterrupt`` included, becomes this one error naming the agent, its class, the
    exception and the line that raised it. A ``sys.exit()`` in an ``__init__`` would
    otherwise end the whole run silently with its code."""

    def __init__(self, agent: str, cls: type, exc: BaseException) -> None:
        self.agent = agent
        self.error = exc
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        super().__init__(
            f"agent {agent!r}: {cls.__module__}:{cls.__qualname__} could not be built: "
            f"{what}{where}"
        )


class RemoteInput(Protocol):
    """The input other processes of a multi-process run read (Observers placed on nodes),
    as the driver reaches it: what ``pantheon run``'s first Ctrl-C ends besides the input
    of the driver's own Observers, so the run finishes as an in-process one does."""

    def reading(self) -> list[str]:
        """The Observers (``agent@node``) whose input has not been seen to end yet."""
        ...

    def end_input(self) -> None:
        """Tell their processes to end it between two items, as
        :meth:`agents.Observer.end_input` does in one process; returns at once (the run
        sees each input end as it goes on watching its processes)."""
        ...


@dataclass
class Team:
    """The agents of one run, with handles on the ones whose results the summary reads."""

    agents: dict[str, Agent]
    outbox: Outbox
    #: The model provider every agent of the team shares; closed by :meth:`aclose`.
    provider: ModelProvider | None = None
    #: Each item's decision, followed on the bus the team is attached to, for the summary's
    #: accuracy and ``min_accuracy``; None for a team whose input has no labels to score by.
    outcomes: Outcomes | None = None
    #: The scenario's budget ledgers (``run`` first, then ``agent:<name>``), if it has any.
    budgets: list[BudgetLedger] = field(default_factory=list)
    #: In a multi-process run, the decisions this process published itself, for the live
    #: feed's tally (each process counts its own; the summary is scored from the record).
    tally: Outcomes | None = None
    #: The limiter every model call of the team waits its turn at (``provider.rate_limit``),
    #: if the provider has a limit; in a multi-process run, the driver's.
    rate_limiter: RateLimiter | None = None
    #: In a multi-process run's driver, the input its nodes read (None elsewhere): a
    #: Ctrl-C of the run ends it with the driver's own Observers' input.
    remote_input: RemoteInput | None = None

    def budget(self) -> dict[str, dict[str, Any]]:
        """Per budget scope: spent, limits, calls refused and whether the budget stopped
        calls (:meth:`agents.BudgetState.as_dict`)."""
        return {ledger.scope: ledger.state().as_dict() for ledger in self.budgets}

    def rate_limit(self) -> dict[str, Any]:
        """The provider's rate limit and how it held the team back: calls admitted and how
        many had to wait their turn (empty without a limit)."""
        limiter = self.rate_limiter
        if limiter is None:
            return {}
        limit = limiter.limit
        return {
            "requests_per_minute": limit.requests,
            "tokens_per_minute": limit.tokens,
            "window_s": limit.window,
            "admitted": limiter.admitted,
            "waited": limiter.waited,
        }

    def of_role(self, cls: type[Agent]) -> list[Any]:
        return [a for a in self.agents.values() if isinstance(a, cls)]

    async def attach(self, bus: Bus) -> None:
        for outcomes in (self.outcomes, self.tally):
            if outcomes is not None:
                bus.observe(outcomes)
        for agent in self.agents.values():
            await agent.attach(bus)

    async def start(self) -> None:
        for agent in self.agents.values():
            await agent.start()

    async def stop(self) -> None:
        for agent in self.agents.values():
            await agent.stop()

    async def check_model(self) -> None:
        """Reach the model server before any input flows (``ProviderUnavailable`` if it is
        not there), which also readies the provider's connections: the first message's
        handling then measures the call, not the client's set-up."""
        check = getattr(self.provider, "check", None)
        if check is not None:
            await check()

    async def aclose(self) -> None:
        """Release the provider's connections: after the last drain, since a message still
        queued for a model-calling agent would otherwise find its provider closed."""
        if self.provider is not None:
            await self.provider.aclose()

    def usage(self) -> dict[str, Any]:
        """The team's model calls, tokens and cost: summed, and per agent that called."""
        by_agent = self.usage_by_agent()
        return {
            **total_usage(by_agent.values()).as_dict(),
            "by_agent": {name: u.as_dict() for name, u in by_agent.items()},
        }

    def usage_by_agent(self) -> dict[str, AgentUsage]:
        """Each agent that has called a model, with its usage so far: a few dict reads per
        agent, cheap enough for a live feed to ask every snapshot."""
        out = {}
        for name, agent in self.agents.items():
            usage = agent.usage
            if usage.calls:
                out[name] = usage
        return out


def sum_usage(usages: list[dict[str, Any]]) -> dict[str, Any]:
    """Calls, tokens and cost added up (:func:`agents.total_usage`: the same total in any
    order); ``priced`` only if every part was."""
    return total_usage(AgentUsage.from_dict(u) for u in usages).as_dict()


def _provider(scenario: Scenario) -> ModelProvider:
    p = scenario.provider
    if p.kind == "openai":
        options: dict[str, Any] = {
            "timeout": p.timeout,
            "max_retries": p.max_retries,
            "backoff": p.backoff,
            "max_backoff": p.max_backoff,
            "connect_timeout": p.connect_timeout,
            "max_connections": p.max_connections,
        }
        if p.stand_in is not None:
            # On use: the stand-in server's modules are 8 ms of every run's start-up
            # (python -X importtime), and most teams name none.
            from pantheon.standin import StandInProvider, load_reply

            return StandInProvider(load_reply(p.stand_in), p.model, **options)
        key = os.environ.get(p.api_key_env) if p.api_key_env else None
        return OpenAIProvider(p.base_url, p.model, key, **options)
    if p.kind == "anthropic":
        return AnthropicProvider(
            p.base_url,
            p.model,
            os.environ.get(p.api_key_env) if p.api_key_env else None,
            p.timeout,
            max_tokens=p.max_tokens,
            max_retries=p.max_retries,
            connect_timeout=p.connect_timeout,
            max_connections=p.max_connections,
            params=p.params,
        )
    if p.kind == "custom":
        provider: ModelProvider = provider_class(p.class_, p.settings)(**p.settings)
        return provider
    return RuleProvider(p.rules, p.default_intent, intents=p.intents)


async def check_model(scenario: Scenario) -> None:
    """Raise ``agents.ProviderUnavailable`` naming the URL if the scenario's model server
    cannot be reached: said once, before a run, rather than once per dead-lettered input. A
    scripted stand-in (``provider.stand_in``) is started by the run itself: nothing to reach."""
    if getattr(scenario.provider, "stand_in", None) is not None:
        return
    provider = _provider(scenario)
    try:
        check = getattr(provider, "check", None)
        if check is not None:
            await check()
    finally:
        await provider.aclose()


def build_team(
    scenario: Scenario,
    *,
    replay: bool = False,
    outbox_path: Path | None = None,
    seed: int | None = None,
) -> Team:
    """The scenario's agents, configured. ``replay`` leaves out everything that creates
    outside input (the Observer's ingest, the Monitor's sampling): a replay re-publishes
    those from the recording instead."""
    inp = scenario.input
    # One mapping for the Observer to file labels into and the Learner to read; a JSONL
    # input's are read ahead too, for a Learner in another process than the Observer.
    labels = Labels(
        jsonl_labels(inp) if isinstance(inp, JsonlInputConfig | FileInputConfig) else None
    )
    spec = scenario.outcome_spec()
    provider = _provider(scenario)
    prices = {model: (p.input, p.output) for model, p in scenario.prices.items()}
    outbox = Outbox(outbox_path)
    agents: dict[str, Agent] = {}
    for name, cfg in scenario.agents.items():
        if not cfg.enabled:
            continue
        cls = agent_class(name, cfg)
        options = AgentOptions(
            concurrency=cfg.concurrency,
            max_queue=cfg.max_queue,
            overflow=cfg.overflow,
            block_timeout=cfg.block_timeout,
            retry=cfg.retry.to_policy(),
            breaker=cfg.breaker.to_policy() if cfg.breaker is not None else None,
        )
        f = scenario.faults.agents.get(name)
        fault = None
        if f is not None:
            start, until = (
                None if m is None else FaultMark(m.seconds, m.messages) for m in (f.from_, f.until)
            )
            fault = Fault(f.failure_rate, f.latency_ms, f.tool, start, until)
        settings = dict(cfg.settings)
        kwargs: dict[str, Any] = {}
        if cfg.handler is not None:
            kwargs["handler"] = resolve_handler(cfg.handler)
        if cfg.subscribe is not None:
            kwargs["subscribe"] = cfg.subscribe
        # What the built-in roles take from other sections of the scenario; subclasses of
        # them (a user's own Guardian) take the same.
        if issubclass(cls, Observer):
            kwargs["labels"] = labels
            if not replay:
                kwargs["source"] = open_input(scenario, seed=seed)
                settings.update(count=inp.count, duration=inp.duration, rate=inp.rate)
        elif issubclass(cls, Guardian):
            settings = scenario.policy.model_dump() | settings
        elif issubclass(cls, Learner):
            kwargs["labels"] = labels
            kwargs["outcome"] = spec
        elif issubclass(cls, Actor):
            kwargs["outbox"] = outbox
        elif issubclass(cls, Monitor):
            kwargs["sample"] = not replay
        try:
            agents[name] = cls(
                name,
                settings=settings,
                options=options,
                fault=fault,
                seed=scenario.seed if seed is None else seed,
                provider=provider,
                prices=prices,
                **kwargs,
            )
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            raise AgentSetupError(name, cls, exc) from exc
    budget = scenario.budget
    guards, ledgers = budget_guards(
        budget.run.to_budget() if budget.run is not None else None,
        {name: b.to_budget() for name, b in budget.agents.items()},
        agents,
    )
    rate = getattr(scenario.provider, "rate_limit", None)
    # One limiter for the team's provider and model: the agents share the server's meter.
    limiter = RateLimiter(rate.to_limit()) if rate is not None else None
    for name, agent in agents.items():
        agent.budget = guards.get(name)
        agent.rate_limiter = limiter
    return Team(
        agents,
        outbox,
        provider,
        Outcomes(spec, labels) if scenario.scored else None,
        budgets=ledgers,
        rate_limiter=limiter,
    )


def team_setup(scenario_text: str, *, base_dir: Path | None = None, replay: bool = True) -> Setup:
    """A ``setup(bus)`` that attaches and starts the team of a recorded scenario, for replay
    and redrive (``pantheon.sessions`` calls it with a fresh bus). The input file need not
    exist any more: a replay takes its inputs from the recording."""
    from pantheon.scenario import parse_scenario

    scenario = parse_scenario(scenario_text, base_dir=base_dir, check_files=False)

    async def setup(bus: Bus) -> None:
        team = build_team(scenario, replay=replay)
        await team.attach(bus)
        await team.start()

    return setup
