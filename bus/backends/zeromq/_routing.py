"""Who else is there, and which of them a topic's messages go to from this node.

The :class:`Directory` keeps the broker's latest listing of the other nodes (one
:class:`~bus.backends.zeromq._outbound.PeerLink` each), an index of every subscription by
pattern (this node's and theirs: ``bus._topics`` token matching, the same rules as the
bus's own routes), and a cache of resolved routes per topic. For every consumer group
(subscriptions of one name) that matches a topic it picks one member node, the one it has
the least unsettled work with (round robin on ties). A group with a member on this node
itself is served here, locally, zero copy, so it has no route.
"""

from __future__ import annotations

import logging

from bus._topics import GlobIndex
from bus.backends.zeromq._outbound import PeerLink
from bus.backends.zeromq._wire import PeerInfo, peer_problem

__all__ = ["Directory", "Route"]

_log = logging.getLogger("bus.zeromq.node")

#: Topics whose routes are cached at most; past it the cache starts again (topics are few
#: in practice; a topic per message would otherwise grow it without bound).
_ROUTES_MAX = 10_000


class _Member:
    __slots__ = ("name", "pattern", "peer")

    def __init__(self, peer: PeerLink | None, name: str, pattern: str) -> None:
        self.peer = peer  # None: a subscription of this node
        self.name = name
        self.pattern = pattern


class Route:
    """Where a topic's messages go from here: per remote consumer group, its member peers.
    ``single`` is the common case precomputed: one group, one member, and the names to send
    (``None`` when that peer has no other matching subscription)."""

    __slots__ = ("groups", "per_peer", "single", "single_names")

    def __init__(self, groups: dict[str, list[PeerLink]], per_peer: dict[PeerLink, int]) -> None:
        self.groups = groups
        self.per_peer = per_peer
        self.single: PeerLink | None = None
        self.single_names: list[str] | None = None
        if len(groups) == 1:
            ((name, peers),) = groups.items()
            if len(peers) == 1:
                self.single = peers[0]
                self.single_names = None if per_peer[peers[0]] == 1 else [name]


class Directory:
    """The other nodes as the broker lists them, and the routes to them from this node.

    ``routes`` is one dict for the node's life (cleared, never replaced), so the transport's
    hot path can hold it directly.
    """

    def __init__(self, node: str, counts: dict[str, int]) -> None:
        self.node = node
        self.counts = counts
        self.peers: dict[str, PeerLink] = {}
        self.routes: dict[str, Route] = {}
        self.keys: frozenset[bytes] = frozenset()  # the CURVE keys of the listed nodes
        self.listed: list[PeerInfo] = []  # the latest listing, as the broker sent it
        self.settling_until = 0.0  # see apply
        self._index: GlobIndex[_Member] = GlobIndex()
        self._rr: dict[str, int] = {}

    def reindex(self, subs: list[tuple[str, str]]) -> None:
        """Index this node's ``subs`` and every peer's anew; cached routes are dropped."""
        index: GlobIndex[_Member] = GlobIndex()
        for name, pattern in subs:
            index.add(pattern, _Member(None, name, pattern))
        for peer in self.peers.values():
            for name, pattern in peer.subs:
                index.add(pattern, _Member(peer, name, pattern))
        self._index = index
        self.routes.clear()

    def route(self, topic: str) -> Route:
        members = self._index.resolve(topic)
        local = {m.name for m in members if m.peer is None}
        groups: dict[str, list[PeerLink]] = {}
        per_peer: dict[PeerLink, int] = {}
        for m in members:
            peer = m.peer
            if peer is None:
                continue
            per_peer[peer] = per_peer.get(peer, 0) + 1
            if m.name in local:
                continue  # a member here matched: served locally
            group = groups.get(m.name)
            if group is None:
                groups[m.name] = [peer]
            elif peer not in group:
                group.append(peer)
        route = Route(groups, per_peer)
        if len(self.routes) >= _ROUTES_MAX:
            self.routes.clear()
        self.routes[topic] = route
        return route

    def pick(self, route: Route) -> list[tuple[PeerLink, list[str] | None]]:
        """One member per group: the peer with the least unsettled work from here, round
        robin on ties; names only where the peer has other matching subscriptions."""
        picked: dict[PeerLink, list[str]] = {}
        for name, peers in route.groups.items():
            if len(peers) == 1:
                best = peers[0]
            else:
                start = self._rr.get(name, 0)
                self._rr[name] = start + 1
                best = None
                best_load = 0
                n = len(peers)
                for i in range(n):
                    peer = peers[(start + i) % n]
                    load = peer.load()
                    if best is None or load < best_load:
                        best, best_load = peer, load
            assert best is not None
            names = picked.get(best)
            if names is None:
                picked[best] = [name]
            else:
                names.append(name)
        return [
            (peer, None if len(names) == route.per_peer[peer] else names)
            for peer, names in picked.items()
        ]

    def checked(self, infos: list[PeerInfo]) -> list[PeerInfo]:
        """The directory's entries this node can link to. Without CURVE any process that
        reaches the broker can join with anything in its HELLO; a bad entry (an endpoint
        libzmq refuses, a bad key, this node's own name) is dropped and counted as
        ``directory_dropped``, and the rest of the directory still applies. A name listed
        twice (a node restarted before the broker lost its old self) keeps its last entry,
        the newest join, as the directory always did."""
        good: dict[str, PeerInfo] = {}
        for info in infos:
            problem = peer_problem(info)
            if problem is None and info.name == self.node:
                problem = "a directory entry under this node's own name"
            if problem is None:
                good.pop(info.name, None)  # the newest join last
                good[info.name] = info
                continue
            self._dropped(info.name, problem)
        return list(good.values())

    def _dropped(self, name: str, problem: str) -> None:
        """An entry this node cannot link to: counted, and logged (sparsely)."""
        self.counts["directory_dropped"] += 1
        n = self.counts["directory_dropped"]
        if n <= 10 or not n % 1000:
            _log.warning(
                "node %s dropped directory entry #%d (%r): %s", self.node, n, name, problem
            )

    def apply(self, infos: list[PeerInfo], now: float) -> tuple[list[PeerInfo], list[PeerLink]]:
        """Take ``infos`` as the listing: peers it no longer lists (or lists anew: another
        incarnation, endpoint or key) leave ``peers`` and are returned as lost; the others
        take its subscriptions and credit. Returns the entries in force and the lost peers;
        the caller links to the new entries.

        Except for a while after a broker restart: the new broker lists only the nodes that
        have joined it so far, and the others, alive, are on their way. Until
        ``settling_until`` an unlisted peer and its links are kept; the heartbeat then
        applies the latest listing in full."""
        self.listed = infos
        if now < self.settling_until:
            listed = {info.name for info in infos}
            infos = infos + [p.info() for p in self.peers.values() if p.name not in listed]
        new = {info.name: info for info in infos}
        lost: list[PeerLink] = []
        for name, peer in list(self.peers.items()):
            info = new.get(name)
            if (
                info is None
                or info.incarnation != peer.incarnation
                or info.data != peer.data
                or info.key != peer.key
            ):
                del self.peers[name]
                lost.append(peer)
            else:
                peer.subs = list(info.subs)
                peer.credit = max(1, info.credit)
        self.keys = frozenset(info.key for info in infos if info.key is not None)
        return infos, lost
