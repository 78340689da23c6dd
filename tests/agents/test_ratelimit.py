"""Client-side rate limits: calls over the limit wait their turn, first come first served,
and no window of the limiter's own clock ever holds more than the limit (measured on that
clock, so a slow machine can only make the calls sparser, never fail the check)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest
from budget_session import REPLY, TICKETS, budget_scenario, budget_team

from agents import Agent, AnthropicProvider, OpenAIProvider, RateLimit, RateLimiter
from bus.testing import FakeClock
from pantheon.runner._build import build_team
from pantheon.scenario import ScenarioError, parse_scenario
from pantheon.testing import ModelServer, assert_replays, run_scenario


class Stamped(RateLimiter):
    """Keeps the time, on the limiter's clock, at which every call was admitted."""

    __slots__ = ("times",)

    def __init__(self, limit: RateLimit) -> None:
        super().__init__(limit)
        self.times: list[float] = []

    async def acquire(self) -> list[float]:
        entry = await super().acquire()
        self.times.append(entry[0])
        return entry


async def test_r_requests_per_window_hold_over_a_bounded_run_against_a_model_server() -> None:
    r, window, calls = 4, 0.25, 17
    limiter = Stamped(RateLimit(requests=r, window=window))
    with ModelServer(reply="ok") as server:
        async with OpenAIProvider(server.base_url, model="stand-in") as provider:
            agent = Agent("asker", provider=provider)
            agent.rate_limiter = limiter
            await asyncio.gather(
                *(agent.chat([{"role": "user", "content": f"q{i}"}]) for i in range(calls))
            )
        assert len(server.requests) == calls
    times = limiter.times
    assert len(times) == calls and times == sorted(times)
    # No window of the limiter's clock holds more than R calls ...
    assert all(times[i + r] - times[i] >= window for i in range(calls - r))
    # ... so over the run the rate is at most R per window (within 10%), and calls waited.
    windows = (times[-1] - times[0]) / window
    assert (calls - 1) / windows <= r * 1.1
    # Not exactly calls - r waited: on a loaded machine a call can reach the limiter after
    # a window has passed (it then goes at once).
    assert limiter.admitted == calls and limiter.waited > 0


async def test_the_anthropic_provider_holds_r_per_window_and_a_429_waits_its_retry_after() -> None:
    """The same limiter in front of the Messages API: no window of R over the run, and a 429
    the server still sends is retried by the SDK after its Retry-After, inside the call's
    turn (the call is admitted once)."""
    r, window, calls = 3, 0.25, 13
    limiter = Stamped(RateLimit(requests=r, tokens=10_000, window=window))
    with ModelServer(reply="ok") as server:
        server.fail_next(429, retry_after=0.05)
        async with AnthropicProvider(
            server.anthropic_base_url, model="claude-test", max_retries=2
        ) as provider:
            agent = Agent("asker", provider=provider)
            agent.rate_limiter = limiter
            await asyncio.gather(
                *(agent.chat([{"role": "user", "content": f"q{i}"}]) for i in range(calls))
            )
        statuses = [request.status for request in server.requests]
        assert all(request.path == "/v1/messages" for request in server.requests)
    assert statuses.count(429) == 1 and statuses.count(200) == calls
    times = limiter.times
    assert len(times) == calls and times == sorted(times)
    assert all(times[i + r] - times[i] >= window for i in range(calls - r))
    windows = (times[-1] - times[0]) / window
    assert (calls - 1) / windows <= r * 1.1
    # How many waited depends on when each call reached the limiter (the SDK's client is
    # made by the first): some did, since 13 calls went out within one window.
    assert limiter.admitted == calls and limiter.waited > 0


