"""Glob routing agrees with fnmatch.fnmatchcase; the route cache is bounded and kept fresh."""

from __future__ import annotations

import fnmatch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus import Bus, Envelope
from bus._topics import GlobIndex, is_literal, literal_prefix

# A small alphabet so random topics and patterns actually collide: letters, dots, and every
# glob construct (``*``, ``?``, ``[seq]``, ``[!seq]``, ranges, a stray ``]`` or ``!``).
_SEGMENT = st.text(alphabet="abc", min_size=0, max_size=3)
_TOPICS = st.lists(_SEGMENT, min_size=1, max_size=4).map(".".join)
_PATTERN_PIECES = st.sampled_from(
    ["a", "b", "c", ".", "*", "?", "[ab]", "[!a]", "[a-b]", "[!.]", "[.]", "]", "!", "a.*", "*."]
)
_PATTERNS = st.lists(_PATTERN_PIECES, min_size=0, max_size=6).map("".join) | _TOPICS


@settings(max_examples=400, deadline=None)
@given(
    patterns=st.lists(_PATTERNS, min_size=0, max_size=12),
    topics=st.lists(_TOPICS | _PATTERNS, min_size=1, max_size=12),
)
def test_index_resolve_agrees_with_fnmatchcase(patterns: list[str], topics: list[str]) -> None:
    index: GlobIndex[int] = GlobIndex()
    for i, pattern in enumerate(patterns):
        index.add(pattern, i)
    for topic in topics:
        expected = [i for i, p in enumerate(patterns) if fnmatch.fnmatchcase(topic, p)]
        # Same items, and in subscription order whatever bucket each pattern sits in.
        assert index.resolve(topic) == expected, topic


@settings(max_examples=200, deadline=None)
@given(
    patterns=st.lists(_PATTERNS, min_size=1, max_size=10),
    removed=st.sets(st.integers(min_value=0, max_value=9)),
    topics=st.lists(_TOPICS, min_size=1, max_size=8),
)
def test_index_after_removals_agrees_with_fnmatchcase(
    patterns: list[str], removed: set[int], topics: list[str]
) -> None:
    index: GlobIndex[int] = GlobIndex()
    for i, pattern in enumerate(patterns):
        index.add(pattern, i)
    for i in sorted(removed):
        if i < len(patterns):
            index.remove(patterns[i], i)
    kept = [(i, p) for i, p in enumerate(patterns) if i not in removed]
    assert sorted(index.items()) == [i for i, _ in kept]
    for topic in topics:
        assert index.resolve(topic) == [i for i, p in kept if fnmatch.fnmatchcase(topic, p)]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    patterns=st.lists(_PATTERNS, min_size=1, max_size=6),
    topics=st.lists(_TOPICS, min_size=1, max_size=8),
)
async def test_delivery_agrees_with_fnmatchcase(patterns: list[str], topics: list[str]) -> None:
    got: dict[int, list[str]] = {i: [] for i in range(len(patterns))}
    async with Bus() as b:
        for i, pattern in enumerate(patterns):
            b.on(pattern, lambda env, i=i: got[i].append(env.topic), name=f"s{i}")
        for topic in topics:
            await b.emit(topic)
        await b.drain()
    for i, pattern in enumerate(patterns):
        assert got[i] == [t for t in topics if fnmatch.fnmatchcase(t, pattern)], pattern


def test_star_crosses_dots_and_is_case_sensitive() -> None:
    index: GlobIndex[str] = GlobIndex()
    for p in ["observation.email.*", "observation.*", "*", "*.received", "Observation.*"]:
        index.add(p, p)
    assert index.resolve("observation.email.received") == [
        "observation.email.*",
        "observation.*",
        "*",
        "*.received",
    ]
    assert index.resolve("observation") == ["*"]


def test_literal_prefix_and_is_literal() -> None:
    assert is_literal("a.b.c")
    assert not is_literal("a.*") and not is_literal("a?") and not is_literal("a[bc]")
    assert literal_prefix("tenant.events.*") == "tenant.events."
    assert literal_prefix("a[bc].*") == "a"
    assert literal_prefix("*.created") == ""
    assert literal_prefix("plain") == "plain"


async def test_route_cache_is_bounded_and_topic_counts_survive_eviction() -> None:
    async with Bus(route_cache=3) as b:
        got: list[str] = []
        b.on("t.*", lambda env: got.append(env.topic), name="all")
        topics = [f"t.{i}" for i in range(20)]
        for round_ in range(3):
            for topic in topics:
                await b.emit(topic, round_)
                assert len(b._routes.cache) <= 3
        await b.drain()
        stats = b.stats()
    assert got == topics * 3
    assert {t: s.published for t, s in stats.topics.items()} == dict.fromkeys(topics, 3)
    assert stats.published == 60


async def test_a_topic_seen_before_a_subscription_reaches_the_new_subscriber(
    bus: Bus,
) -> None:
    first: list[str] = []
    second: list[str] = []
    bus.on("news.*", lambda env: first.append(env.payload), name="first")
    await bus.emit("news.sport", "before")  # the route for news.sport is now cached
    bus.on("news.sport", lambda env: second.append(env.payload), name="second")
    await bus.emit("news.sport", "after")
    await bus.drain()
    assert first == ["before", "after"]
    assert second == ["after"]


async def test_a_topic_seen_with_no_subscriber_reaches_a_later_one(bus: Bus) -> None:
    got: list[Envelope] = []
    await bus.emit("lonely")
    bus.on("lon*", got.append, name="late")
    sent = await bus.emit("lonely")
    await bus.drain()
    assert got == [sent]


async def test_unsubscribing_drops_the_cached_route(bus: Bus) -> None:
    kept: list[str] = []
    gone: list[str] = []
    bus.on("x.*", lambda env: kept.append(env.payload), name="kept")
    bus.on("x.y", lambda env: gone.append(env.payload), name="gone")
    await bus.emit("x.y", 1)
    await bus.drain()
    await bus.off("gone")
    await bus.emit("x.y", 2)
    await bus.drain()
    assert kept == [1, 2]
    assert gone == [1]


def test_route_cache_must_hold_at_least_one_route() -> None:
    with pytest.raises(ValueError, match="route_cache"):
        Bus(route_cache=0)


async def test_route_cache_of_one_still_routes_correctly() -> None:
    async with Bus(route_cache=1) as b:
        got: list[str] = []
        b.on("*", lambda env: got.append(env.topic), name="all")
        for topic in ["a", "b", "a", "c", "b"]:
            await b.emit(topic)
        await b.drain()
        assert {t: s.published for t, s in b.stats().topics.items()} == {"a": 2, "b": 2, "c": 1}
    assert got == ["a", "b", "a", "c", "b"]
