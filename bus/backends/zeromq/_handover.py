"""What a lost or closing link leaves behind, handed over so nothing goes missing.

When the directory drops a peer, whatever it had not settled (sent, queued for credit,
batched) goes to another member of the same group, or is delivered here if this node now
serves that group, or into this bus's DLQ as ``node_lost``; a request waiting on it fails
with :class:`PeerLost`. A closing node dead-letters what its peers never settled as
``bus_closed``. This is the one place the sending side, the directory and the bus's DLQ
meet, so it is a part of its own rather than a corner of any of them.
"""

from __future__ import annotations

import logging

from bus._envelope import Envelope
from bus._errors import BusClosedError, QueueFullError
from bus._topics import matches
from bus._transport import BusPort
from bus.backends.zeromq._control import BrokerSession
from bus.backends.zeromq._errors import EncodeError, FrameTooLarge, PeerLost
from bus.backends.zeromq._outbound import Outbound, PeerLink, wire_of
from bus.backends.zeromq._reactor import Reactor
from bus.backends.zeromq._routing import Directory

__all__ = ["Handover"]

_log = logging.getLogger("bus.zeromq.node")


class Handover:
    """Redelivers or dead-letters a lost peer's unsettled messages (see the module)."""

    def __init__(
        self,
        *,
        node: str,
        out: Outbound,
        directory: Directory,
        session: BrokerSession,
        reactor: Reactor,
        counts: dict[str, int],
    ) -> None:
        self.node = node
        self.out = out
        self.directory = directory
        self.session = session
        self.reactor = reactor
        self.counts = counts
        self.port: BusPort | None = None  # set by the transport's start

    def peer_lost(self, peer: PeerLink) -> None:
        """The directory dropped ``peer``: everything it had not settled goes to another
        member of the same group, or into this bus's DLQ as ``node_lost``."""
        self.out.disconnect(peer)
        self.counts["peers_lost"] += 1
        items = self.out.take_unsettled(peer)
        if not items:
            return
        _log.warning(
            "node %s lost with %d unsettled messages from %s: redelivered or dead-lettered",
            peer.name,
            len(items),
            self.node,
        )
        assert self.port is not None
        subs = {name for name, _ in self.session.subs}
        for item in items:
            env = item.env
            names = item.names or [n for n, p in peer.subs if matches(p, env.topic)]
            route = self.directory.routes.get(env.topic) or self.directory.route(env.topic)
            for name in names:
                others = route.groups.get(name)
                if others:
                    target = min(others, key=PeerLink.load)
                    try:
                        self.out.encode(
                            target, wire_of(env, self.session.to_wire), [name], item.request
                        )
                    except (EncodeError, FrameTooLarge) as exc:
                        # Off the publisher's call: the DLQ is where it can see this.
                        self._fail(env, name, "encode_error", exc)
                        continue
                    self.counts["redelivered"] += 1
                    continue
                if name in subs:
                    # The group is served here now: deliver it locally (a request's answer
                    # then completes its future directly).
                    self.counts["redelivered"] += 1
                    self.reactor.background(self._deliver_here(env, name, peer.name))
                    continue
                self._lost(env, name, "node_lost", peer.name)

    async def _deliver_here(self, env: Envelope, name: str, where: str) -> None:
        assert self.port is not None
        request = self.out.requests.get(env.id)
        env.reply = request[0] if request is not None else None
        try:
            waiting = self.port.deliver(env, [name])
            if waiting is not None:
                await waiting
        except (BusClosedError, QueueFullError):
            self._lost(env, name, "node_lost", where)

    def _lost(self, env: Envelope, subscriber: str, reason: str, where: str) -> None:
        assert self.port is not None
        error = PeerLost(
            f"node {where!r} holding {env.topic!r} for {subscriber!r} was lost and no other "
            f"member of that group could take it"
            if reason == "node_lost"
            else f"node {self.node!r} closed before node {where!r} settled it"
        )
        request = self.out.requests.get(env.id)
        if request is not None and not request[0].done():
            request[0].set_exception(error)
        if reason == "node_lost":
            self.counts["node_lost"] += 1
        self.port.dead_letter(env, subscriber, reason, error)

    def _fail(self, env: Envelope, subscriber: str, reason: str, error: BaseException) -> None:
        assert self.port is not None
        request = self.out.requests.get(env.id)
        if request is not None and not request[0].done():
            request[0].set_exception(error)
        self.port.dead_letter(env, subscriber, reason, error)

    def dead_letter_all(self, peer: PeerLink, reason: str) -> None:
        for item in self.out.take_unsettled(peer):
            names = item.names or ["<remote>"]
            for name in names:
                self._lost(item.env, name, reason, peer.name)
