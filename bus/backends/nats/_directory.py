"""Who hosts which subscriptions, and where a topic's messages go from this node.

Every node keeps its entry (its ``(name, pattern)`` pairs and a version) in the team's
key-value bucket under ``<scope>.<node>``, refreshed each heartbeat, and watches its scope's
keys for the others': the nodes of one session see each other only, so a run never routes
to (or waits for) the groups of another run of the team, and node names repeat freely
across runs. A node not heard from for ``heartbeat * liveness`` seconds leaves this node's view.
On every new version it sees, a node tells its owner so on the owner's sync subject: that is
how ``sync`` knows everyone routes by this node's latest subscriptions. Routes are resolved
once per topic against this node's subscriptions and the others', and cached until either
changes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg

from bus._errors import DecodeError
from bus._topics import GlobIndex
from bus._transport import wake
from bus.backends.nats._subjects import (
    LANES,
    NO_SESSION,
    consumer_name,
    subject_of,
    sync_subject,
)
from bus.backends.nats._wire import NodeEntry, SyncAck, decode_node, decode_sync, encode

__all__ = ["Directory", "Route"]


class Route:
    """Where a topic's messages go from here: whether any remote group takes them, the
    local groups the publisher served (``skip``), the subject per lane and the remote
    consumers per lane whose ack floor ``flush`` follows."""

    __slots__ = ("remote", "skip", "subjects", "tracked")

    def __init__(
        self,
        remote: bool,
        skip: list[str] | None,
        subjects: tuple[str, ...],
        tracked: list[list[str]],
    ) -> None:
        self.remote = remote
        self.skip = skip
        self.subjects = subjects
        self.tracked = tracked


class Directory:
    """The other nodes' entries, this node's own, and the routes and local names derived.

    ``routes`` and ``local_names`` are one dict each for the node's life (cleared, never
    replaced): the transport's publish path and the consumers' take path hold them.
    ``groups`` is the consumers' table of hosted groups: its keys are this node's entry.
    ``send`` queues a plain message for the write-out; ``on_change`` runs after every change
    of the others' subscriptions.
    """

    __slots__ = (
        "bucket",
        "counts",
        "fed",
        "fed_index",
        "groups",
        "kv",
        "kv_prefix",
        "local_index",
        "local_names",
        "node",
        "on_change",
        "others",
        "remote_index",
        "routes",
        "scope",
        "seen_at",
        "send",
        "sync_waiters",
        "synced",
        "team",
        "version",
    )

    def __init__(
        self,
        *,
        node: str,
        team: str,
        bucket: str,
        counts: dict[str, int],
        groups: dict[tuple[str, str], Any],
        send: Callable[[str, bytes], None],
        on_change: Callable[[], None],
        fed: frozenset[str] = frozenset(),
    ) -> None:
        self.node = node
        self.fed = fed
        self.team = team
        self.bucket = bucket
        self.scope = NO_SESSION
        self.kv_prefix = f"$KV.{bucket}.{NO_SESSION}."
        self.counts = counts
        self.groups = groups
        self.send = send
        self.on_change = on_change
        self.kv: Any = None  # set by the transport's start
        self.local_index: GlobIndex[str] = GlobIndex()
        # This node's groups fed from the stream alone (``fed``), with their patterns.
        self.fed_index: GlobIndex[tuple[str, str]] = GlobIndex()
        self.local_names: dict[str, frozenset[str]] = {}
        self.others: dict[str, NodeEntry] = {}
        self.seen_at: dict[str, float] = {}
        self.remote_index: GlobIndex[tuple[str, str]] = GlobIndex()
        self.routes: dict[str, Route] = {}
        self.synced: dict[str, int] = {}
        self.sync_waiters: list[asyncio.Future[None]] = []
        self.version = 0  # published in the directory

    def set_scope(self, scope: str) -> None:
        """The bus's session (before the node starts): which entries are its peers'."""
        self.scope = scope
        self.kv_prefix = f"$KV.{self.bucket}.{scope}."

    @property
    def key(self) -> str:
        """This node's key in the bucket."""
        return f"{self.scope}.{self.node}"

    def set_local(self, subscriptions: list[tuple[str, str]]) -> None:
        """This node's subscriptions changed: local names and routes are resolved anew."""
        index: GlobIndex[str] = GlobIndex()
        fed: GlobIndex[tuple[str, str]] = GlobIndex()
        for name, pattern in subscriptions:
            index.add(pattern, name)
            if name in self.fed:
                fed.add(pattern, (name, pattern))
        self.local_index = index
        self.fed_index = fed
        self.local_names.clear()
        self.routes.clear()

    def local_names_of(self, topic: str) -> frozenset[str]:
        names = self.local_names[topic] = frozenset(self.local_index.resolve(topic))
        return names

    async def put_entry(self) -> None:
        entry = NodeEntry(
            self.node,
            self.version,
            sorted(self.groups),
            socket.gethostname(),
            os.getpid(),
        )
        await self.kv.put(self.key, encode(entry))

    async def load(self) -> None:
        try:
            keys = await self.kv.keys()
        except nats.js.errors.NoKeysError:
            return
        now = time.monotonic()
        mine = f"{self.scope}."
        for full in keys:
            key = full.removeprefix(mine)
            if key == full or key == self.node:
                continue  # another session's node, or this one
            try:
                entry = await self.kv.get(full)
            except nats.js.errors.KeyNotFoundError:
                continue
            if entry.value:
                try:
                    node = decode_node(entry.value)
                except DecodeError:  # anything may write to the bucket: not a node of ours
                    self.counts["malformed"] += 1
                    continue
                self.others[key] = node
                self.seen_at[key] = now
                self.send(
                    sync_subject(self.team, self.scope, key),
                    encode(SyncAck(self.node, node.version)),
                )
        self._changed()

    async def on_entry(self, msg: Msg) -> None:
        key = msg.subject[len(self.kv_prefix) :]
        if key == self.node:
            return
        op = (msg.headers or {}).get("KV-Operation")
        if op in ("DEL", "PURGE"):
            if key in self.others:
                self._forget(key)
                self._changed()
            return
        try:
            entry = decode_node(msg.data)
        except DecodeError:
            self.counts["malformed"] += 1
            return
        self.seen_at[key] = time.monotonic()
        old = self.others.get(key)
        self.others[key] = entry
        if old is None or old.version != entry.version or old.subs != entry.subs:
            self._changed()
            self.send(
                sync_subject(self.team, self.scope, key), encode(SyncAck(self.node, entry.version))
            )

    def expire(self, now: float, silence: float) -> None:
        """Forget the nodes not heard from for ``silence`` seconds."""
        lost = [n for n, t in self.seen_at.items() if now - t > silence]
        for node in lost:
            self._forget(node)
        if lost:
            self._changed()

    def reconnected(self) -> None:
        now = time.monotonic()
        for node in self.seen_at:
            self.seen_at[node] = now  # heard again from the next heartbeat on

    def _forget(self, node: str) -> None:
        # ``synced`` stays: a node forgotten only in this node's view (this loop was starved
        # past ``heartbeat * liveness`` while the other's refreshes queued) still routes by
        # what it confirmed, and acks again only on a new version, so dropping its
        # confirmation left ``sync`` waiting for good once it was heard again (a run hung at
        # start-up under load). A process that starts again under the same name acks on its
        # own ``load``, before its entry is seen here.
        self.others.pop(node, None)
        self.seen_at.pop(node, None)

    def _changed(self) -> None:
        index: GlobIndex[tuple[str, str]] = GlobIndex()
        for pair in {tuple(p) for e in self.others.values() for p in e.subs}:
            index.add(pair[1], (pair[0], pair[1]))
        self.remote_index = index
        self.routes.clear()
        wake(self.sync_waiters)
        self.on_change()

    async def on_sync(self, msg: Msg) -> None:
        try:
            ack = decode_sync(msg.data)
        except DecodeError:
            self.counts["malformed"] += 1
            return
        if ack.version > self.synced.get(ack.node, 0):
            self.synced[ack.node] = ack.version
        wake(self.sync_waiters)

    def unsynced(self) -> list[str]:
        """The live nodes that have not confirmed this node's latest entry yet."""
        return [n for n in self.others if self.synced.get(n, 0) < self.version]

    def live_consumers(self) -> set[str]:
        """The consumers of the groups other nodes host, and of this node's own fed ones."""
        hosted = [p for e in self.others.values() for p in e.subs]
        hosted += [p for p in self.groups if p[0] in self.fed]
        return {
            consumer_name(self.scope, name, pattern, lane)
            for name, pattern in hosted
            for lane in range(len(LANES))
        }

    def route(self, topic: str) -> Route:
        # A fed group of this node goes through the stream like a remote one (its members
        # elsewhere may take it); the other local groups were served by the publishing bus.
        local = set(self.local_index.resolve(topic)) - self.fed
        fed = set(self.fed_index.resolve(topic)) if self.fed else set()
        remote = {g for g in self.remote_index.resolve(topic) if g[0] not in local}
        groups = sorted(remote | fed)
        if groups:
            scope = self.scope
            subjects = tuple(
                subject_of(self.team, scope, lane, topic) for lane in range(len(LANES))
            )
            tracked = [
                [consumer_name(scope, n, p, lane) for n, p in groups] for lane in range(len(LANES))
            ]
        else:
            subjects = ("", "", "")
            tracked = [[], [], []]
        route = Route(bool(groups), sorted(local) or None, subjects, tracked)
        self.routes[topic] = route
        return route