async def test_tokens_per_window_hold_a_call_until_enough_tokens_left_the_window() -> None:
    clock = FakeClock()
    limiter = RateLimiter(RateLimit(tokens=10, window=1.0), clock)
    first = await limiter.acquire()
    limiter.settle(first, 6)
    await clock.advance(0.5)
    second = await limiter.acquire()  # 6 < 10 tokens in the window: goes at once
    limiter.settle(second, 6)
    third = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    assert not third.done() and clock.sleepers == 1  # 12 tokens in the window: it waits
    await clock.advance(0.49)
    assert not third.done()
    await clock.advance(0.01)  # the first call leaves the window at t=1.0
    entry = await third
    assert entry[0] == 1.0 and limiter.waited == 1


async def test_waiting_calls_go_in_the_order_they_asked() -> None:
    clock = FakeClock()
    limiter = RateLimiter(RateLimit(requests=1, window=1.0), clock)
    order: list[int] = []

    async def call(i: int) -> None:
        await limiter.acquire()
        order.append(i)

    tasks = [asyncio.ensure_future(call(i)) for i in range(4)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert order == [0]
    for _ in range(3):
        await clock.advance(1.0)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3]


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="requests must be at least 1"):
        RateLimit(requests=0)
    with pytest.raises(ValueError, match="window must be positive"):
        RateLimit(requests=1, window=0)


SCENARIO = """\
version: 1
name: limited
provider:
  kind: openai
  base_url: http://127.0.0.1:1/v1
  model: stand-in
  rate_limit: {rate}
input: {{kind: jsonl, path: t.jsonl, topic: ticket.received}}
agents:
  memory: {{}}
  guardian: {{}}
"""


def test_the_provider_sections_rate_limit_is_one_limiter_the_team_shares() -> None:
    scenario = parse_scenario(
        SCENARIO.format(rate="{requests_per_minute: 60, tokens_per_minute: 9000}"),
        check_files=False,
    )
    team = build_team(scenario, replay=True)
    limiters = {id(a.rate_limiter) for a in team.agents.values()}
    assert len(limiters) == 1
    limiter = next(iter(team.agents.values())).rate_limiter
    assert limiter is not None
    assert limiter.limit == RateLimit(requests=60, tokens=9000, window=60.0)


def test_an_anthropic_provider_section_takes_the_same_rate_limit() -> None:
    text = SCENARIO.format(rate="{requests_per_minute: 50, window: 2}").replace(
        "kind: openai\n  base_url: http://127.0.0.1:1/v1",
        "kind: anthropic\n  base_url: http://127.0.0.1:1",
    )
    team = build_team(parse_scenario(text, check_files=False), replay=True)
    limiters = {id(a.rate_limiter) for a in team.agents.values()}
    limiter = next(iter(team.agents.values())).rate_limiter
    assert len(limiters) == 1 and limiter is not None
    assert limiter.limit == RateLimit(requests=50, tokens=None, window=2.0)
    assert isinstance(team.provider, AnthropicProvider)


def test_a_rate_limit_without_a_limit_is_a_located_error() -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(textwrap.dedent(SCENARIO.format(rate="{window: 2}")), check_files=False)
    text = str(info.value)
    assert text.endswith(
        "<string>:7:3: provider.rate_limit: a rate limit needs requests_per_minute, "
        "tokens_per_minute or both"
    )


def test_a_rate_limited_team_run_makes_every_call_and_replays(tmp_path: Path) -> None:
    team = budget_team(tmp_path / "team")
    path = budget_scenario(
        team, "agents: {}", 'asker: {class: "budget_team_mod:Asker", concurrency: 4}'
    )
    text = path.read_text(encoding="utf-8").replace(
        "model: stand-in}",
        "model: stand-in, rate_limit: {requests_per_minute: 8, window: 0.1}}",
    )
    path.write_text(text, encoding="utf-8")
    with ModelServer(reply=REPLY) as server:
        summary = run_scenario(path, provider=server)
        assert len(server.requests) == TICKETS
    assert summary.usage["calls"] == TICKETS and not summary.dlq
    assert_replays(summary)  # the limiter waits only live: the replay serves every answer
