"""One agent on a real bus, for unit tests: send it messages, see what it published and which
effects (tool calls, model calls, clock, randomness) it made, with chosen effects faked.

The bus is a real in-process :class:`bus.Bus`, not a mock, so the agent is tested the way a
run drives it: its own subscriptions, mailbox, retry policy and breaker, ``emit`` causing
messages from the one being handled, requests answered by return value. Only the effect
runner differs from a run's: it records every call in memory and serves faked results for
the effect names a test chooses, so a test neither needs the helpdesk the agent calls nor
depends on the wall clock.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents import (
    Agent,
    AgentSettings,
    ApprovalDesk,
    ChatResult,
    FunctionAgent,
    Handler,
    InputOrdinals,
)
from bus import Bus, DeadLetter, Envelope, Priority, matches
from bus.testing import capture_events
from pantheon._errors import PantheonError
from pantheon.testing._scripted import Answer, ChatRequest, Ruling, ScriptedDesk, ScriptedModel

__all__ = [
    "DEFAULT_SEND_TIMEOUT",
    "AgentFailed",
    "AgentHarness",
    "Chat",
    "EffectCall",
    "RecordedEffects",
    "agent_harness",
]

#: Seconds :meth:`AgentHarness.send` waits for the agent (and whatever it set off) to finish.
#: A handler that loops or waits on something that never comes fails the test with
#: ``TimeoutError`` after this long instead of hanging it.
DEFAULT_SEND_TIMEOUT = 5.0


class AgentFailed(PantheonError, AssertionError):
    """The agent under test failed a message for good (retries exhausted, or its breaker
    open): a test failure, with each dead letter's error and traceback in the message.

    An ``AssertionError`` so pytest reports it as the test's failure; ``dead_letters`` holds
    the :class:`bus.DeadLetter` entries for a test that expects the failure and inspects it.
    """

    def __init__(self, dead_letters: Sequence[DeadLetter]) -> None:
        self.dead_letters = list(dead_letters)
        parts = [f"{len(self.dead_letters)} message(s) dead-lettered:"]
        for d in self.dead_letters:
            what = f"{d.error_type}: {d.error}" if d.error_type else d.reason
            parts.append(
                f"- {d.subscriber} on {d.envelope.topic!r} ({d.reason}, "
                f"{d.attempts} attempt(s)): {what}"
            )
            if d.traceback:
                parts.append("  " + d.traceback.rstrip().replace("\n", "\n  "))
        super().__init__("\n".join(parts))


@dataclass(frozen=True, slots=True)
class EffectCall:
    """One effect the agent made: its name (``tool.assign``, ``model.chat``, ``clock.now``),
    the arguments it passed, what came back (``result``, or the exception in ``error``) and
    whether a fake from the harness's ``effects`` answered instead of the real function."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any = None
    error: BaseException | None = None
    faked: bool = False


@dataclass(frozen=True, slots=True)
class Chat:
    """One model call the agent made, whichever provider answered: what it asked
    (``request.messages``, ``request.options``) and the answer it got."""

    request: ChatRequest
    result: ChatResult


#: What a test may give for an effect name: a value to return, an exception to raise, or a
#: callable taking the effect's own arguments (sync or async) that computes the result.
Fake = Any


