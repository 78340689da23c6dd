"""Token routing: ``*`` is one token, ``>`` the rest; the trie agrees with a reference matcher,
refuses old globs with the spelling to use, and stays correct under incremental add/remove;
the route cache is bounded and kept fresh."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bus as bus_pkg
from bus import Bus, Envelope, InProcessHub, InProcessTransport, matches, validate_pattern
from bus._topics import GlobIndex, is_literal, literal_prefix


def reference(pattern: str, topic: str) -> bool:
    """The semantics written as a regular expression, independently of the trie: ``*`` is any
    run without a dot, ``>`` (last) is a dot followed by anything, i.e. one or more tokens."""
    tokens = pattern.split(".")
    body = r"\.".join("[^.]*" if t == "*" else re.escape(t) for t in tokens if t != ">")
    if tokens[-1] == ">":
        body = ".*" if len(tokens) == 1 else body + r"\..*"
    return re.fullmatch(body, topic, re.DOTALL) is not None


# A small alphabet so random topics and patterns collide: literal tokens, ``*`` and a final
# ``>``. Topics may hold an empty token or a literal ``*``/``>``: a topic is split at its dots
# whatever it contains, and the two matchers must still agree.
_TOKEN = st.sampled_from(["a", "b", "c"])
_TOPIC_TOKEN = st.sampled_from(["a", "b", "c", "", "*", ">"])
_TOPICS = st.lists(_TOPIC_TOKEN, min_size=1, max_size=5).map(".".join)
_PATTERNS = st.builds(
    lambda tokens, rest: ".".join(tokens + ([">"] if rest else [])),
    st.lists(_TOKEN | st.just("*"), min_size=0, max_size=4),
    st.booleans(),
).filter(lambda p: p not in ("", "*"))


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("a.b.c", "a.b.c", True),
        ("a.b.c", "a.b", False),
        ("a.b", "A.b", False),  # case-sensitive
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),  # '*' no longer crosses dots
        ("a.*", "a", False),
        ("*.b", "a.b", True),
        ("*.b", "b", False),
        ("a.*.c", "a.x.c", True),
        ("a.*.c", "a.x.y.c", False),
        ("*.*", "a.b", True),
        ("*.*", "a.b.c", False),
        ("a.>", "a.b", True),
        ("a.>", "a.b.c.d", True),
        ("a.>", "a", False),  # '>' is one or more tokens
        ("a.>", "ab.c", False),
        (">", "a", True),
        (">", "a.b.c", True),
        ("*.>", "a", False),
        ("*.>", "a.b", True),
        ("a.*.>", "a.b.c", True),
        ("a.*.>", "a.b", False),
        ("observation.email.*", "observation.email.received", True),
        ("observation.*", "observation.email.received", False),
    ],
)
def test_token_semantics(pattern: str, topic: str, expected: bool) -> None:
    assert matches(pattern, topic) is expected
    assert reference(pattern, topic) is expected
    index: GlobIndex[str] = GlobIndex()
    index.add(pattern, pattern)
    assert index.resolve(topic) == ([pattern] if expected else [])


@settings(max_examples=400, deadline=None)
@given(
    patterns=st.lists(_PATTERNS, min_size=0, max_size=12),
    topics=st.lists(_TOPICS, min_size=1, max_size=12),
)
def test_index_resolve_agrees_with_reference(patterns: list[str], topics: list[str]) -> None:
    index: GlobIndex[int] = GlobIndex()
    for i, pattern in enumerate(patterns):
        index.add(pattern, i)
    for topic in topics:
        expected = [i for i, p in enumerate(patterns) if reference(p, topic)]
        # Same items, and in subscription order whatever branch each pattern sits in.
        assert index.resolve(topic) == expected, topic
        assert [i for i, p in enumerate(patterns) if matches(p, topic)] == expected


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(st.tuples(st.booleans(), _PATTERNS), min_size=1, max_size=40),
    topics=st.lists(_TOPICS, min_size=1, max_size=8),
)
def test_incremental_add_remove_agrees_with_reference(
    ops: list[tuple[bool, str]], topics: list[str]
) -> None:
    """Interleaved adds and removes (of present and absent entries) keep the index equal to
    one built from scratch, checked after every step; removing everything empties the trie."""
    index: GlobIndex[str] = GlobIndex()
    live: list[tuple[str, str]] = []  # (pattern, item) in add order
    for n, (add, pattern) in enumerate(ops):
        if add or not live:
            item = f"{pattern}#{n}"
            index.add(pattern, item)
            live.append((pattern, item))
        else:
            gone = next(((p, i) for p, i in live if p == pattern), live[0])
            index.remove(*gone)
            index.remove(*gone)  # a second removal of the same pair changes nothing
            live.remove(gone)
        index.remove(pattern, "never-added")
        assert sorted(index.items()) == sorted(i for _, i in live)
        for topic in topics:
            assert index.resolve(topic) == [i for p, i in live if reference(p, topic)], topic
    for pattern, item in live:
        index.remove(pattern, item)
    assert list(index.items()) == []
    assert index._root.empty() and not index._literal and not index._wild


def test_resolve_returns_items_in_subscription_order() -> None:
    index: GlobIndex[str] = GlobIndex()
    for p in ["observation.email.*", ">", "observation.>", "*.email.received", "Observation.>"]:
        index.add(p, p)
    index.add("observation.email.received", "literal")
    assert index.resolve("observation.email.received") == [
        "observation.email.*",
        ">",
        "observation.>",
        "*.email.received",
        "literal",
    ]
    assert index.resolve("observation") == [">"]


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("*", "topic pattern '*' matches only one-token topics"),
        ("*", "use '>' for every topic"),
        ("", "empty topic pattern: use '>' for every topic"),
        ("email*", "use 'email.>' for any number of tokens after 'email'"),
        ("observation.email*", "use 'observation.email.>' for any number of tokens after 'email'"),
        ("email**", "use 'email.>'"),
        ("email.*-urgent", "a wildcard must be a whole token"),
        ("email.*-urgent", "subscribe to 'email.*' and keep the tokens you want with filter="),
        ("*x", "subscribe to '>' and keep the tokens you want"),
        ("a.b>", "a wildcard must be a whole token"),
        ("a.>.b", "'>' must be the last token"),
        ("a..b", "has an empty token"),
        (".a", "has an empty token"),
        ("a.", "has an empty token"),
        ("sys?em.x", "'?' and '[...]' are not wildcards"),
        ("sys?em.x", "or use '*.x' with a filter"),
        ("[ab].x", "'?' and '[...]' are not wildcards"),
    ],
)
def test_refused_patterns_say_why_and_what_to_write(pattern: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        validate_pattern(pattern)
    with pytest.raises(ValueError, match=re.escape(message)):
        matches(pattern, "a.b")  # a filter with a bad pattern fails loudly, never matches nothing
    with pytest.raises(ValueError, match=re.escape(message)):
        GlobIndex().add(pattern, 1)


def test_a_pattern_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="a topic pattern must be a str, got int"):
        validate_pattern(3)  # type: ignore[arg-type]


async def test_bus_refuses_an_old_glob_at_subscribe_and_registers_nothing(bus: Bus) -> None:
    with pytest.raises(ValueError, match=re.escape("use 'email.>' for any number of tokens")):
        bus.on("email*", lambda env: None, name="old")
    with pytest.raises(ValueError, match=re.escape("use '>' for every topic")):

        @bus.on("*", name="decorated")
        def everything(env: Envelope) -> None: ...

    assert bus.subscriptions() == {}
    bus.on("email.>", lambda env: None, name="old")  # the name was never taken


def test_validate_pattern_and_matches_are_public() -> None:
    assert {"matches", "validate_pattern"} <= set(bus_pkg.__all__)
    validate_pattern("a.*.>")  # valid: no error


def test_literal_prefix_and_is_literal() -> None:
    assert is_literal("a.b.c")
    assert not is_literal("a.*") and not is_literal("a.>") and not is_literal(">")
    assert is_literal("a*b")  # not a wildcard token (validate_pattern refuses it)
    assert literal_prefix("tenant.events.*") == "tenant.events."
    assert literal_prefix("a.*.c") == "a."
    assert literal_prefix("a.b.>") == "a.b."
    assert literal_prefix("*.created") == ""
    assert literal_prefix("plain.topic") == "plain.topic"


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    patterns=st.lists(_PATTERNS, min_size=1, max_size=6),
    topics=st.lists(_TOPICS, min_size=1, max_size=8),
)
async def test_delivery_agrees_with_reference(patterns: list[str], topics: list[str]) -> None:
    got: dict[int, list[str]] = {i: [] for i in range(len(patterns))}
    async with Bus() as b:
        for i, pattern in enumerate(patterns):
            b.on(pattern, lambda env, i=i: got[i].append(env.topic), name=f"s{i}")
        for topic in topics:
            await b.emit(topic)
        await b.drain()
    for i, pattern in enumerate(patterns):
        assert got[i] == [t for t in topics if reference(pattern, t)], pattern


async def test_runtime_subscribes_reach_a_hub_peer_and_unsubscribes_leave_it() -> None:
    """The in-process hub reads a bus's advertisement lazily: every subscription made on the
    running bus is visible to a peer's next publish, and one removed is gone from it."""
    hub = InProcessHub()
    async with (
        Bus(transport=InProcessTransport(hub)) as a,
        Bus(transport=InProcessTransport(hub)) as b,
    ):
        got: list[str] = []
        assert not a.transport.has_remote("t5.x")
        for i in range(20):
            b.on(f"t{i}.*", lambda env: got.append(env.topic), name=f"t{i}")
        b.on("deep.>", lambda env: got.append(env.topic), name="deep")
        assert a.transport.has_remote("t5.x") and a.transport.has_remote("deep.a.b")
        assert not a.transport.has_remote("t5.x.y") and not a.transport.has_remote("deep")
        await a.emit("t5.x")
        await a.emit("deep.a.b")
        await a.emit("t5.x.y")  # nobody: '*' is one token
        await a.drain()
        await b.drain()
        await b.off("t5")
        assert not a.transport.has_remote("t5.x")
        assert a.transport.has_remote("t6.x")
    assert got == ["t5.x", "deep.a.b"]


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
    bus.on("lonely", got.append, name="late")
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
        b.on(">", lambda env: got.append(env.topic), name="all")
        for topic in ["a", "b", "a", "c", "b"]:
            await b.emit(topic)
        await b.drain()
        assert {t: s.published for t, s in b.stats().topics.items()} == {"a": 2, "b": 2, "c": 1}
    assert got == ["a", "b", "a", "c", "b"]
