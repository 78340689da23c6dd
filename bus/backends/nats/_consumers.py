"""The receiving side of a node: its consumer groups, what they pull and hold, and settling.

For each group it hosts, the node keeps pull requests (``batch`` messages, long poll)
outstanding on each lane, requesting CRITICAL's first, never more than ``credit`` held at
once (requested + parked + in the bus). A pulled message becomes an envelope with a
:class:`StreamReceipt` and goes to ``BusPort.deliver`` for that group's subscription only.
When a ``block`` mailbox is full, deliver returns an awaitable: the group stops pulling and
what its outstanding requests still bring is parked (bounded by ``credit``) until the
mailbox has room. Once the subscription is done, the receipt acks (handled), naks with an
exponential delay (failed), naks without delay (the bus closed: given back to another
member), or after ``max_deliver`` deliveries publishes the message to the DLQ stream and
terminates it. A group leaving stops pulling first (its inbox unsubscribed), then gives
back what it held, so the server does not hand those straight back to this node.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bus._envelope import Envelope
from bus._errors import BusClosedError, DecodeError, QueueFullError
from bus._transport import BusPort, Receipt
from bus.backends.nats._publisher import Outbox
from bus.backends.nats._subjects import (
    LANES,
    NO_SESSION,
    consumer_name,
    dlq_subject,
    filter_subject,
    session_description,
    subject_of,
)
from bus.backends.nats._wire import (
    ACK,
    TERM,
    WPI,
    Answer,
    consumer_of,
    decode_wire,
    delivered,
    envelope_of,
)

__all__ = ["Consumers", "Group", "Lane", "StreamReceipt"]

_log = logging.getLogger("bus.nats")

#: Seconds a pull request waits on the server for messages (a long poll).
_PULL_EXPIRES = 5.0
#: Seconds after which the server deletes a session's consumer nobody pulls from: what a
#: run whose every process died leaves goes a day later (a finished run deletes its own at
#: once, a resume those of the run it finished). The team-wide ones (no session) are kept.
_SESSION_IDLE = 86_400.0
#: Handled message ids remembered per group (at least this many) to drop redeliveries.
_DEDUP_IDS = 65_536
#: Ids of the latest messages this node received, so that one delivered to several of its
#: groups reaches its bus's observers once; a copy arriving after this many others is
#: observed again.
_SEEN_IDS = 65_536


class Lane:
    __slots__ = ("api", "consumer", "index", "outstanding", "requests")

    def __init__(self, stream: str, consumer: str, index: int) -> None:
        self.consumer = consumer
        self.index = index
        self.api = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.requests: dict[int, list[float]] = {}  # request id -> [remaining, deadline]
        self.outstanding = 0


class Group:
    """A consumer group this node hosts: one subscription name with its pattern."""

    __slots__ = (
        "active",
        "closing",
        "deferred",
        "done",
        "done_old",
        "gid",
        "held",
        "lanes",
        "name",
        "parked",
        "passive",
        "pattern",
        "sub",
        "switching",
        "waiting",
    )

    def __init__(self, gid: int, name: str, pattern: str, lanes: list[Lane]) -> None:
        self.gid = gid
        self.name = name
        self.pattern = pattern
        self.lanes = lanes
        self.held: dict[str, StreamReceipt] = {}
        self.parked: deque[Msg] = deque()
        self.waiting: asyncio.Task[None] | None = None
        self.active = True
        # A warm standby's group while a process ahead of it hosts the group: no pull inbox,
        # so no requests on the server (see Consumers.set_passive).
        self.passive = False
        self.switching: asyncio.Task[None] | None = None
        self.sub: Any = None  # its own pull inbox, so leaving ends its requests on the server
        self.closing: asyncio.Task[None] | None = None
        self.deferred: list[str] = []  # acks to give back once the inbox is gone
        # Ids handled and acknowledged here, two generations: a redelivery of one of them
        # (its ack lost when the server restarted) is acknowledged again, not handled twice.
        self.done: set[int] = set()
        self.done_old: set[int] = set()


class StreamReceipt(Receipt):
    """Settled by the bus once per subscription that took the message; then acks, naks,
    releases or dead-letters it on the server (see :meth:`Consumers.finish`)."""

    __slots__ = (
        "ack",
        "answered",
        "armed",
        "consumers",
        "data",
        "delivered",
        "env",
        "error",
        "expected",
        "finished",
        "group",
        "looped",
        "pending",
        "released",
        "reply_to",
        "since",
    )

    def __init__(
        self,
        consumers: Consumers,
        group: Group,
        ack: str,
        delivered: int,
        env: Envelope,
        data: bytes,
        reply_to: str | None,
    ) -> None:
        self.consumers = consumers
        self.group = group
        self.ack = ack
        self.delivered = delivered
        self.env = env
        self.data = data
        self.reply_to = reply_to
        self.pending = 0
        self.expected = False
        self.armed = False
        self.finished = False
        self.released = False
        self.answered = False
        self.error: BaseException | None = None
        self.since = time.monotonic()
        self.looped = False

    def expect(self, count: int) -> None:
        self.pending += count
        self.expected = True
        self._maybe_finish()

    def settle(self, result: Any, error: BaseException | None) -> None:
        self.pending -= 1
        if error is not None:
            if isinstance(error, BusClosedError):
                self.released = True  # the bus closed before handling it: give it back
            elif self.error is None:
                self.error = error
        elif result is not None and self.reply_to is not None and not self.answered:
            self.answered = True
            self.consumers.answer(self.reply_to, Answer(True, result))
        self._maybe_finish()

    def release(self) -> None:
        """One subscription gives the message back unhandled (its bus is closing): nak with
        no delay once every subscription is done, so another member takes it."""
        self.released = True
        self.pending -= 1
        self._maybe_finish()

    def give_back(self) -> None:
        """The bus refused the message outright (closed): give it back now."""
        self.released = True
        self.expected = self.armed = True
        self.pending = 0
        self._maybe_finish()

    def arm(self) -> None:
        """The bus has taken (or refused) the message; finish once it is settled."""
        self.armed = True
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self.armed and self.expected and self.pending <= 0 and not self.finished:
            self.finished = True
            self.consumers.finish(self)


class Consumers:
    """The groups this node hosts (``groups``, by ``(name, pattern)``: one dict for the
    node's life, whose keys the directory publishes), their pull requests, what they hold,
    and how each message is settled.

    Pull requests, acks and naks go out through the ``outbox``, in order with everything
    else; ``answer`` answers a request. ``local_names`` is the directory's cache of this
    node's subscription names per topic (``local_names_of`` fills it): a group takes only
    what its pattern matches, its consumer's filter being wider.
    """

    __slots__ = (
        "ack_wait",
        "answer",
        "backoff",
        "batch",
        "by_consumer",
        "by_gid",
        "closed",
        "counts",
        "credit",
        "gids",
        "groups",
        "js",
        "local_names",
        "local_names_of",
        "loop",
        "max_deliver",
        "mono_to_wall",
        "nc",
        "node",
        "out",
        "port",
        "pull_prefix",
        "replicas",
        "req_ids",
        "schedule_write",
        "scope",
        "seen",
        "send",
        "stream",
        "tasks",
        "team",
    )

    def __init__(
        self,
        *,
        node: str,
        team: str,
        stream: str,
        pull_prefix: str,
        credit: int,
        batch: int,
        ack_wait: float,
        max_deliver: int,
        backoff: tuple[float, float],
        replicas: int,
        mono_to_wall: int,
        counts: dict[str, int],
        tasks: list[asyncio.Task[None]],
        groups: dict[tuple[str, str], Group],
        outbox: Outbox,
        answer: Callable[[str, Answer], None],
        local_names: dict[str, frozenset[str]],
        local_names_of: Callable[[str], frozenset[str]],
    ) -> None:
        self.node = node
        self.team = team
        self.stream = stream
        self.pull_prefix = pull_prefix
        self.credit = credit
        self.batch = batch
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        self.backoff = backoff
        self.replicas = replicas
        self.mono_to_wall = mono_to_wall
        self.counts = counts
        self.tasks = tasks
        self.out = outbox.out
        self.schedule_write = outbox.schedule_write
        self.send = outbox.send
        self.answer = answer
        self.local_names = local_names
        self.local_names_of = local_names_of
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the transport's start
        self.scope = NO_SESSION  # the bus's session, set by the transport's start
        self.nc: Any = None
        self.js: Any = None
        self.port: BusPort | None = None
        self.closed = False
        self.groups = groups
        self.by_gid: dict[int, Group] = {}
        self.by_consumer: dict[str, tuple[Group, Lane]] = {}
        self.gids = itertools.count(1)
        self.req_ids = itertools.count(1)
        # An OrderedDict: dropping the oldest of a plain dict with next(iter()) scans past
        # every deleted slot at its front (see bus/_routing.py).
        self.seen: OrderedDict[int, None] = OrderedDict()

    async def open_group(self, name: str, pattern: str, passive: bool = False) -> Group:
        """Create (or keep: another process of the session made it) the group's consumer on
        each lane, then start pulling, unless ``passive`` (:meth:`set_passive`)."""
        scope = self.scope
        scoped = scope != NO_SESSION
        lanes = []
        for lane in range(len(LANES)):
            durable = consumer_name(scope, name, pattern, lane)
            config = ConsumerConfig(
                durable_name=durable,
                description=session_description(scope),
                filter_subject=filter_subject(self.team, scope, lane, pattern),
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.NEW,
                ack_wait=self.ack_wait,
                max_deliver=-1,  # this transport counts deliveries and dead-letters itself
                max_ack_pending=self.credit,
                max_waiting=512,
                num_replicas=self.replicas,
                inactive_threshold=_SESSION_IDLE if scoped else None,
            )
            try:
                await self.js.add_consumer(self.stream, config)
            except nats.js.errors.BadRequestError:
                await self.js.consumer_info(self.stream, durable)  # exists: keep its config
            lanes.append(Lane(self.stream, durable, lane))
        gid = next(self.gids)
        group = Group(gid, name, pattern, lanes)
        group.passive = passive
        if not passive:
            group.sub = await self.nc.subscribe(f"{self.pull_prefix}.{gid}.>", cb=self.on_pull)
        self.by_gid[gid] = group
        for lane_ in lanes:
            self.by_consumer[lane_.consumer] = (group, lane_)
        self.arm(group)
        return group

    def set_passive(self, group: Group, passive: bool) -> None:
        """A warm standby's group stops pulling while a process ahead of it hosts the group,
        and starts once none does. Stopping ends its pull requests on the server (the inbox
        unsubscribed, as a group leaving does): requests left to expire would keep taking a
        share of the work for up to their long poll, and naking that share back could hand
        it straight to the next of them. What it holds it finishes."""
        if group.passive == passive or self.loop is None:
            return
        group.passive = passive
        if group.switching is None or group.switching.done():
            group.switching = self.loop.create_task(self._switch(group))

    async def _switch(self, group: Group) -> None:
        """Bring the group's pull inbox to what :meth:`set_passive` last asked (it may flip
        again while an (un)subscribe is on its way)."""
        while group.active and not self.closed:
            if group.passive and group.sub is not None:
                sub, group.sub = group.sub, None
                for lane in group.lanes:
                    lane.requests.clear()
                    lane.outstanding = 0
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            elif not group.passive and group.sub is None:
                subject = f"{self.pull_prefix}.{group.gid}.>"
                group.sub = await self.nc.subscribe(subject, cb=self.on_pull)
                self.arm(group)
            else:
                return

    def arm(self, group: Group) -> None:
        """Ask for more messages while this group holds fewer than ``credit``, CRITICAL's
        lane first. Nothing while a full mailbox makes it wait."""
        if group.sub is None or not group.active or group.waiting is not None or self.closed:
            return
        lanes = group.lanes
        room = self.credit - len(group.held) - len(group.parked)
        room -= sum(lane.outstanding for lane in lanes)
        half = self.batch // 2
        now = time.monotonic()
        # An idle lane's long poll holds its request's credit: each lane asks for at most its
        # share of the room, so CRITICAL (asked first) cannot starve NORMAL of credit.
        share = max(1, min(self.batch, self.credit // len(lanes)))
        for lane in lanes:
            if room <= 0:
                break
            if lane.outstanding > min(half, share // 2):
                continue
            n = min(share - lane.outstanding, room)
            if n <= 0:
                continue
            rid = next(self.req_ids)
            lane.requests[rid] = [n, now + _PULL_EXPIRES + 2.0]
            lane.outstanding += n
            room -= n
            request = b'{"batch":%d,"expires":%d}' % (n, int(_PULL_EXPIRES * 1e9))
            self.out.append(
                (lane.api, f"{self.pull_prefix}.{group.gid}.{lane.index}.{rid}", request, None)
            )
        self.schedule_write()

    async def on_pull(self, msg: Msg) -> None:
        ack = msg.reply
        if not ack:
            # A status on the request's own inbox: it expired, found nothing, was refused.
            tokens = msg.subject.rsplit(".", 3)
            group = self.by_gid.get(int(tokens[1]))
            if group is not None:
                lane = group.lanes[int(tokens[2])]
                request = lane.requests.pop(int(tokens[3]), None)
                if request is not None:
                    lane.outstanding -= int(request[0])
                self.arm(group)
            return
        # A message keeps its own subject; its ack subject names the consumer. The server
        # serves a consumer's waiting requests in order, so it fills the oldest one.
        found = self.by_consumer.get(consumer_of(ack))
        if found is None:
            self.nak(ack, 0)  # not ours any more: straight to another member
            self.counts["released"] += 1
            return
        group, lane = found
        for rid, request in lane.requests.items():
            request[0] -= 1
            lane.outstanding -= 1
            if request[0] <= 0:
                del lane.requests[rid]
            break
        if not group.active:
            group.deferred.append(ack)  # given back once the group's inbox is gone
            return
        if group.waiting is not None:
            group.parked.append(msg)
            return
        self.take(group, msg)
        self.arm(group)

    def take(self, group: Group, msg: Msg) -> None:
        """Offer one pulled message to the group's subscription."""
        ack = msg.reply
        try:
            wire = decode_wire(msg.data)
            if not 0 <= wire.priority <= 2:
                raise ValueError(f"priority {wire.priority!r} out of range")
        except ValueError as exc:  # a DecodeError, or the priority
            self._malformed(group, msg, exc)
            return
        name = group.name
        if (wire.skip is not None and name in wire.skip) or (
            wire.only is not None and name not in wire.only
        ):
            self.counts["skipped"] += 1
            self.send(ack, ACK)
            return
        if wire.only is None and (wire.id in group.done or wire.id in group.done_old):
            self.counts["duplicates_dropped"] += 1
            self.send(ack, ACK)
            return
        names = self.local_names.get(wire.topic)
        if names is None:
            names = self.local_names_of(wire.topic)
        if name not in names:  # the consumer filter is a superset of the pattern
            self.counts["skipped"] += 1
            self.send(ack, ACK)
            return
        env = envelope_of(wire, self.mono_to_wall)
        count = delivered(ack)
        if count > 1:
            self.counts["redelivered"] += 1
        receipt = StreamReceipt(self, group, ack, count, env, msg.data, wire.reply)
        env.reply = receipt
        group.held[ack] = receipt
        seen = self.seen
        if wire.origin == self.node or wire.id in seen:
            # Published here for one of this node's fed groups, or delivered here already
            # to another of its groups: its bus has counted and observed it once
            # (``received`` is what reached this bus from others, each message once).
            receipt.looped = True
            self.counts["looped"] += 1
        else:
            self.counts["received"] += 1
            if len(seen) >= _SEEN_IDS:
                seen.popitem(last=False)
            seen[wire.id] = None
        assert self.port is not None
        try:
            waiting = self.port.deliver(env, (name,))
        except BusClosedError:
            receipt.give_back()
            return
        except QueueFullError as exc:
            receipt.error = exc  # a full ``reject`` mailbox: redelivered after a backoff
            receipt.expect(0)
            receipt.arm()
            return
        except Exception as exc:
            _log.exception("NATS node %s: delivering %s failed", self.node, env.topic)
            receipt.error = exc
            receipt.expect(0)
            receipt.arm()
            return
        if waiting is None:
            receipt.arm()
            return
        assert self.loop is not None
        group.waiting = self.loop.create_task(self._unblock(group, waiting, receipt))

    def _malformed(self, group: Group, msg: Msg, exc: ValueError) -> None:
        """A message no subscriber can read: counted, listed in this bus's DLQ under the
        group's name (its payload the raw size and the reason: the bytes are not kept, a
        redrive could not make them readable) and terminated, so the stream never offers it
        again and the run goes on."""
        self.counts["malformed"] += 1
        size = len(msg.data)
        reason = exc.reason if isinstance(exc, DecodeError) else "malformed"
        _log.warning(
            "NATS node %s: dropped a malformed message on %s: %s", self.node, msg.subject, exc
        )
        self.send(msg.reply, TERM)
        if self.port is not None:
            env = Envelope.new(msg.subject, {"size": size, "reason": reason})
            self.port.dead_letter(env, group.name, "malformed", exc)

    async def _unblock(
        self, group: Group, waiting: Awaitable[None], receipt: StreamReceipt
    ) -> None:
        """A full ``block`` mailbox: wait for room, then offer what was parked meanwhile."""
        try:
            await waiting
        except QueueFullError as exc:
            receipt.error = exc
        except BusClosedError:
            receipt.give_back()
        finally:
            receipt.arm()
            group.waiting = None
        while group.parked and group.waiting is None and group.active:
            self.take(group, group.parked.popleft())
        self.arm(group)

    def finish(self, receipt: StreamReceipt) -> None:
        """The subscription is done with the message: tell the server."""
        group = receipt.group
        group.held.pop(receipt.ack, None)
        if receipt.released:
            # The bus is closing: stop pulling first, or the server hands the message
            # straight back to this node's own outstanding requests.
            group.deferred.append(receipt.ack)
            self.leave(group)
            if group.closing is not None and group.closing.done():
                self._give_back(group)
            return
        elif receipt.error is None:
            self.counts["acked"] += 1
            self.send(receipt.ack, ACK)
            group.done.add(receipt.env.id)
            if len(group.done) >= _DEDUP_IDS:
                group.done_old = group.done
                group.done = set()
        elif receipt.delivered >= self.max_deliver:
            assert self.loop is not None
            task = self.loop.create_task(self._dead_letter(receipt))
            self.tasks.append(task)
            task.add_done_callback(self.tasks.remove)
        else:
            self.counts["naked"] += 1
            base, most = self.backoff
            self.nak(receipt.ack, min(most, base * 2 ** (receipt.delivered - 1)))
        self.arm(group)

    def nak(self, ack: str, delay: float) -> None:
        body = b"-NAK" if delay <= 0 else b'-NAK {"delay":%d}' % int(delay * 1e9)
        self.send(ack, body)

    async def _dead_letter(self, receipt: StreamReceipt) -> None:
        """After ``max_deliver`` deliveries: to the DLQ stream (every publisher lists and
        redrives it there), then terminated here; a request's asker gets the error."""
        error = receipt.error
        assert error is not None
        wire = decode_wire(receipt.data)
        text = " ".join(str(error).split())[:1000] or "(no message)"
        headers = {
            "Nats-Msg-Id": f"dlq.{wire.id}.{receipt.group.gid}.{receipt.group.name}",
            "Pantheon-Subscriber": receipt.group.name,
            "Pantheon-Deliveries": str(receipt.delivered),
            "Pantheon-Error-Type": type(error).__name__,
            "Pantheon-Error": text,
            "Pantheon-Node": self.node,
            "Pantheon-Subject": subject_of(self.team, self.scope, wire.priority, wire.topic),
        }
        while not self.closed:
            try:
                await self.js.publish(
                    dlq_subject(self.team, wire.origin), receipt.data, headers=headers
                )
                break
            except Exception as exc:  # disconnected: the message stays held until it goes
                _log.warning("NATS node %s: DLQ publish failed, retrying: %s", self.node, exc)
                await asyncio.sleep(0.2)
        else:
            self.nak(receipt.ack, 0)
            return
        self.counts["dead_lettered"] += 1
        self.send(receipt.ack, TERM)
        if receipt.reply_to is not None and not receipt.answered:
            receipt.answered = True
            self.answer(
                receipt.reply_to,
                Answer(False, None, type(error).__name__, text, receipt.env.topic),
            )

    def leave(self, group: Group) -> None:
        """Stop pulling for ``group`` (unsubscribed, or the bus is closing); what it parked
        goes back once its requests are gone (see :meth:`_close_group`)."""
        if group.closing is not None or self.loop is None:
            return
        group.active = False
        group.closing = self.loop.create_task(self._close_group(group))

    async def _close_group(self, group: Group) -> None:
        """End the group's pull requests on the server (its inbox unsubscribed: the server
        drops a request nobody listens to), then nak what it held and what was parked, with
        no delay: the server gives them to another member at once."""
        if group.switching is not None:  # ends after its step: the group is not active
            with contextlib.suppress(Exception):
                await group.switching
        with contextlib.suppress(Exception):
            if group.sub is not None:
                await group.sub.unsubscribe()
            await self.nc.flush(timeout=2)
        self.by_gid.pop(group.gid, None)
        for lane in group.lanes:
            if self.by_consumer.get(lane.consumer, (None,))[0] is group:
                del self.by_consumer[lane.consumer]
        while group.parked:
            group.deferred.append(group.parked.popleft().reply)
        self._give_back(group)

    def _give_back(self, group: Group) -> None:
        for ack in group.deferred:
            self.nak(ack, 0)
            self.counts["released"] += 1
        group.deferred.clear()

    def keep_alive(self, now: float) -> None:
        """Tell the server (``+WPI``) a message held past half of ``ack_wait`` is still being
        handled; forget pull requests past their deadline and ask again."""
        for group in list(self.groups.values()):
            for receipt in group.held.values():
                if now - receipt.since > self.ack_wait / 2:
                    receipt.since = now
                    self.send(receipt.ack, WPI)
            expired = False
            for lane in group.lanes:
                for rid, (remaining, deadline) in list(lane.requests.items()):
                    if now > deadline:
                        del lane.requests[rid]
                        lane.outstanding -= int(remaining)
                        expired = True
            if expired:
                self.arm(group)

    def reconnected(self) -> None:
        """Pull requests died with the old connection: make new ones."""
        for group in self.groups.values():
            for lane in group.lanes:
                lane.requests.clear()
                lane.outstanding = 0
            self.arm(group)

    def held(self) -> int:
        return sum(len(g.held) + len(g.parked) for g in self.groups.values())

    async def close(self, timeout: float) -> None:
        """Every group leaves (waiting up to ``timeout`` for their inboxes to go); what the
        closed bus never settled goes back to the server with them."""
        for group in self.groups.values():
            self.leave(group)
        closing = [g.closing for g in self.groups.values() if g.closing is not None]
        if closing:
            await asyncio.wait(closing, timeout=timeout)
        for group in self.groups.values():
            # The bus is closed: what it never settled (a delivery still waiting on a full
            # mailbox) goes back too, with whatever arrived after the group's close.
            for receipt in list(group.held.values()):
                if not receipt.finished:
                    group.deferred.append(receipt.ack)
            group.held.clear()
            self._give_back(group)

    def stop_waiting(self) -> None:
        for group in self.groups.values():
            if group.waiting is not None:
                group.waiting.cancel()