async def _called(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What ``fn`` returns, awaited when it is awaitable (an effect and its fake may each be
    sync or async)."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


@dataclass
class RecordedEffects:
    """An :class:`agents.Effects` runner that calls effects for real, or fakes the ones
    named in ``fakes``, and records every call in :attr:`calls`.

    A fake that is a callable is called with the effect's arguments in place of the real
    function; an exception instance is raised; anything else is returned as it is (to return
    a callable itself, wrap it: ``lambda *a: fn``). ``clock.now`` and ``random.random`` are
    effects like the others: fake ``clock.now`` for a fixed time; randomness is seeded.
    """

    fakes: Mapping[str, Fake] = field(default_factory=dict)
    seed: int = 0
    calls: list[EffectCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    async def effect(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        faked = name in self.fakes
        try:
            if faked:
                fake = self.fakes[name]
                if isinstance(fake, BaseException):
                    raise fake
                result = await _called(fake, args, kwargs) if callable(fake) else fake
            else:
                result = await _called(fn, args, kwargs)
        except Exception as exc:
            self.calls.append(EffectCall(name, args, dict(kwargs), error=exc, faked=faked))
            raise
        self.calls.append(EffectCall(name, args, dict(kwargs), result=result, faked=faked))
        return result

    async def now(self) -> float:
        stamp: float = await self.effect("clock.now", time.time)
        return stamp

    async def random(self) -> float:
        draw: float = await self.effect("random.random", self._random.random)
        return draw


class AgentHarness:
    """One agent attached to a running bus, as :func:`agent_harness` yields it.

    Everything published on the bus is captured from the moment the agent is attached, so
    what the agent emits at ``start()`` is seen too. What the harness itself sent is kept
    apart: :meth:`published` lists only what the agent (and anything it set off) published.
    """

    def __init__(
        self, agent: Agent, bus: Bus, effects: RecordedEffects, seen: list[Envelope]
    ) -> None:
        self.agent = agent
        self.bus = bus
        self._effects = effects
        self._seen = seen  # filled by capture_events as the bus publishes
        self._sent: set[int] = set()
        # What send() publishes is the agent's outside input, numbered as an Observer
        # numbers its inputs: a ``messages`` fault window counts them.
        self._ordinals = InputOrdinals()
        self._last_dead = 0  # entry id of the newest dead letter already reported

    async def send(
        self,
        topic: str,
        payload: Any = None,
        *,
        priority: int = Priority.NORMAL,
        timeout: float = DEFAULT_SEND_TIMEOUT,
        check: bool = True,
    ) -> Envelope:
        """Publish ``payload`` on ``topic`` as outside input and wait until the agent, and
        everything its handling set off, is done with it.

        Raises :class:`AgentFailed` if a message was dead-lettered meanwhile (``check=False``
        to look at :attr:`dead_letters` instead), ``TimeoutError`` after ``timeout``."""
        env = await self.bus.emit(topic, payload, priority, id=self._ordinals.stamp(topic))
        self._sent.add(env.id)
        await self.settle(timeout=timeout, check=check)
        return env

    async def request(
        self, topic: str, payload: Any = None, *, timeout: float = DEFAULT_SEND_TIMEOUT
    ) -> Any:
        """Ask the agent (``bus.request``): its handler's return value is the answer; the
        handler's own exception is raised here if it failed for good."""
        # The request's envelope is only known inside the bus; mark it by its id once seen.
        before = len(self._seen)
        try:
            return await self.bus.request(topic, payload, timeout=timeout)
        finally:
            for env in self._seen[before:]:
                if env.topic == topic and env.causation_id is None:
                    self._sent.add(env.id)
                    break
            await self.settle(timeout=timeout, check=False)

    async def settle(self, *, timeout: float = DEFAULT_SEND_TIMEOUT, check: bool = True) -> None:
        """Wait until no message is queued or being handled (what :meth:`send` does after
        publishing), then raise :class:`AgentFailed` for new dead letters if ``check``."""
        await self.bus.drain(timeout=timeout)
        entries = self.bus.dlq.entries()
        new = [d for d in entries if d.entry_id > self._last_dead and d.reason != "shed"]
        if entries:
            self._last_dead = max(self._last_dead, entries[-1].entry_id)
        if check and new:
            raise AgentFailed(new)

    def envelopes(self, pattern: str = ">") -> list[Envelope]:
        """Envelopes published on topics matching ``pattern`` (a token pattern, as
        subscriptions take: ``ticket.*``, ``ticket.>``), in publish order, without the ones
        the harness sent."""
        return [e for e in self._seen if e.id not in self._sent and matches(pattern, e.topic)]

    def published(self, pattern: str = ">") -> list[Any]:
        """The payloads of :meth:`envelopes`: what a test usually compares."""
        return [e.payload for e in self.envelopes(pattern)]

    @property
    def effects(self) -> list[EffectCall]:
        """Every effect the agent made, in order."""
        return list(self._effects.calls)

    def calls(self, name: str) -> list[EffectCall]:
        """The effects named ``name`` (``tool.assign``), in order."""
        return [c for c in self._effects.calls if c.name == name]

    @property
    def chats(self) -> list[Chat]:
        """Every model call the agent made and got an answer to, in order, whichever
        provider answered (a scripted model, a :class:`ModelServer`, a faked effect)."""
        return [
            Chat(ChatRequest([dict(m) for m in c.args[1]], dict(c.args[2])),
                 ChatResult.from_dict(c.result))
            for c in self._effects.calls
            if c.name.startswith("model.") and c.error is None
        ]  # fmt: skip

    @property
    def approvals(self) -> list[dict[str, Any]]:
        """The approval requests the agent made, in order (with a scripted desk, or the
        ``human.approval`` effect faked)."""
        return [dict(c.args[0]) for c in self._effects.calls if c.name == "human.approval"]

    @property
    def dead_letters(self) -> list[DeadLetter]:
        """Messages the bus could not deliver (failed, breaker open, shed...)."""
        return self.bus.dlq.entries()


@contextlib.asynccontextmanager
async def agent_harness(
    agent: type[Agent] | Agent | Handler,
    *,
    name: str | None = None,
    settings: AgentSettings | Mapping[str, Any] | None = None,
    subscribe: Sequence[str] | None = None,
    effects: Mapping[str, Fake] | None = None,
    model: Answer | Sequence[Answer] | Callable[..., Answer] | None = None,
    approvals: Ruling | Sequence[Ruling] | Callable[..., Ruling] | ApprovalDesk | None = None,
    seed: int = 0,
    bus: Bus | None = None,
    **kwargs: Any,
) -> AsyncIterator[AgentHarness]:
    """Run one agent on a fresh in-process bus for the length of the block::

        async with agent_harness(Router, effects={"tool.assign": {"url": "..."}}) as h:
            await h.send("ticket.triaged", {"id": "T-1", ...})
        assert h.published("ticket.routed") == [...]
        assert [c.args for c in h.calls("tool.assign")] == [("T-1", "billing")]

    ``agent`` is an :class:`agents.Agent` subclass (built with ``name``, ``settings`` (a
    mapping is checked against its ``Settings`` model, as a scenario's are), ``subscribe``
    and ``kwargs``), an agent already built, or an async handler function (run as a
    :class:`agents.FunctionAgent`; give ``subscribe``). ``effects`` fakes effects by name
    (see :class:`RecordedEffects`); every effect is recorded either way.

    An agent that chats gets its answers from ``model``: a :class:`ScriptedModel` script
    (text, a mapping for JSON answers, a list of them, one per call, or a callable), no
    provider needed; or from ``provider=`` (an ``OpenAIProvider`` on a
    :class:`ModelServer`'s ``base_url``). :attr:`AgentHarness.chats` lists what it asked
    and got. An agent that asks for approval gets its decisions from ``approvals``: a
    :class:`ScriptedDesk` script (``True``, ``False``, ``(approved, note)``, a list of
    them, or a callable) or any :class:`agents.ApprovalDesk`; :attr:`AgentHarness.approvals`
    lists what it asked. ``bus`` is a
    :class:`bus.Bus` to use instead of a new one (a ``FakeClock``, a small ``dlq_size``);
    the harness starts and closes it.

    The agent is attached and started on entry, stopped and the bus drained on exit, so
    background work (``start()``) runs as in a scenario. What was captured stays readable
    after the block.
    """
    recorder = RecordedEffects(dict(effects or {}), seed)
    if model is not None and "provider" in kwargs:
        raise TypeError("agent_harness takes model= (scripted answers) or provider=, not both")
    if isinstance(agent, Agent):
        if name is not None or settings is not None or subscribe is not None or kwargs:
            raise TypeError(
                "agent_harness got an agent already built: give name, settings, subscribe "
                "and other arguments to its constructor, or pass the class"
            )
        instance = agent
    elif isinstance(agent, type):
        if not issubclass(agent, Agent):
            raise TypeError(f"agent_harness takes an Agent subclass; {agent.__name__} is not one")
        instance = agent(
            name,
            settings=settings,
            subscribe=subscribe,
            effects=recorder,
            seed=seed,
            **kwargs,
        )
    elif callable(agent):
        if not subscribe:
            raise TypeError("a handler function needs subscribe=[...]: the topics it handles")
        instance = FunctionAgent(
            name or getattr(agent, "__name__", None),
            handler=agent,
            subscribe=subscribe,
            settings=settings,
            effects=recorder,
            seed=seed,
            **kwargs,
        )
    else:
        raise TypeError(
            f"agent_harness takes an Agent subclass, an Agent or an async handler, "
            f"not {type(agent).__name__}"
        )
    # Set on the agent whichever way it was built: they are its outside world, not settings.
    if model is not None:
        instance.provider = ScriptedModel(model)
    if approvals is not None:
        instance.desk = (
            approvals if isinstance(approvals, ApprovalDesk) else ScriptedDesk(approvals)
        )
    the_bus = bus if bus is not None else Bus()
    # On the bus, not only the agent: every envelope carries the bus's context, and an agent
    # reads its effect runner from the envelope it is handling (as in a recorded run).
    the_bus.context = recorder
    async with the_bus:
        with capture_events(the_bus) as seen:
            harness = AgentHarness(instance, the_bus, recorder, seen)
            await instance.attach(the_bus)
            await instance.start()
            try:
                yield harness
            except BaseException:
                # The test already failed: stop without waiting on a drain that might hang
                # behind the failure; closing the bus dead-letters what is left.
                await instance.stop()
                raise
            await instance.stop()
            await harness.settle(check=False)
