"""The Agent base class: a named role that subscribes, handles, emits, asks and runs effects."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import structlog
from pydantic import BaseModel, ConfigDict

from agents._approvals import (
    APPROVAL_EFFECT,
    ApprovalDesk,
    ApprovalUnavailable,
    Decision,
    check_approval_request,
)
from agents._budget import BUDGET_EFFECT, BudgetExceeded, BudgetGuard
from agents._effects import Effects, LiveEffects, active_tracer, genai_span
from agents._errors import AgentError
from agents._ordinals import input_ordinal
from agents._providers import ChatResult, ModelProvider, ProviderError, RuleProvider, Usage
from agents._ratelimit import RateLimiter
from bus import (
    DEFAULT_BREAKER,
    BreakerPolicy,
    Bus,
    Envelope,
    Overflow,
    Priority,
    Retry,
    current_envelope,
    is_sampled,
)

if TYPE_CHECKING:
    from agents._outcomes import OutcomeSpec

__all__ = [
    "Agent",
    "AgentOptions",
    "AgentSettings",
    "AgentUsage",
    "Fault",
    "FaultMark",
    "FaultTimeline",
    "FunctionAgent",
    "Handler",
    "InjectedFault",
    "Prices",
    "UsageMeter",
    "attach_desk",
    "fault_timeline",
    "handler_arity",
    "total_usage",
]

#: Model name -> (USD per million input tokens, USD per million output tokens).
Prices = Mapping[str, tuple[float, float]]


class InjectedFault(AgentError, RuntimeError):
    """Raised by a scenario's fault injection, so injected failures are told from real ones."""


@dataclass(frozen=True, slots=True)
class FaultMark:
    """A point on a run's timeline: ``seconds`` since the run started, or ``messages``, the
    run's inputs taken in before the one a message comes from (the 401st email and all it
    causes are at ``messages=400``). Exactly one is set.

    Inputs are numbered per topic in the order their Observer published them (the emails,
    not the Monitor's samples in between), and the number travels in the input's id to
    every message it causes, in every process (:mod:`agents._ordinals`): a ``messages``
    bound splits the same inputs on every run with the same seed, in one process or on
    ZeroMQ and NATS nodes alike; a ``seconds`` bound depends on how fast the run went."""

    seconds: float | None = None
    messages: int | None = None

    def __post_init__(self) -> None:
        if (self.seconds is None) == (self.messages is None):
            raise ValueError("a FaultMark is seconds or messages, exactly one of them")

    def reached(self, seconds: float, messages: int) -> bool:
        if self.seconds is not None:
            return seconds >= self.seconds
        assert self.messages is not None
        return messages >= self.messages


@dataclass(frozen=True, slots=True)
class Fault:
    """Failure and latency a scenario injects into one agent (or one of its tools).

    ``start`` and ``until`` bound when it applies (from ``start`` included to ``until``
    excluded; ``None``: from the beginning / to the end). A windowed fault models an
    outage that passes: a redrive, later on the same timeline, gets past it."""

    failure_rate: float = 0.0
    latency_ms: float = 0.0
    tool: str | None = None
    start: FaultMark | None = None
    until: FaultMark | None = None

    @property
    def windowed(self) -> bool:
        return self.start is not None or self.until is not None

    def applies(self, seconds: float, messages: int) -> bool:
        """Whether a call at this point of the timeline is inside the window."""
        if self.start is not None and not self.start.reached(seconds, messages):
            return False
        return self.until is None or not self.until.reached(seconds, messages)


@dataclass(frozen=True, slots=True)
class FaultTimeline:
    """Where an agent's fault clock starts: ``started`` (wall-clock seconds) is second 0,
    and ``messages`` inputs count as already taken in on every topic.

    A run starts a fresh timeline when its agents attach. A redrive continues the original
    run's (its start, and the most inputs it took in on one topic), because a redrive
    happens later in the same story: an outage window that is over stays over."""

    started: float
    messages: int = 0


#: The timeline agents attaching now join; unset, each agent starts a fresh one at attach.
#: :func:`pantheon.sessions.redrive` sets the original run's around its ``setup(bus)``.
fault_timeline: ContextVar[FaultTimeline | None] = ContextVar("fault_timeline", default=None)

