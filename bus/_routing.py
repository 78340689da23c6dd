"""Which subscriptions a topic reaches: the pattern index and the per-topic route cache.

The index stays behind :class:`~bus._topics.GlobIndex`'s four calls (``add``, ``remove``,
``resolve``, ``items``), so a different matcher (a token trie) can replace it without this
module's users noticing. A resolved route is cached per topic until subscriptions change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from bus._subscription import Subscription
from bus._topics import GlobIndex, matches

__all__ = ["DEFAULT_ROUTE_CACHE", "MAX_TOPIC_STATS", "Route", "Routes"]

#: Distinct topics whose routes are cached. Past this the oldest route is dropped (its
#: per-topic count is folded into the totals first), so high-cardinality topics cost a
#: bounded amount of memory.
DEFAULT_ROUTE_CACHE = 10_000
#: Per-topic publish counters kept in the snapshot; the rest are summed under ``"<other>"``.
MAX_TOPIC_STATS = 10_000


class Route:
    """One topic's subscriptions, resolved once, and how many messages it carried."""

    __slots__ = ("inbound", "published", "remote", "single", "subs")

    def __init__(
        self,
        subs: tuple[Subscription, ...],
        remote: bool,
        leaving: tuple[Subscription, ...],
        fed: tuple[Subscription, ...] = (),
    ) -> None:
        #: What a message published here reaches in memory (the transport's ``fed`` are
        #: reached only through it).
        self.subs = subs
        self.remote = remote
        self.published = 0
        #: What a message from another bus may reach: ``subs``, those the transport feeds,
        #: and subscriptions that ``off()`` is removing, which other buses may still route
        #: to until they know.
        self.inbound = subs + fed + leaving if leaving or fed else subs
        #: The one subscription of a topic that has exactly one and nothing leaving or fed
        #: by the transport: a message then needs no loop and no name check.
        self.single = subs[0] if len(subs) == 1 and not leaving and not fed else None


class Routes:
    """The index of subscriptions by pattern, and the cache of routes by topic.

    ``cache`` is read directly by the bus's hot path (``routes.cache.get(topic)``); on a
    miss, :meth:`resolve`. ``has_remote(topic)`` asks the transport whether another bus
    subscribes too."""

    __slots__ = ("_index", "_leaving", "cache", "fed", "has_remote", "size", "topic_counts")

    def __init__(
        self, size: int, has_remote: Callable[[str], bool], fed: frozenset[str] = frozenset()
    ) -> None:
        if size < 1:
            raise ValueError(f"route_cache must be >= 1, got {size}")
        self._index: GlobIndex[Subscription] = GlobIndex()
        self._leaving: dict[str, Subscription] = {}
        # OrderedDict, not dict: evicting the oldest of a plain dict with next(iter()) scans
        # past every deleted slot at its front (2-10 µs per miss once the cache is full).
        self.cache: OrderedDict[str, Route] = OrderedDict()
        self.size = size
        self.has_remote = has_remote
        #: Subscription names the transport feeds (see ``Transport.fed_remotely``).
        self.fed = fed
        self.topic_counts: dict[str, int] = {}

    def add(self, sub: Subscription) -> None:
        self._index.add(sub.pattern, sub)
        self.changed()

    def leave(self, sub: Subscription) -> None:
        """``off()`` began: no new local messages, but other buses' still arrive (inbound)."""
        self._index.remove(sub.pattern, sub)
        self._leaving[sub.name] = sub
        self.changed()

    def left(self, sub: Subscription) -> None:
        self._leaving.pop(sub.name, None)
        self.changed()

    def leaving(self, name: str) -> bool:
        return name in self._leaving

    def subscriptions(self) -> Iterable[Subscription]:
        """Every subscription the index holds (``off()`` removes one before it is gone)."""
        return self._index.items()

    def changed(self) -> None:
        """Subscriptions or remote routes changed: forget every route, keep the counts."""
        for topic, route in self.cache.items():
            self._fold(topic, route.published)
        self.cache.clear()

    def resolve(self, topic: str) -> Route:
        leaving = self._leaving
        subs = tuple(self._index.resolve(topic))
        fed = self.fed
        route = Route(
            tuple(s for s in subs if s.name not in fed) if fed else subs,
            self.has_remote(topic),
            tuple(s for s in leaving.values() if matches(s.pattern, topic)) if leaving else (),
            tuple(s for s in subs if s.name in fed) if fed else (),
        )
        cache = self.cache
        if len(cache) >= self.size:
            old_topic, old_route = cache.popitem(last=False)
            self._fold(old_topic, old_route.published)
        cache[topic] = route
        return route

    def counts(self) -> dict[str, int]:
        """Messages published per topic, cached routes included."""
        topics = dict(self.topic_counts)
        for topic, route in self.cache.items():
            if route.published:
                topics[topic] = topics.get(topic, 0) + route.published
        return topics

    def _fold(self, topic: str, count: int) -> None:
        if not count:
            return
        counts = self.topic_counts
        if topic in counts or len(counts) < MAX_TOPIC_STATS:
            counts[topic] = counts.get(topic, 0) + count
        else:
            counts["<other>"] = counts.get("<other>", 0) + count
