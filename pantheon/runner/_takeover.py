"""NATS takeover: what a killed node's agents leave behind, and who takes it.

A scenario names standby members (``transport.standby``): a process hosting an agent of
another node as a second member of its consumer group. On NATS every subscription name is
one durable consumer per lane; what a member was handed and never acknowledged goes back
to any live member after ``ack_wait``, and what nobody was handed yet simply waits.

*A standby shares from the start.* It subscribes when its process starts and pulls like
any member, rather than waiting to be told its primary died: the server's ``ack_wait`` is
then the only timer in a takeover (no failure detector of our own that could call a slow
node dead and have two members race, or miss a death and have none), a standby is proved
to work before it is needed, and nothing is asked of the driver, which may be the process
that died. The cost is that the primary does not have its agent's work to itself.

*Or a standby waits* (``standby_mode: warm``): its groups pull nothing while a process
ahead of it (the agent's node, then the standbys listed before it) is in the directory
hosting them, and start once none is (:func:`warm_groups`, ``NatsTransport(warm=...)``):
the directory's liveness (``heartbeat * liveness``) is then the detector, and a stateful
agent is one instance at a time.

*A group with members in several processes is fed from the stream alone*
(``NatsTransport(fed_remotely=...)``): a message published in a process that hosts a
member is not handed to that member in memory, which would leave no copy anywhere once
the process died (the agent before it in the chain had already acknowledged its own
input). Each such hop costs a round trip to the server.

*Handled again, published once*: a member killed after publishing what a message caused
but before its ack arrived leaves the message to a standby, which handles it again; what
it emits carries the same ``Nats-Msg-Id`` (cause, emitter, ordinal) and the stream stores
it once, so no item gets its outcome twice. Side effects outside the stream (an Actor's
tool call) are at least once.

*A request waits for the takeover too*: an agent asking one of the dead node's agents
(``Agent.request``, 5 s by default) gets its answer from the standby after ``ack_wait``, so
``ack_wait`` must be shorter than the asker's timeout, or its handling fails (dead-lettered:
counted, not lost, but the item is not decided). A run is quiet again ``ack_wait`` plus
0.2-2.5 s after the kill (the backlog the dead member's credit held up; measured by
benchmarks/takeover_bench.py).

After a run in which a node was killed, the driver (:func:`settle`, :func:`inspect`)
waits until no live group has anything waiting, then reads what waits for the groups
left with no live member and names the items, by the input key of the root message each
waiting message belongs to. ``zero lost`` (``pantheon.runner._report.judge``) holds when every
group of the killed node had a live member and nothing waits; otherwise it names the items.
That list is exact for agents fed from the stream; an agent with no standby that the killed
node fed in memory (a chain inside the node) also lost what was in its mailbox, and only the
copies its consumer had not yet passed over are still in the stream to name
(``handed_over``, at least those): give each agent of such a chain a standby.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from bus import Bus, Envelope, Receipt
from pantheon.scenario import Scenario

__all__ = [
    "MAX_INPUT_KEYS",
    "InputKeys",
    "fed_groups",
    "groups_of",
    "input_keys",
    "inspect",
    "settle",
    "warm_groups",
]

#: Root messages whose item key the driver remembers, to name what waits in the stream.
#: Past this, a waiting message of a later input is named by its root envelope's id.
MAX_INPUT_KEYS = 262_144
#: Seconds between two looks at the stream while a takeover is under way.
_POLL = 0.1

Group = tuple[str, str]


def fed_groups(subscriptions: Mapping[str, Mapping[str, str]]) -> frozenset[str]:
    """Subscription names hosted by more than one process (see the module docstring)."""
    seen: dict[str, int] = {}
    for subs in subscriptions.values():
        for name in subs:
            seen[name] = seen.get(name, 0) + 1
    return frozenset(name for name, n in seen.items() if n > 1)


def warm_groups(
    subscriptions: Mapping[str, str], ahead: Mapping[str, tuple[str, ...]]
) -> dict[str, tuple[str, ...]]:
    """A warm standby's groups (of its ``subscriptions``, name -> pattern), each with the
    processes ahead of it (``ahead``: by agent, ``NatsTransportConfig.warm_ahead``)."""
    return {
        name: ahead[_agent((name, ""))] for name in subscriptions if _agent((name, "")) in ahead
    }


def groups_of(subscriptions: Mapping[str, Mapping[str, str]], hosts: Iterable[str]) -> set[Group]:
    """The ``(name, pattern)`` consumer groups the processes ``hosts`` have members of."""
    return {(name, pattern) for h in hosts for name, pattern in subscriptions.get(h, {}).items()}


class InputKeys:
    """A publish observer on the driver's bus: the item key of each root message it
    publishes (no cause; the input's ``key`` field), by envelope id, for the latest
    :data:`MAX_INPUT_KEYS` of them."""

    __slots__ = ("field", "keys")

    def __init__(self, field: str) -> None:
        self.field = field
        self.keys: OrderedDict[int, str] = OrderedDict()

    def on_publish(self, env: Envelope) -> None:
        if env.causation_id is not None or isinstance(env.reply, Receipt):
            return
        payload = env.payload
        if not isinstance(payload, Mapping):
            return
        key = payload.get(self.field)
        if key is None:
            return
        keys = self.keys
        if len(keys) >= MAX_INPUT_KEYS:
            keys.popitem(last=False)
        keys[env.id] = str(key)

    def item(self, env: Envelope) -> str:
        """The item ``env`` belongs to: its root's key, else ``envelope <root id>``."""
        root = env.correlation_id
        return self.keys.get(root) or f"envelope {root}"


async def settle(
    transport: Any,
    groups: Iterable[Group],
    quiesce: Callable[[], Awaitable[None]],
    timeout: float,
) -> None:
    """Wait until nothing waits in the stream for ``groups`` (every live group) right
    after the cluster went quiet: a killed member's messages come back to a standby only
    after ``ack_wait``, and what the killed node had published itself is tracked by
    nobody alive. Raises TimeoutError after ``timeout`` seconds."""
    groups = sorted(groups)
    async with asyncio.timeout(timeout):
        while True:
            await quiesce()
            backlog = await transport.backlog(groups)
            if not any(backlog.values()):
                return
            await asyncio.sleep(_POLL)


async def inspect(
    transport: Any,
    subscriptions: Mapping[str, Mapping[str, str]],
    killed: Iterable[str],
    live: Iterable[str],
    keys: InputKeys,
    timeout: float,
) -> dict[str, Any]:
    """The stream section of a run summary after ``killed`` nodes died: which of their
    agents a live process took over, which had no live member, and the items whose
    messages wait in the stream for the latter (read, not taken: see
    ``bus.backends.nats._backlog``). ``timeout``: how long to wait for what the dead
    members held to come back (``ack_wait`` and a margin)."""
    killed, live = list(killed), list(live)
    alive = groups_of(subscriptions, live)
    # By agent: an agent's extra patterns are groups of their own ("memory:action.executed").
    taken_over: dict[str, list[str]] = {}
    orphaned: list[Group] = []
    for group in sorted(groups_of(subscriptions, killed), key=_by_agent):
        agent = _agent(group)
        if group not in alive:
            orphaned.append(group)
            continue
        hosts = taken_over.setdefault(agent, [])
        for h in live:
            if subscriptions.get(h, {}).get(group[0]) == group[1] and h not in hosts:
                hosts.append(h)
    waiting: dict[Group, list[Envelope]] = {}
    handed: dict[Group, list[Envelope]] = {}
    complete = True
    if orphaned:
        waiting, handed, complete = await transport.waiting(orphaned, timeout)
    by_agent = _items(waiting, keys)
    # Served in memory by the process that died (only it hosted the group): whether its
    # member handled them died with it.
    unknown = _items(handed, keys)
    no_member = list(dict.fromkeys(_agent(g) for g in orphaned))
    return {
        "killed": killed,
        "taken_over": {a: h for a, h in taken_over.items() if a not in no_member},
        "no_live_member": no_member,
        "waiting": by_agent,
        "items": sorted({k for ks in by_agent.values() for k in ks}),
        "messages": sum(len(envs) for envs in waiting.values()),
        "handed_over": unknown,
        "complete": complete,
    }


def _items(by_group: Mapping[Group, list[Envelope]], keys: InputKeys) -> dict[str, list[str]]:
    """Item keys per agent of the messages in ``by_group``."""
    out: dict[str, set[str]] = {}
    for group, envs in by_group.items():
        if envs:
            out.setdefault(_agent(group), set()).update(keys.item(e) for e in envs)
    return {agent: sorted(ks) for agent, ks in out.items()}


def _agent(group: Group) -> str:
    return group[0].partition(":")[0]


def _by_agent(group: Group) -> tuple[str, str, str]:
    return (_agent(group), group[0], group[1])


def input_keys(bus: Bus, scenario: Scenario) -> InputKeys:
    """Start remembering the item keys of the roots ``bus`` publishes."""
    keys = InputKeys(scenario.outcome_spec().input_key)
    bus.observe(keys)
    return keys