#: The approval desk agents attaching now get when they have none. ``pantheon run`` hands
#: its desk to the team it builds; a caller that attaches a team it does not build (a
#: ``setup(bus)`` it is given) sets this around the call instead:
#: :func:`pantheon.sessions.redrive` gives the team its session's desk this way.
attach_desk: ContextVar[ApprovalDesk | None] = ContextVar("attach_desk", default=None)

#: Whether the fault window was open for the delivery being handled (a tool fault asks).
_window_open: ContextVar[bool] = ContextVar("pantheon_fault_window_open", default=True)


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """How the agent's subscriptions behave on the bus: the mailbox, retry and breaker."""

    concurrency: int = 1
    max_queue: int = 10_000
    overflow: Overflow = "block"
    block_timeout: float = 5.0
    retry: Retry = field(default_factory=Retry)
    breaker: BreakerPolicy | None = DEFAULT_BREAKER


class AgentSettings(BaseModel):
    """Base of every agent's settings model: frozen and closed, so a misspelt setting in a
    scenario (``histroy``) is an error at ``pantheon validate``, never a silent default."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True, slots=True)
class AgentUsage:
    """What model calls have consumed: one agent's so far, or a sum of several agents'
    (replayed calls included: a replay serves the recorded usage, so it reports what the
    original run spent).

    ``cost_usd`` covers the calls whose model has a price; ``priced`` says whether that is
    all of them (a model missing from the prices costs 0 and makes ``priced`` false).
    """

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    priced: bool = True

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentUsage:
        """The inverse of :meth:`as_dict`; other keys (a summary's ``by_agent``) are
        ignored."""
        return cls(
            calls=int(data.get("calls", 0)),
            input_tokens=int(data.get("input_tokens", 0)),
            output_tokens=int(data.get("output_tokens", 0)),
            cost_usd=float(data.get("cost_usd", 0.0)),
            priced=bool(data.get("priced", True)),
        )


def total_usage(usages: Iterable[AgentUsage]) -> AgentUsage:
    """Several usages added up; ``priced`` only if every part was.

    The cost is an exactly rounded sum (:func:`math.fsum`), so the total is the same
    whatever order the parts come in: a run summary adds its agents in team order, the
    read model adds them from the session store, and the two must agree to the last bit.
    """
    parts = list(usages)
    return AgentUsage(
        calls=sum(u.calls for u in parts),
        input_tokens=sum(u.input_tokens for u in parts),
        output_tokens=sum(u.output_tokens for u in parts),
        cost_usd=math.fsum(u.cost_usd for u in parts),
        priced=all(u.priced for u in parts),
    )


def _cost(tokens_in: int, tokens_out: int, price: tuple[float, float]) -> float:
    return (tokens_in * price[0] + tokens_out * price[1]) / 1_000_000


class UsageMeter:
    """Counts one agent's model calls: token totals per priced model, so the cost is
    computed from totals when asked, the same whatever order concurrent calls finished in
    (float sums are order-sensitive).

    Every :meth:`Agent.chat` result goes through one, and :func:`pantheon.readmodel.usage`
    feeds a session's recorded calls through one per agent, which is why a session's usage
    read from the store is exactly its run summary's.
    """

    __slots__ = ("calls", "tokens", "unpriced")

    def __init__(self) -> None:
        self.calls = 0
        #: price key (the model name found in the prices, else the answer's) -> [in, out].
        self.tokens: dict[str, list[int]] = {}
        self.unpriced = 0

    def add(self, model: str, usage: Usage, asked: str, prices: Prices) -> float | None:
        """Count one call answered by ``model`` (empty: unknown) after ``asked`` was asked
        for; return that call's cost, or None when neither model has a price."""
        self.calls += 1
        key = model or asked
        if key not in prices and asked in prices:
            key = asked  # "gpt-4o-mini" priced, "gpt-4o-mini-2024-07-18" answered
        price = prices.get(key)
        # A call that used no tokens (the rules provider's) costs 0 whatever the price list.
        free = usage.input_tokens == usage.output_tokens == 0
        if price is None and not free:
            self.unpriced += 1
        totals = self.tokens.setdefault(key, [0, 0])
        totals[0] += usage.input_tokens
        totals[1] += usage.output_tokens
        if price is None:
            return 0.0 if free else None
        return _cost(usage.input_tokens, usage.output_tokens, price)

    def snapshot(self, prices: Prices) -> AgentUsage:
        cost = 0.0
        for model, (tokens_in, tokens_out) in sorted(self.tokens.items()):
            price = prices.get(model)
            if price is not None:
                cost += _cost(tokens_in, tokens_out, price)
        return AgentUsage(
            calls=self.calls,
            input_tokens=sum(t[0] for t in self.tokens.values()),
            output_tokens=sum(t[1] for t in self.tokens.values()),
            cost_usd=cost,
            priced=self.unpriced == 0,
        )


async def _recorded_chat(
    provider: ModelProvider,
    messages: Sequence[Mapping[str, Any]],
    kwargs: dict[str, Any],
    limiter: RateLimiter | None = None,
) -> dict[str, Any]:
    if limiter is None:
        return (await provider.chat(messages, **kwargs)).to_dict()
    entry = await limiter.acquire()
    result = await provider.chat(messages, **kwargs)
    limiter.settle(entry, result.usage.input_tokens + result.usage.output_tokens)
    return result.to_dict()


class Agent:
    """One member of a team. Subclasses set ``role`` and ``subscriptions``, declare their
    knobs as a nested ``Settings(AgentSettings)`` model and write :meth:`handle`.

    Each pattern in ``subscriptions`` becomes one bus subscription; the first is named after
    the agent, the others ``<name>:<pattern>``, so stats, breakers and the DLQ say which agent
    a message was for. A scenario's ``subscribe:`` replaces the class's patterns for one
    instance. Everything non-deterministic goes through :meth:`effect`, which uses the runner
    the runtime put on the envelope (recording or replaying), so a session replays.

    Model calls go through :meth:`chat`, which is such an effect, on the ``provider`` the
    runtime gives every agent; ``prices`` turn the tokens they use into :attr:`usage` cost.
    """

    role: ClassVar[str] = "agent"
    subscriptions: tuple[str, ...] = ()
    #: Fault keys whose try count :meth:`inject` remembers, least recently drawn forgotten
    #: first: a long run holds at most this many (one per message otherwise, for ever). A
    #: retry comes within moments, so it still finds its key; one that comes after this many
    #: newer keys counts from 1 again, a draw as deterministic as any other.
    fault_draw_keys: ClassVar[int] = 4096
    Settings: ClassVar[type[AgentSettings]] = AgentSettings
    #: Whether :meth:`handle` asks a model questions of its own through :meth:`chat`. A
    #: scenario with such an agent must name a model provider: the offline rules provider
    #: answers only which intent a message is, and anything else asked of it fails. ``None``
    #: lets ``pantheon validate`` read it off the code (a call ``self.chat(...)`` in the
    #: class or a base of it); set it when the code cannot tell:
    #: ``True`` for calls made through a helper, ``False`` for questions the rules answer.
    uses_model: ClassVar[bool | None] = None

    @classmethod
    def topics_for(cls, outcome: OutcomeSpec | None) -> tuple[str, ...]:
        """The patterns the class subscribes to when its scenario names none, in a team
        deciding ``outcome``: :attr:`subscriptions` (a Learner follows the outcome). A
        multi-process run asks before any agent exists, to know which routes a node must
        see before it publishes."""
        return cls.subscriptions

    def __init__(
        self,
        name: str | None = None,
        *,
        settings: AgentSettings | Mapping[str, Any] | None = None,
        subscribe: Sequence[str] | None = None,
        options: AgentOptions | None = None,
        fault: Fault | None = None,
        effects: Effects | None = None,
        seed: int = 0,
        provider: ModelProvider | None = None,
        prices: Prices | None = None,
    ) -> None:
        self.name = name or self.role
        self.provider = provider
        self.prices: dict[str, tuple[float, float]] = dict(prices or {})
        self._usage = UsageMeter()
        #: The budgets this agent's model calls are charged to, and the rate limiter they
        #: queue at (the runtime sets both from the scenario's ``budget`` and provider).
        self.budget: BudgetGuard | None = None
        self.rate_limiter: RateLimiter | None = None
        self.seed = seed
        self._draws: OrderedDict[str, int] = OrderedDict()  # bounded: see fault_draw_keys
        self._timeline = FaultTimeline(time.time())
        #: Inputs up to the latest this agent handled a message of: where a message that
        #: comes from no numbered input stands (see :meth:`_position`).
        self._seen = 0
        if isinstance(settings, self.Settings):
            self.settings: Any = settings
        else:
            # Raises pydantic's ValidationError; a scenario's settings were checked at load.
            self.settings = self.Settings.model_validate(dict(settings or {}))
        if subscribe is not None:
            self.subscriptions = tuple(subscribe)
        self.options = options or AgentOptions()
        self.fault = fault or Fault()
        self._effects: Effects = effects or LiveEffects()
        self.bus: Bus | None = None
        #: Where :meth:`approve` sends requests; the runtime sets it (``pantheon run``).
        self.desk: ApprovalDesk | None = None
        #: structlog over the stdlib logger ``agents.<role>``: the lines ride stdlib records
        #: (nothing on stdout before the application configures logging), and
        #: ``pantheon.telemetry.configure_logging`` adds session, agent, topic, message id.
        self.log: Any = structlog.wrap_logger(
            logging.getLogger(f"agents.{self.role}"),
            processors=[structlog.stdlib.render_to_log_kwargs],
            wrapper_class=structlog.stdlib.BoundLogger,
        )

    # -- wiring ----------------------------------------------------------------------------

    async def attach(self, bus: Bus) -> None:
        """Subscribe to the bus; called once by the runtime before any input flows."""
        if self.subscriptions and type(self).handle is Agent.handle:
            raise TypeError(
                f"{type(self).__name__} subscribes to {self.subscriptions} "
                "but does not override handle()"
            )
        self.bus = bus
        self._timeline = fault_timeline.get() or FaultTimeline(time.time())
        if self.desk is None:
            self.desk = attach_desk.get()
        opts = self.options
        for i, pattern in enumerate(self.subscriptions):
            bus.on(
                pattern,
                self._dispatch,
                name=self.name if i == 0 else f"{self.name}:{pattern}",
                concurrency=opts.concurrency,
                max_queue=opts.max_queue,
                overflow=opts.overflow,
                block_timeout=opts.block_timeout,
                retry=opts.retry,
                breaker=opts.breaker,
            )

    async def start(self) -> None:
        """Begin any background work (Observer's ingest, Monitor's sampling)."""

    async def stop(self) -> None:
        """End background work; the bus is drained after every agent has stopped."""

    async def _dispatch(self, env: Envelope) -> Any:
        bus = self.bus
        tracer = bus.tracer if bus is not None else None
        if tracer is not None and is_sampled(env.trace):
            span = tracer.span(
                f"invoke_agent {self.role}",
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.provider.name": "pantheon",
                    "gen_ai.agent.name": self.name,
                    "gen_ai.agent.id": self.name,
                    "gen_ai.conversation.id": env.session_id or "",
                    "pantheon.agent.role": self.role,
                },
            )
            if span is not None:
                token = active_tracer.set(tracer)
                try:
                    with span:
                        return await self._handle_with_faults(env)
                finally:
                    active_tracer.reset(token)
        return await self._handle_with_faults(env)

    async def _handle_with_faults(self, env: Envelope) -> Any:
        fault = self.fault
        if not (fault.failure_rate or fault.latency_ms):
            return await self.handle(env)
        token = None
        if fault.windowed:
            # Seconds depend on how fast the run went, and a replay feeds inputs without the
            # Observer's pace, so the verdict is an effect: recorded, and served on replay,
            # which then fails exactly where the recording did.
            position = self._position(env)
            seconds = time.time() - self._timeline.started
            open_ = await self.effect("fault.window", fault.applies, seconds, position)
            token = _window_open.set(bool(open_))
            if not open_:
                try:
                    return await self.handle(env)
                finally:
                    _window_open.reset(token)
        try:
            if fault.tool is None:
                payload = env.payload
                key = (
                    payload.get("email_id") or payload.get("id")
                    if isinstance(payload, dict)
                    else None
                )
                if key is None:
                    # No name in the payload: the input's number and the hop, which every
                    # run and transport agree on (an envelope id is random per process).
                    ordinal = input_ordinal(env.correlation_id)
                    key = env.id if ordinal is None else f"input {ordinal}.{env.hops}"
                await self.inject(fault, f"{env.topic}/{key}")
            return await self.handle(env)
        finally:
            if token is not None:
                _window_open.reset(token)

    def _position(self, env: Envelope) -> int:
        """Inputs taken in before the one ``env`` comes from, on this agent's timeline: its
        number (:func:`~agents._ordinals.input_ordinal`) past the inputs the timeline
        starts with. A message that comes from no numbered input (a Monitor's sample, a
        redriven dead letter, a client's own publish) has no place in the input order and
        stands at the end of the timeline as this agent has seen it: just past the latest
        input it handled a message of."""
        ordinal = input_ordinal(env.correlation_id)
        if ordinal is None:
            return self._timeline.messages + self._seen
        if ordinal >= self._seen:
            self._seen = ordinal + 1
        return self._timeline.messages + ordinal

    def fault_window_open(self) -> bool:
        """Whether the delivery being handled is inside its fault window (always, for a
        fault without one): a tool fault injected below the handler asks this."""
        return _window_open.get()

    async def inject(self, fault: Fault, key: str) -> None:
        """Apply a fault to the call identified by ``key``: latency, then maybe a failure.

        The draw depends only on (seed, agent, key, how many times this key was tried), not on
        the order messages happen to interleave, so the same seed fails the same calls, and a
        retry of a failed call gets a fresh draw. It goes through an effect, so a replay fails
        exactly where the recording did. The counts are bounded: see ``fault_draw_keys``."""
        if fault.latency_ms:
            await asyncio.sleep(fault.latency_ms / 1000)
        if fault.failure_rate:
            draws = self._draws
            tries = draws.get(key, 0) + 1
            draws[key] = tries
            draws.move_to_end(key)
            if len(draws) > self.fault_draw_keys:
                draws.popitem(last=False)
            tag = f"{self.seed}/{self.name}/{key}/{tries}"
            draw = await self.effect("fault.draw", lambda: random.Random(tag).random())
            if draw < fault.failure_rate:
                raise InjectedFault(
                    f"{self.name}: injected failure on {key} (rate {fault.failure_rate})"
                )

    async def handle(self, env: Envelope) -> Any:
        """Handle one message. Return a value to answer a request (``None`` answers nothing)."""
        return None

    # -- acting ----------------------------------------------------------------------------

    def _bus(self) -> Bus:
        if self.bus is None:
            raise RuntimeError(f"agent {self.name!r} is not attached to a bus")
        return self.bus

    async def emit(
        self, topic: str, payload: Any = None, priority: int = Priority.NORMAL
    ) -> Envelope:
        """Publish, caused by the message being handled (outside input when there is none)."""
        return await self._bus().emit(topic, payload, priority)

    async def request(self, topic: str, payload: Any = None, *, timeout: float = 5.0) -> Any:
        return await self._bus().request(topic, payload, timeout=timeout)

    @property
    def effects(self) -> Effects:
        env = current_envelope()
        if env is not None and env.context is not None:
            return env.context
        bus = self.bus
        if bus is not None and bus.context is not None:
            return bus.context
        return self._effects

    async def effect(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a side effect through the session's runner (recorded, or served on replay).

        Traced as ``execute_tool {tool}`` (``tool.reply`` is tool ``reply``); model calls
        (``model.*``) are left to the provider's own ``chat {model}`` span."""
        if active_tracer.get() is None or name.startswith("model."):
            return await self.effects.effect(name, fn, *args, **kwargs)
        tool = name.removeprefix("tool.")
        span = genai_span(
            "execute_tool",
            tool,
            {
                "gen_ai.tool.name": tool,
                "gen_ai.tool.type": "function" if name.startswith("tool.") else "extension",
                "gen_ai.agent.name": self.name,
                "pantheon.effect": name,
            },
        )
        if span is None:
            return await self.effects.effect(name, fn, *args, **kwargs)
        with span:
            return await self.effects.effect(name, fn, *args, **kwargs)

    async def chat(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> ChatResult:
        """Ask the agent's model provider (see :meth:`agents.ModelProvider.chat` for the
        arguments), as the effect ``model.<provider name>.chat``.

        What is recorded is the result's plain :meth:`~agents.ChatResult.to_dict`, and what
        is returned is rebuilt from it, so a live run and its replay see equal results; a
        replay makes no model call (and so streams nothing to ``on_token``). Every result,
        replayed or not, is counted in :attr:`usage`.

        Under a :attr:`budget`, the call is first admitted (the effect ``budget.admit``) and
        raises :class:`~agents.BudgetExceeded` once a scope is spent, publishing
        ``system.budget`` the first time a scope refuses. Under a :attr:`rate_limiter`, the
        call waits its turn inside the model effect (live only)."""
        provider = self.provider
        if provider is None:
            raise ProviderError(f"agent {self.name!r} has no model provider to chat with")
        if isinstance(provider, RuleProvider):
            refusal = provider.refusal(kwargs.get("response_format"), kwargs.get("tools"))
            if refusal is not None:
                raise ProviderError(
                    f"agent {self.name!r}: {refusal}; give the scenario a model provider "
                    "(provider: {kind: openai, base_url: ..., model: ...})"
                )
        guard = self.budget
        reserved = False
        if guard is not None:

            async def admit() -> None:
                nonlocal reserved
                await guard.admit()
                reserved = True  # set only when admitted live: a replay reserves nothing

            try:
                await self.effect(BUDGET_EFFECT, admit)
            except BudgetExceeded as exc:
                await self._refused(guard, exc)
                raise
        try:
            recorded = await self.effect(
                f"model.{provider.name}.chat",
                _recorded_chat,
                provider,
                messages,
                kwargs,
                self.rate_limiter,
            )
        except BaseException:
            if reserved:
                assert guard is not None
                guard.release()
            raise
        result = ChatResult.from_dict(recorded)
        cost = self._usage.add(result.model, result.usage, provider.model, self.prices)
        if guard is not None:
            usage = result.usage
            guard.settle(usage.input_tokens + usage.output_tokens, cost or 0.0, reserved)
        return result

    async def _refused(self, guard: BudgetGuard, exc: BudgetExceeded) -> None:
        """Count a refusal; the first in its scope is published as ``system.budget``."""
        state = await guard.count_refusal(exc.scope)
        if state is None or self.bus is None:
            return
        await self.emit("system.budget", state.as_dict() | {"agent": self.name})

    @property
    def usage(self) -> AgentUsage:
        """Model calls, tokens and cost so far, as a frozen snapshot."""
        return self._usage.snapshot(self.prices)

    async def approve(self, request: Mapping[str, Any]) -> Decision:
        """Hand an action to a person and wait for the decision (see :mod:`agents._approvals`).

        ``request`` is plain data with a one-line ``summary``. The exchange is the effect
        ``human.approval``: a replay serves the recorded decision without asking anyone. The
        scenario's ``approvals`` section bounds the wait (a timeout with a default
        decision). While it waits, the agent holds one of its ``concurrency`` slots."""
        request = check_approval_request(self.name, request)
        data = await self.effect(APPROVAL_EFFECT, self._ask_person, request)
        return Decision.from_dict(data)

    async def _ask_person(self, request: dict[str, Any]) -> dict[str, Any]:
        # Looked up here, inside the effect, so a replay (which serves the effect) needs
        # no desk at all.
        desk = self.desk
        if desk is None:
            raise ApprovalUnavailable(
                f"agent {self.name!r} asked for approval, but nobody can be asked: it has "
                "no approval desk (run it under `pantheon run`, or set agent.desk)"
            )
        return dict(await desk.ask(self.name, request))

    async def now(self) -> float:
        return await self.effects.now()

    async def random(self) -> float:
        return await self.effects.random()


#: A plain async function as an agent: ``async def on_ticket(env)`` or, to publish and run
#: effects, ``async def on_ticket(env, agent)``.
Handler = Callable[..., Awaitable[Any]]


def handler_arity(fn: Callable[..., Any]) -> int:
    """How many positional arguments a handler takes (1: the envelope; 2: and the agent);
    ``ValueError`` saying what is wrong for anything else."""
    if not inspect.iscoroutinefunction(fn):
        kind = "a generator" if inspect.isgeneratorfunction(fn) else type(fn).__name__
        raise ValueError(f"is not an async function (it is {kind}); write 'async def'")
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(params) not in (1, 2):
        raise ValueError(
            f"takes {len(params)} required arguments; a handler takes (env) or (env, agent)"
        )
    return len(params)


class FunctionAgent(Agent):
    """An agent whose handling is one async function, for one-liners in a scenario
    (``handler: "myteam.agents:on_ticket"``). The function gets the envelope, and the agent
    too if it takes two arguments (``agent.emit``, ``agent.effect``, ``agent.settings``)."""

    role = "handler"

    def __init__(
        self,
        name: str | None = None,
        *,
        handler: Handler,
        subscribe: Sequence[str],
        **kwargs: Any,
    ) -> None:
        super().__init__(name, subscribe=subscribe, **kwargs)
        self._handler = handler
        self._with_agent = handler_arity(handler) == 2

    async def handle(self, env: Envelope) -> Any:
        if self._with_agent:
            return await self._handler(env, self)
        return await self._handler(env)
