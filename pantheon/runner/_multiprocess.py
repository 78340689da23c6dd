"""Multi-process runs: a ZeroMQ scenario as a broker, one process per node, and a driver.

``pantheon run`` of a scenario with ``transport: {kind: zmq, nodes: {...}}``:

* the **driver** (the process running the scenario; node name ``driver``) starts a broker
  process and one ``pantheon node`` process per entry of ``transport.nodes``. It hosts every
  agent the placement leaves out (typically the Observer, which publishes the input) and
  records its own bus as the session.
* each **node** builds the whole team from the same scenario file and seed, keeps the agents
  placed on it, connects, and reports ready only once it knows every other process's
  subscriptions: nothing is published into a route not known yet (ZeroMQ's late-joiner loss,
  avoided by a handshake rather than a sleep). The driver waits the same way.
* once every node is ready the driver starts its agents and inputs flow; ``faults.flood``
  runs in the driver and ``faults.kill_node`` SIGKILLs a node process at its time.
* when the inputs, flood and kill are done, the driver waits for the cluster to be quiet,
  stops the agents everywhere, waits again, and asks each node to leave: each sends its
  :func:`~pantheon.runner._report.local_report` and exits. The driver merges the reports into one
  :class:`~pantheon.runner._report.RunSummary`, with a ``nodes`` section saying how each process
  ended.

With ``transport: {kind: nats}`` the same driver and nodes run over NATS JetStream instead:
no broker process; every process connects to ``transport.url`` (or, with ``server: auto``, to a
throwaway ``nats-server -js`` the driver starts on a free loopback port and stops after), and
what a killed node held comes back from the stream to another member after ``ack_wait``.

The driver talks to its nodes over their stdin/stdout (JSON lines), not over the bus:
polling a bus's counters through that bus would change the counters it polls, and control
must keep working when the bus is what broke. A node whose stdin closes (its driver died)
leaves on its own, so no node outlives its run.

*Quiet* means: every live process reports nothing outstanding on its bus and nothing in
flight on its transport, twice in a row, with the same publish counts both times, so no
message moved between the two looks. Messages in flight to a killed node keep its senders
busy until heartbeats declare the node lost and the transport redelivers or dead-letters
them (``node_lost``); only then is the cluster quiet.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import difflib
import functools
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from agents import LiveEffects, Observer, Outcomes
from bus import Bus, BusError, Envelope, Priority, Receipt, Transport
from pantheon._errors import PantheonError
from pantheon.approvals import APPROVAL_EVENT, DECIDED_COMMAND, DeskRelay, NodeDesk
from pantheon.runner import _takeover
from pantheon.runner._budget_relay import (
    BUDGET_COMMAND,
    BUDGET_EVENT,
    BudgetRelay,
    NodeBudgetLink,
)
from pantheon.runner._build import Team, build_team
from pantheon.runner._inputs import count_inputs, run_flood
from pantheon.runner._report import RunSummary, count_own_topics, local_report, summarize
from pantheon.runner._team_dead_letters import (
    TEAM_DEAD_LETTERS_COMMAND,
    TeamDeadLetters,
    monitor_nodes,
)
from pantheon.scenario import DRIVER_NODE, NatsCredentials, NatsTransportConfig, Scenario
from pantheon.scenario.internals import agent_class
from pantheon.sessions import (
    SessionError,
    SessionInfo,
    SessionStore,
    import_envelopes,
    import_shipments,
)
from pantheon.telemetry import configure_logging, get_logger

if TYPE_CHECKING:
    from pantheon.approvals import StoreDesk
    from pantheon.live import PartsBoard
    from pantheon.runner._node_journal import JetStreamShipper, JournalFollower
    from pantheon.sessions import ShippingRecorder
    from pantheon.telemetry import Telemetry

__all__ = [
    "ClusterError",
    "NodeHost",
    "Placement",
    "cluster_transport",
    "discard_consumers",
    "import_from_stream",
    "install_stop_signals",
    "run_cluster",
    "say_control",
    "serve_broker",
    "serve_node",
]

log = get_logger("pantheon.cluster")

#: Seconds a node process may take from spawn to ready (Python start-up, imports, connect,
#: route handshake) on a loaded machine.
DEFAULT_START_TIMEOUT = 60.0
#: Seconds a stopping node waits for its queued and in-flight work to settle.
DEFAULT_DRAIN_TIMEOUT = 60.0
#: Seconds to wait for a broker's handshake before calling it unreachable.
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Seconds between two looks at the cluster while waiting for it to be quiet or for inputs.
_POLL = 0.02
#: Lines of a node's stderr kept to explain its failure.
_STDERR_TAIL = 40
#: Longest control line the driver reads from a node (bytes): a journal shipment is at most
#: ``MAX_SHIPMENT_BYTES`` (4 MiB) of chunks plus one chunk, base64-encoded in a JSON line.
_LINE_LIMIT = 64 << 20
#: Link repair counts every process reports, summed into the driver's ``links``.
_LINK_COUNTS = ("redelivered", "node_lost", "peers_lost", "gaps", "resent", "relinked")


class ClusterError(PantheonError, RuntimeError):
    """A multi-process run could not start, or lost control of one of its processes.

    The message names the node, endpoint or agent concerned and, for a node that died,
    ends with the last lines it wrote to stderr."""


class TransportUnreachable(ClusterError):
    """The run's NATS server cannot be reached (nothing listens, no answer, or it refuses
    the credentials), found before anything started: nothing ran, nothing was recorded."""


# -- placement ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    """Which process hosts which agents, and which subscriptions each process has."""

    hosts: Mapping[str, tuple[str, ...]]
    """Process name (``driver`` or a node of ``transport.nodes``) -> its agents."""
    subscriptions: Mapping[str, Mapping[str, str]]
    """Process name -> {subscription name: pattern}, as the agents will subscribe."""

    @classmethod
    def of(cls, scenario: Scenario) -> Placement:
        """The scenario's placement (:meth:`Scenario.hosts`); enabled agents no node hosts
        go to the driver."""
        hosts = scenario.hosts()
        subscriptions = {host: _subscriptions(scenario, agents) for host, agents in hosts.items()}
        return cls(hosts, subscriptions)

    @property
    def nodes(self) -> dict[str, tuple[str, ...]]:
        return {h: a for h, a in self.hosts.items() if h != DRIVER_NODE}

    def probes(self, host: str) -> list[str]:
        """Topics ``host`` must see remote interest in before it may publish: one per pattern
        subscribed elsewhere (under a subscription name ``host`` does not also have)."""
        mine = self.subscriptions.get(host, {})
        out: set[str] = set()
        for other, subs in self.subscriptions.items():
            if other == host:
                continue
            for name, pattern in subs.items():
                if name not in mine:
                    out.add(_probe(pattern))
        return sorted(out)


def _subscriptions(scenario: Scenario, agents: Iterable[str]) -> dict[str, str]:
    # Mirrors Agent.attach: the first pattern is named after the agent, the others
    # "<agent>:<pattern>".
    out: dict[str, str] = {}
    for name in agents:
        cfg = scenario.agent(name)
        default = agent_class(name, cfg).topics_for(scenario.outcome_spec())
        patterns = cfg.subscribe or default
        for i, pattern in enumerate(patterns):
            out[name if i == 0 else f"{name}:{pattern}"] = pattern
    return out


def _probe(pattern: str) -> str:
    """A concrete topic ``pattern`` matches (``system.*`` -> ``system.x``, ``a.>`` -> ``a.x``)."""
    return ".".join("x" if token in ("*", ">") else token for token in pattern.split("."))


# -- one process's bus -------------------------------------------------------------------------


def _zmq() -> Any:
    """The ZeroMQ backend, imported on first use: it imports pyzmq, and without it raises
    an ImportError naming the extra to install."""
    from bus.backends import zeromq

    return zeromq


def _nats_transport(scenario: Scenario, url: str, node: str, connect_timeout: float) -> Any:
    """A NATS transport for one process of a ``transport.kind: nats`` run, configured from
    the scenario (imported on first use: it imports nats-py). Every process of the run is
    one team: the stream is named after ``transport.team``, else the scenario."""
    from bus.backends.nats import NatsTransport

    cfg = _nats_config(scenario)
    creds = cfg.credentials or _NO_CREDENTIALS
    placement = Placement.of(scenario)
    return NatsTransport(
        url.split(","),
        team=cfg.team or re.sub(r"[^A-Za-z0-9_-]", "_", scenario.name),
        node=node,
        user=creds.user,
        password=creds.password,
        nkey_seed=creds.nkey_seed,
        creds=creds.creds,
        token=creds.token,
        storage=cfg.storage,
        replicas=cfg.replicas,
        credit=cfg.credit,
        max_deliver=cfg.max_deliver,
        ack_wait=cfg.ack_wait,
        dedup_window=cfg.dedup_window,
        heartbeat=cfg.heartbeat,
        liveness=cfg.liveness,
        connect_timeout=connect_timeout,
        fed_remotely=_takeover.fed_groups(placement.subscriptions),
        warm=_takeover.warm_groups(placement.subscriptions.get(node, {}), cfg.warm_ahead(node)),
    )


#: Anonymous: what a NATS transport without ``transport.credentials`` connects with.
_NO_CREDENTIALS = NatsCredentials.model_construct()


def _nats_config(scenario: Scenario) -> NatsTransportConfig:
    cfg = scenario.transport
    if not isinstance(cfg, NatsTransportConfig):
        raise ClusterError(f"scenario {scenario.name!r} has no NATS transport ({cfg.kind})")
    return cfg


def _transport_stats(bus: Bus) -> dict[str, Any]:
    stats = getattr(bus.transport, "stats", None)
    return dict(stats()) if callable(stats) else {}


def _in_flight(t: Mapping[str, Any]) -> int:
    """Messages a transport has sent (or batched) and not yet seen settled by every receiver:
    handled or dead-lettered there, or dead-lettered here as ``node_lost``."""
    return int(t.get("in_flight", 0))


def _received(t: Mapping[str, Any]) -> int:
    """Messages that reached this bus from another one, which its publish count includes
    (duplicates dropped on arrival too, so a run's total is a slight undercount then)."""
    return int(t.get("received", 0))


def _settled_by(reports: Sequence[Mapping[str, Any]], node: str) -> int | None:
    """Messages ``node`` settled for the processes that made ``reports``; None when their
    transport does not count that (only the ZeroMQ one does)."""
    counts = [
        int(by.get(node, 0))
        for r in reports
        if (by := r.get("transport", {}).get("settled_by")) is not None
    ]
    return sum(counts) if counts else None


def bus_status(bus: Bus, team: Team) -> dict[str, Any]:
    """The counters the driver polls to see inputs progress and the cluster go quiet."""
    t = _transport_stats(bus)
    observers: list[Observer] = team.of_role(Observer)
    stats = bus.stats()
    return {
        "outstanding": bus.outstanding,
        "in_flight": _in_flight(t),
        "published": stats.published,
        # What the team's Monitors on other processes add to theirs (_team_dead_letters).
        "dead_letters": stats.dlq_size,
        "inputs": sum(o.emitted + o.malformed for o in observers),
        "inputs_done": all(o.done.is_set() for o in observers),
        # Zero until a heartbeat came back: no round trip measured, no offset known.
        "clock_offset_ns": t.get("clock_offset_ns") if t.get("rtt_ns") else None,
        "clock_shared": bool(t.get("clock_shared")),
    }


class _OwnOutcomes(Outcomes):
    """The decisions one process of a multi-process run published itself: a message that
    crossed to it is its publisher's, so the processes' tallies add up to the team's."""

    __slots__ = ()

    def on_publish(self, env: Envelope) -> None:
        if not isinstance(env.reply, Receipt):
            super().on_publish(env)


def _tally(team: Team) -> Outcomes | None:
    """A process's live tally of the team's declared outcome (none without one)."""
    o = team.outcomes
    if o is None or not o.spec.declared:
        return None
    return _OwnOutcomes(o.spec, o.labels)


def _quiet(status: Mapping[str, Any]) -> bool:
    return status["outstanding"] == 0 and status["in_flight"] == 0


class NodeHost:
    """A bus over ZeroMQ hosting some of a scenario's agents: what ``pantheon node`` runs.

    ``agents`` names the agents to host; None takes the ones ``transport.nodes`` places on
    ``node``, and then :meth:`start` also waits until every other process of the placement
    is known to the broker (see :meth:`Placement.probes`). The agents are configured from
    ``scenario`` exactly as in-process, so moving an agent between processes changes
    nothing in it.

    ``telemetry`` (a :class:`pantheon.telemetry.Telemetry`, as ``pantheon node`` builds from
    the scenario and the ``OTEL_*`` variables) traces this bus; :meth:`aclose` flushes and
    shuts it down, so the spans of a node that leaves are exported before it exits.
    """

    def __init__(
        self,
        scenario: Scenario,
        agents: Sequence[str] | None,
        *,
        connect: str,
        node: str,
        data: str | None = None,
        seed: int | None = None,
        session_id: str | None = None,
        outbox_path: Path | None = None,
        curve: Any = None,
        server_key: bytes | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        telemetry: Telemetry | None = None,
    ) -> None:
        placement = Placement.of(scenario)
        #: Where every agent of the run runs (agent -> node), for this node's live part.
        self.placed = {a: n for n, hosted in placement.nodes.items() for a in hosted}
        self.probes: list[str] = []
        if agents is None:
            if node not in placement.nodes:
                known = ", ".join(placement.nodes) or "none"
                raise ClusterError(
                    f"node {node!r} is not placed by scenario {scenario.name!r} "
                    f"(its transport.nodes has: {known}); name the agents with --agents"
                )
            agents = placement.hosts[node]
            self.probes = placement.probes(node)
        self.seed = scenario.seed if seed is None else seed
        team = build_team(scenario, seed=self.seed, outbox_path=outbox_path)
        _check_agents(scenario, agents, team)
        self.team = Team(
            {a: team.agents[a] for a in agents}, team.outbox, team.provider, tally=_tally(team)
        )
        #: The rest of the team's dead letters, as the driver tells them, for its Monitors.
        self.dead_letters = TeamDeadLetters()
        self.dead_letters.serve(self.team)
        self.node = node
        self.endpoint = connect
        self.connect_timeout = connect_timeout
        transport_cfg = scenario.transport
        heartbeat = getattr(transport_cfg, "heartbeat", 1.0)
        liveness = getattr(transport_cfg, "liveness", 3)
        #: Seconds after which the broker declares a silent peer lost.
        self.lost_after: float = heartbeat * liveness
        #: Seconds :meth:`stop_agents` waits for queued and in-flight work to settle.
        self.drain_timeout = DEFAULT_DRAIN_TIMEOUT
        transport: Transport
        if transport_cfg.kind == "nats":
            transport = _nats_transport(scenario, connect, node, connect_timeout)
        else:
            transport = _zmq().ZmqTransport(
                connect,
                node=node,
                data=data,
                curve=curve,
                server_key=server_key,
                heartbeat=heartbeat,
                liveness=liveness,
                connect_timeout=connect_timeout,
            )
        self.bus = Bus(transport=transport, session_id=session_id)
        self.bus.context = LiveEffects(self.seed)
        #: What this bus published itself, per topic (it also counts what reaches it).
        self.own_topics = count_own_topics(self.bus)
        self.telemetry = telemetry if telemetry is not None and telemetry.enabled else None
        if self.telemetry is not None:
            self.telemetry.instrument(self.bus)
        self.recorder: ShippingRecorder | None = None
        self._shipper: JetStreamShipper | None = None

    def ship_journal(self, out: TextIO) -> None:
        """Record this node's part of the session and ship it (``pantheon.runner._node_journal``):
        on NATS to the team's stream, on ZeroMQ as ``journal`` lines on ``out``, the
        control link to the driver. Before :meth:`start` (inside the running loop); needs
        the ``session_id`` the driver gave."""
        from pantheon.runner._node_journal import JetStreamShipper
        from pantheon.sessions import ShippingRecorder

        session = self.bus.session_id
        if session is None:
            raise ClusterError(f"node {self.node!r}: recording needs the run's --session id")
        ship: Callable[[int, bytes, bool], None]
        if hasattr(self.bus.transport, "journal_append"):
            ship = self._shipper = JetStreamShipper(self.bus.transport, session)
        else:
            ship = _shipper(out)
        self.recorder = ShippingRecorder(session, ship, seed=self.seed)

    async def finish_journal(self) -> None:
        """Ship the last records and the journal's end mark (after the agents stopped)."""
        if self.recorder is not None:
            recorder, self.recorder = self.recorder, None
            await recorder.finish()
            if self._shipper is not None:
                await self._shipper.drain()

    @property
    def journal_failed(self) -> BaseException | None:
        """The error that stopped this node's journal shipments to the stream, if one did."""
        return None if self._shipper is None else self._shipper.failed

    async def start(self) -> None:
        """Connect, subscribe the agents, wait for the other processes' routes, then start
        the agents (from here on they may emit)."""
        await _connect(self.bus, self.endpoint, self.connect_timeout)
        if self.recorder is not None:
            self.recorder.attach(self.bus)
        await self.team.attach(self.bus)
        await _subscribed(self.bus, self.connect_timeout)
        await _await_routes(self.bus, self.probes, self.connect_timeout, self.endpoint)
        await self.team.start()

    def status(self) -> dict[str, Any]:
        return bus_status(self.bus, self.team)

    def end_input(self) -> list[str]:
        """End the input of this node's Observers between two items (the driver relays
        its Ctrl-C): an item being published is published whole, nothing more is read, and
        the run goes on to finish what is in flight, as in one process. Returns the names
        of the Observers that were still reading."""
        reading = [o for o in self.team.of_role(Observer) if not o.done.is_set()]
        for observer in reading:
            observer.end_input()
        return [o.name for o in reading]

    async def stop_agents(self, timeout: float | None = None) -> None:
        """Stop the agents' own work, then wait (up to ``timeout``, default
        :attr:`drain_timeout`) for what is queued or in flight to settle."""
        await self.team.stop()
        await self.bus.drain(timeout=self.drain_timeout if timeout is None else timeout)

    def report(self) -> dict[str, Any]:
        """This process's :func:`~pantheon.runner._report.local_report`, with its transport."""
        t = _transport_stats(self.bus)
        return local_report(self.bus, self.team) | {"transport": t, "pid": os.getpid()}

    async def close_telemetry(self) -> None:
        """Export what is buffered (spans, a last metrics collection) and stop exporting."""
        if self.telemetry is not None:
            # Blocking export (OTLP over HTTP): off the loop.
            await asyncio.to_thread(self.telemetry.shutdown)

    async def aclose(self, *, drain: bool = True) -> None:
        """Leave the broker; ``drain=False`` dead-letters what is still queued
        (``bus_closed``) instead of handling it."""
        try:
            await self.bus.aclose(drain=drain)
            await self.team.aclose()
        finally:
            await self.close_telemetry()  # after the last span ended (a no-op if done)


def _check_agents(scenario: Scenario, agents: Sequence[str], team: Team) -> None:
    if not agents:
        raise ClusterError("a node needs at least one agent (--agents observer,reasoner,...)")
    seen: set[str] = set()
    for name in agents:
        if name in seen:
            raise ClusterError(f"agent {name!r} is listed twice")
        seen.add(name)
        if name in team.agents:
            continue
        if name in scenario.agents:
            raise ClusterError(
                f"agent {name!r} is disabled in scenario {scenario.name!r} "
                f"(agents.{name}.enabled: false)"
            )
        close = difflib.get_close_matches(name, list(team.agents), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ClusterError(
            f"unknown agent {name!r}{hint}; scenario {scenario.name!r} has: "
            f"{', '.join(team.agents)}"
        )


async def _connect(bus: Bus, endpoint: str, timeout: float) -> None:
    """Start ``bus`` (its transport's handshake with the broker), as a :class:`ClusterError`
    naming the endpoint and timeout when no broker answers or the broker refuses us."""
    try:
        # The transport bounds its handshake by its own connect_timeout; this outer bound
        # only guards against a transport that does not.
        async with asyncio.timeout(timeout + 5.0):
            await bus.start()
    except TimeoutError:
        with contextlib.suppress(Exception):
            await bus.aclose(drain=False)
        raise ClusterError(f"no broker answered at {endpoint} within {timeout:g} s") from None
    except BusError as exc:
        with contextlib.suppress(Exception):
            await bus.aclose(drain=False)
        raise ClusterError(str(exc)) from None


async def _subscribed(bus: Bus, timeout: float) -> None:
    """Wait until the broker routes by this bus's subscriptions (if the transport says).
    Bounded: a confirmation that never comes is a start-up failure to name, not a run that
    hangs silently (one did, once, in CI)."""
    sync = getattr(bus.transport, "sync", None)
    if sync is None:
        return
    try:
        async with asyncio.timeout(timeout):
            await sync()
    except TimeoutError:
        raise ClusterError(
            f"the run's other processes did not confirm this process's subscriptions "
            f"within {timeout:g} s"
        ) from None


async def _await_routes(bus: Bus, probes: Sequence[str], timeout: float, endpoint: str) -> None:
    """Wait until the transport knows a remote subscriber for every probe topic."""
    if not probes:
        return
    transport = bus.transport
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        missing = [p for p in probes if not transport.has_remote(p)]
        if not missing:
            return
        if loop.time() >= deadline:
            raise ClusterError(
                f"after {timeout:g} s the broker at {endpoint} still knows no subscriber "
                f"for {', '.join(missing)}: a node did not join"
            )
        await asyncio.sleep(_POLL)


# -- the node side of the control pipe ---------------------------------------------------------


#: One control line at a time: a node's recorder ships from its writer thread while the loop
#: answers commands.
_say_lock = threading.Lock()


def say_control(out: TextIO, event: str, **fields: Any) -> None:
    """One JSON event line to the driver on a node's (or broker's) control pipe: the way a
    process the driver spawned reports, errors included, since it has no bus to the driver
    it can trust."""
    line = json.dumps({"event": event, **fields}, default=repr) + "\n"
    with _say_lock:
        try:
            out.write(line)
            out.flush()
        except BrokenPipeError:
            # The driver is gone: nobody reads this. The end of its control pipe follows
            # and takes the node out as an orphan (its log, its journal's end). Raised
            # here, it ended the node mid-command instead (a ``status`` the driver asked
            # for just before it was killed): no log, the journal unfinished (CI: the NATS
            # resume test found an orphan's log missing, once in ~10 runs).
            return


#: Seconds an orphaned node (its driver died) has, past one liveness period, to ship its
#: last records and close before it exits regardless.
_ORPHAN_GRACE = 30.0


def orphan_log_path(session: str | None, node: str) -> Path:
    """Where an orphaned node writes its log: its stderr was a pipe to the driver that died,
    so what it said while it left (why its journal ends where it does) would be lost."""
    name = f"{session or 'unrecorded'}.{node}.log"
    return Path(tempfile.gettempdir()) / "pantheon-orphans" / name


def _log_to_file(path: Path) -> None:
    """Point this process's log at ``path`` (appended, JSON lines), at the same level."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        stream = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept until the process exits
    except OSError as exc:
        log.warning("orphan log not opened", path=str(path), error=repr(exc))
        return
    configure_logging(stream=stream, json=True, level=logging.getLogger().level)


async def _leave_orphaned(host: NodeHost) -> None:
    """Leave after the driver died: stop the agents (within one liveness period), then ship
    the journal's last records and its end mark, whatever stopping did; every step and
    failure goes to :func:`orphan_log_path` (``serve_node`` pointed the log there as soon
    as the pipe ended), not to the dead driver's pipe."""
    where = {"node": host.node, "session": host.bus.session_id}
    log.warning("driver gone: leaving", **where)
    try:
        await host.stop_agents(timeout=host.lost_after)
    except TimeoutError:
        log.warning(
            "work still outstanding after one liveness period", **where, status=host.status()
        )
    except Exception:
        log.exception("stopping the agents failed", **where)
    try:
        await host.finish_journal()
    except Exception:
        log.exception("the journal's last records were not shipped", **where)
        return
    failed = host.journal_failed
    if failed is not None:
        log.error("the journal's shipping had stopped", **where, error=repr(failed))
    else:
        log.warning("journal finished: last records and end mark shipped", **where)


def _watchdog(seconds: float) -> None:
    """Exit the process (status 3) after ``seconds``, whatever the event loop is doing."""
    timer = threading.Timer(seconds, os._exit, (3,))
    timer.daemon = True
    timer.start()


def _shipper(out: TextIO) -> Callable[[int, bytes, bool], None]:
    """A node's journal shipments as ``journal`` control lines to its driver (a pipe keeps
    their order; a blocking write is the writer's backpressure)."""

    def ship(seq: int, data: bytes, end: bool) -> None:
        say_control(out, "journal", data=base64.b64encode(data).decode("ascii"))

    return ship


async def _stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


#: Why a node's waiting approvals and budget admissions fail when its driver's pipe ends.
DRIVER_GONE = "the driver of the run is gone (its control pipe closed)"
#: Commands that may wait for the node's control loop. The driver sends one and waits for
#: its answer before the next, so one is ever waiting; a full queue would only hold the
#: reader back, never drop a line.
_COMMANDS = 16


def split_control(
    reader: asyncio.StreamReader,
    node: str,
    answers: Mapping[str, Callable[[dict[str, Any]], None]],
    gone: Iterable[Callable[[str, bool], None]],
) -> tuple[asyncio.Queue[bytes], asyncio.Task[None]]:
    """Read the driver's lines in a task, whatever the node's control loop is doing: a
    command named in ``answers`` (a decided approval, a budget answer: what a handler waits
    for; the end of the input a Ctrl-C of the run asks for) goes to its taker at once,
    every other line to the returned queue, then ``b""`` at the end of input. When the
    pipe ends or cannot be read, each of ``gone`` is told why and that the driver is dead
    (``gone(why, True)``: so what waits fails instead of hanging); cancelling the task
    tells them the node no longer listens (``gone(why, False)``). One reader for the
    pipe: the control loop may itself be waiting (a ``stop`` draining handlers that wait
    for an answer), so answers must not queue behind it."""
    queue: asyncio.Queue[bytes] = asyncio.Queue(_COMMANDS)
    takers = tuple(gone)

    def tell(why: str, dead: bool) -> None:
        for taker in takers:
            taker(why, dead)

    async def read() -> None:
        why = DRIVER_GONE
        try:
            while line := await reader.readline():
                try:
                    command = json.loads(line)
                except ValueError:
                    command = None  # not an answer: the control loop says what is wrong
                name = command.get("cmd") if isinstance(command, dict) else None
                take = answers.get(name) if isinstance(name, str) else None
                if take is not None:
                    take(command)
                else:
                    await queue.put(line)
        except asyncio.CancelledError:
            tell("the node no longer listens to its driver", False)
            raise
        except (ValueError, OSError) as exc:  # a line past the reader's limit, a bad pipe
            why = f"the driver's control pipe cannot be read ({type(exc).__name__}: {exc})"
            log.error("driver control pipe unreadable; leaving", node=node, why=why)
        tell(why, True)
        await queue.put(b"")  # the control loop leaves as when the driver is gone

    return queue, asyncio.get_running_loop().create_task(read())


async def serve_broker(broker: Any, out: TextIO | None = None) -> None:
    """Serve a started broker under a driver's control until ``leave`` or a closed stdin:
    ``ready`` carries the bound endpoint (the real port of ``:0``), ``stats`` answers the
    broker's counters (nodes lost, malformed frames...)."""
    out = out or sys.stdout
    reader = await _stdin_lines()
    say_control(out, "ready", endpoint=broker.endpoint, pid=os.getpid())
    while line := await reader.readline():
        command = json.loads(line).get("cmd")
        if command == "stats":
            say_control(out, "stats", stats=broker.stats())
        elif command == "leave":
            say_control(out, "report", stats=broker.stats())
            return
        else:
            say_control(out, "error", message=f"unknown command {command!r}")


async def serve_node(
    host: NodeHost,
    out: TextIO | None = None,
    *,
    journal: bool = False,
    live: Callable[[NodeHost, Callable[..., None]], NodeLive] | None = None,
) -> None:
    """Run ``host`` under a driver's control: commands on stdin, JSON lines on ``out``.

    ``journal``: record this node's part of the session and ship it to the driver as
    ``journal`` lines (``pantheon.sessions.ShippingRecorder``); the run is then watched live,
    and ``live(host, say)`` makes this node's part of the driver's feed, which sends with
    ``say(event, **fields)`` and answers the driver's ``redrive`` commands.

    ``ready`` is sent once the agents run; then ``status`` and ``stop`` are answered,
    ``leave`` answers the final report and returns. A closed stdin (the driver is gone)
    also makes the node leave. A start-up failure is sent as ``error`` and raised. The
    agents' approval requests go to the driver and their decisions come back on the same
    pipes, answered whatever the loop below is doing (:mod:`pantheon.approvals._relay`);
    so are their budget admissions, charged to the driver's ledgers
    (:mod:`pantheon.runner._budget_relay`), and ``end_input`` (the driver's Ctrl-C:
    :meth:`NodeHost.end_input`), answered with ``input_ended``."""
    out = out or sys.stdout
    desk = NodeDesk(host.node, functools.partial(say_control, out))
    desk.serve(host.team.agents.values())
    budget = NodeBudgetLink(host.node, functools.partial(say_control, out))
    budget.serve(host.team.agents.values())
    # A recorded run is watched live: this node's part goes to the driver's feed.
    part = live(host, functools.partial(say_control, out)) if journal and live else None

    def end_input(_command: Mapping[str, Any]) -> None:
        # Taken as it arrives: the control loop may be busy, and an input must stop now.
        say_control(out, INPUT_ENDED_EVENT, observers=host.end_input())

    answers = {
        DECIDED_COMMAND: desk.decided,
        BUDGET_COMMAND: budget.answered,
        END_INPUT_COMMAND: end_input,
        TEAM_DEAD_LETTERS_COMMAND: host.dead_letters.heard,
    }
    if part is not None:
        answers[REDRIVE_COMMAND] = part.redrive
        answers[WATCH_COMMAND] = part.watch

    def orphaned(why: str, dead: bool) -> None:
        # First of the takers, so what the relays then say goes to the orphan's log too.
        if dead:
            _log_to_file(orphan_log_path(host.bus.session_id, host.node))
            # Whatever hangs on the way out (a handler, a transport that cannot close, a
            # start-up still waiting for a server that died with the driver), an orphan
            # must not outlive its run: past this it exits as it stands. Armed here, where
            # the pipe's end is seen, not in the command loop a starting node has not
            # reached (such nodes were found alive 30 minutes after their driver).
            _watchdog(host.lost_after + _ORPHAN_GRACE)

    commands, pump = split_control(
        await _stdin_lines(),
        host.node,
        answers,
        (orphaned, desk.driver_gone, budget.driver_gone),
    )
    if journal:
        host.ship_journal(out)
    try:
        if part is not None:
            await part.start()
        await host.start()
    except Exception as exc:
        say_control(out, "error", message=str(exc))
        pump.cancel()
        with contextlib.suppress(Exception):
            await host.aclose()
        raise
    say_control(out, "ready", node=host.node, pid=os.getpid(), agents=list(host.team.agents))
    left_orphaned = False
    try:
        while True:
            line = await commands.get()
            if not line:
                # The driver is gone, and likely its broker with it: nobody will read a
                # report, and work in flight may never settle. Leave within one liveness
                # period rather than waiting out the drain timeout.
                left_orphaned = True  # the watchdog is armed (``orphaned`` above)
                await _leave_orphaned(host)
                return
            command = json.loads(line).get("cmd")
            if command == "status":
                say_control(out, "status", **host.status())
            elif command == "stop":
                try:
                    await host.stop_agents(timeout=host.drain_timeout)
                except TimeoutError:
                    say_control(
                        out,
                        "error",
                        message=f"work still outstanding {host.drain_timeout:g} s after the "
                        f"agents stopped: {host.status()}",
                    )
                else:
                    say_control(out, "stopped")
            elif command == "leave":
                # Export before answering (the agents stopped, the bus is drained: no more
                # spans): the driver gives a node that has reported only a short while to
                # exit, and a slow collector must not make it look dead.
                await host.close_telemetry()
                # Every journal line goes out before the report: the driver ends the session
                # once it has the reports, so the link's order says the journal is whole.
                await host.finish_journal()
                if part is not None:
                    await part.aclose()  # its last part: the agents are done
                say_control(out, "report", report=host.report())
                return
            else:
                say_control(out, "error", message=f"unknown command {command!r}")
    finally:
        pump.cancel()
        if part is not None:
            await part.cancel()  # an orphan or a failed start: nobody reads its parts
        await host.aclose(drain=not left_orphaned)


#: The driver's request that a node end its Observers' input (its Ctrl-C, relayed), and the
#: node's answer naming those that were still reading.
END_INPUT_COMMAND = "end_input"
INPUT_ENDED_EVENT = "input_ended"
#: A node's live part (event) and the driver's request to redrive one of its dead letters
#: (command), answered by ``redriven`` (``pantheon.live.NodeParts`` sends the events).
LIVE_EVENT = "live"
REDRIVE_COMMAND = "redrive"
REDRIVEN_EVENT = "redriven"
#: Whether anyone watches the driver's feed (command): nodes send parts only then.
WATCH_COMMAND = "watch"
#: Seconds the driver waits for a node to answer a redrive.
_REDRIVE_TIMEOUT = 10.0


class NodeLive(Protocol):
    """A node's part of its driver's live feed (``pantheon.live.NodeParts``, which the
    ``pantheon node`` command gives :func:`serve_node`)."""

    async def start(self) -> None: ...

    def redrive(self, command: Mapping[str, Any]) -> None: ...

    def watch(self, command: Mapping[str, Any]) -> None: ...

    async def cancel(self) -> None: ...

    async def aclose(self) -> None: ...


# -- the driver side ---------------------------------------------------------------------------


class _Child:
    """A node (or broker) process as the driver sees it: its pipes, state and last words."""

    def __init__(
        self, name: str, agents: tuple[str, ...], proc: asyncio.subprocess.Process, what: str
    ) -> None:
        self.name = name
        self.agents = agents
        self.proc = proc
        self.what = what
        self.stderr: deque[str] = deque(maxlen=_STDERR_TAIL)
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.ready: dict[str, Any] | None = None
        self.killed_at: float | None = None
        self.alive = True
        self.last_status: dict[str, Any] | None = None
        self.report: dict[str, Any] | None = None
        #: Where this node's journal shipments go (the driver's recorder), and how many came.
        self.on_journal: Callable[[str, bytes], None] | None = None
        self.shipments = 0
        self.bad_lines = 0
        #: Other events taken as they arrive instead of answering a :meth:`call` (``eof``
        #: too, besides ending the calls): event kind -> handler.
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        loop = asyncio.get_running_loop()
        self._readers = [
            loop.create_task(self._read_stdout()),
            loop.create_task(self._read_stderr()),
        ]

    async def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            try:
                event = json.loads(line)
            except ValueError:
                self.stderr.append(line.decode(errors="replace").rstrip())
                continue
            if not isinstance(event, dict):
                continue
            if event.get("event") == "journal":
                self._journal(event)
                continue
            handler = self.handlers.get(str(event.get("event")))
            if handler is not None:
                handler(event)
                continue
            await self.events.put(event)
        self.alive = False
        if (ended := self.handlers.get("eof")) is not None:
            ended({"event": "eof"})
        await self.events.put({"event": "eof"})

    def _journal(self, event: Mapping[str, Any]) -> None:
        try:
            data = base64.b64decode(event.get("data", ""), validate=True)
        except (binascii.Error, TypeError, ValueError):
            # Counted and dropped (its records are missing from the session, and the store's
            # count of this node's shipments shows the gap).
            self.bad_lines += 1
            return
        self.shipments += 1
        if self.on_journal is not None:
            self.on_journal(self.name, data)

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.stderr.append(line.decode(errors="replace").rstrip())

    @classmethod
    async def spawn(
        cls, name: str, agents: tuple[str, ...], command: list[str], what: str
    ) -> _Child:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            # Its own session: a Ctrl-C at the terminal reaches the driver only, which then
            # stops its children in order instead of every process dying at once.
            start_new_session=True,
            limit=_LINE_LIMIT,
        )
        return cls(name, agents, proc, what)

    def tail(self) -> str:
        lines = [ln for ln in self.stderr if ln.strip()]
        return ("\n  " + "\n  ".join(lines[-12:])) if lines else ""

    async def send(self, message: Mapping[str, Any]) -> bool:
        """Write one command line to the process; False if it is gone."""
        if not self.alive:
            return False
        assert self.proc.stdin is not None
        # A node that dies closes its stdin pipe and its stdout together, and the loop may
        # notice the pipe first: ``alive`` is still True then. uvloop's write() raises
        # RuntimeError on a closed pipe (asyncio's drain() raises ConnectionResetError).
        if self.proc.stdin.is_closing():
            self.alive = False
            return False
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            self.alive = False
            return False
        return True

    async def call(self, command: str, expect: str, timeout: float) -> dict[str, Any] | None:
        """Send ``command`` and wait for the ``expect`` event; None if the node is gone."""
        if not await self.send({"cmd": command}):
            return None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    event = await self.events.get()
                    kind = event.get("event")
                    if kind == expect:
                        return event
                    if kind == "eof":
                        return None
                    if kind == "error":
                        raise ClusterError(f"{self.what}: {event.get('message')}")
        except TimeoutError:
            raise ClusterError(
                f"{self.what} (pid {self.proc.pid}) did not answer {command!r} within "
                f"{timeout:g} s{self.tail()}"
            ) from None

    async def wait_ready(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                event = await self.events.get()
        except TimeoutError:
            raise ClusterError(
                f"{self.what} (pid {self.proc.pid}) was not ready within {timeout:g} s{self.tail()}"
            ) from None
        kind = event.get("event")
        if kind == "ready":
            self.ready = event
            return
        await self._exited()
        if kind == "error":
            raise ClusterError(f"{self.what} failed to start: {event.get('message')}")
        raise ClusterError(
            f"{self.what} exited during start-up (code {self.proc.returncode}){self.tail()}"
        )

    async def _exited(self, timeout: float = 10.0) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.proc.wait()
                await asyncio.gather(*self._readers, return_exceptions=True)

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()

    async def close(self) -> None:
        """Make sure the process is gone (after a failure: kill it)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self._exited()
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        if self.proc.stdin is not None:
            self.proc.stdin.close()

    def describe(self, started: float) -> dict[str, Any]:
        code = self.proc.returncode
        if self.killed_at is not None:
            state = "killed"
        elif self.report is not None and code == 0:
            state = "ok"
        else:
            state = "died"
        return {
            "pid": self.proc.pid,
            "agents": list(self.agents),
            "status": state,
            "exit_code": code,
            "killed_at_s": None if self.killed_at is None else round(self.killed_at - started, 3),
            "clock_offset_us": _clock_us(
                (self.report or {}).get("transport", {}), self.last_status
            ),
            "transport": (self.report or {}).get("transport", {}),
            "journal": {"shipments": self.shipments, "dropped_lines": self.bad_lines},
        }


def _clock_us(transport: Mapping[str, Any], status: Mapping[str, Any] | None) -> float | None:
    """Clock offset to the broker in µs from final transport stats, else the last status;
    None while no heartbeat has come back (a run shorter than one heartbeat)."""
    if transport.get("rtt_ns"):
        return round(transport["clock_offset_ns"] / 1000, 1)
    ns = (status or {}).get("clock_offset_ns")
    return None if ns is None else round(ns / 1000, 1)


def _node_command(
    scenario_file: Path, node: str, endpoint: str, seed: int, session: str | None,
    outbox: Path | None, keys: Path | None, journal: bool = False,
) -> list[str]:  # fmt: skip
    cmd = [
        sys.executable, "-m", "pantheon.cli", "node",
        "--connect", endpoint, "--scenario", str(scenario_file), "--node", node,
        "--seed", str(seed), "--control",
    ]  # fmt: skip
    if session is not None:
        cmd += ["--session", session]
        if journal:
            cmd.append("--journal")
    if outbox is not None:
        cmd += ["--outbox", str(outbox)]
    if keys is not None:
        cmd += ["--curve-secret", str(keys / f"{node}.key_secret")]
        cmd += ["--server-key", str(keys / "broker.key")]
    return cmd


def _both(
    first: Callable[[dict[str, Any]], None], then: Callable[[dict[str, Any]], None]
) -> Callable[[dict[str, Any]], None]:
    def handle(event: dict[str, Any]) -> None:
        first(event)
        then(event)

    return handle


class _NodeInputs:
    """The input the run's nodes read (the Observers the placement puts there), as the
    driver reaches it (:class:`~pantheon.runner._build.RemoteInput`): ``pantheon run``'s
    first Ctrl-C ends it with an ``end_input`` command on each such node's control pipe,
    the way ``stop`` and ``leave`` travel on either transport (never over the bus, which
    may be what is stuck). A node's input counts as ended once its status said so or the
    node is gone."""

    __slots__ = ("_ended", "_nodes", "_tell", "observers")

    def __init__(
        self,
        observers: Mapping[str, tuple[str, ...]],
        nodes: Mapping[str, _Child],
        tell: Callable[[_Child, dict[str, Any]], None],
    ) -> None:
        #: Node -> the Observers placed on it (nodes without one left out).
        self.observers = {node: agents for node, agents in observers.items() if agents}
        self._nodes = nodes
        self._tell = tell
        self._ended: set[str] = set()

    def ended(self, node: str) -> None:
        """``node``'s status said its Observers are done."""
        self._ended.add(node)

    def _live(self) -> list[str]:
        return [
            node
            for node in self.observers
            if node not in self._ended and ((child := self._nodes.get(node)) is None or child.alive)
        ]

    def reading(self) -> list[str]:
        return [f"{agent}@{node}" for node in self._live() for agent in self.observers[node]]

    def end_input(self) -> None:
        for node in self._live():
            child = self._nodes.get(node)
            if child is not None:  # None only before spawn(), before any signal handler
                self._tell(child, {"cmd": END_INPUT_COMMAND})


class _Driver:
    """One multi-process run, from spawning the nodes to the merged summary."""

    def __init__(
        self,
        scenario: Scenario,
        endpoint: str,
        bus: Bus,
        *,
        seed: int,
        outbox_dir: Path | None,
        start_timeout: float,
        drain_timeout: float,
        desk: StoreDesk | None = None,
        journal: Callable[[str, bytes], None] | None = None,
        board: PartsBoard | None = None,
    ) -> None:
        source = Path(scenario.source)
        if not source.is_file():
            raise ClusterError(
                f"scenario {scenario.name!r} must come from a file (got {scenario.source!r}): "
                "each node process loads it"
            )
        self.scenario = scenario
        self.source = source.resolve()
        self.placement = Placement.of(scenario)
        self.endpoint = endpoint
        self.bus = bus
        self.seed = seed
        self.outbox_dir = outbox_dir
        self.start_timeout = start_timeout
        self.drain_timeout = drain_timeout
        self.nodes: dict[str, _Child] = {}
        self.approvals = DeskRelay(desk, self.placement.nodes)
        self.broker_stats: dict[str, Any] = {}
        self.curve = False
        self.startup_s = 0.0
        self.journal = journal
        #: Where the nodes' live parts go (the driver's live feed reads them): only recording
        #: nodes send parts (and take watch and redrive commands).
        self.board = board if journal is not None else None
        if self.board is not None:
            self.board.redrive = self.redrive_on
            self.board.on_watch = self._tell_watch
        self._chores: set[asyncio.Task[Any]] = set()
        self._follower: JournalFollower | None = None
        #: Redrives asked of nodes: id -> (node, the future its answer sets).
        self._redrives: dict[int, tuple[str, asyncio.Future[dict[str, Any]]]] = {}
        self._next_redrive = 0
        #: What a killed node left in the stream (pantheon.runner._takeover.inspect), NATS only.
        self.stream: dict[str, Any] = {}
        #: What other sessions of the team had left in the stream (RunSummary.leftovers).
        self.leftovers: dict[str, int] = {}
        sid = bus.session_id or "run"
        full = build_team(
            scenario,
            seed=seed,
            outbox_path=(outbox_dir / f"{sid}.jsonl") if outbox_dir else None,
        )
        mine = self.placement.hosts[DRIVER_NODE]
        self.inputs = _NodeInputs(
            {
                node: tuple(a for a in hosted if isinstance(full.agents.get(a), Observer))
                for node, hosted in self.placement.nodes.items()
            },
            self.nodes,
            self._tell,
        )
        # The team's budget ledgers are the driver's: its own agents are charged to them
        # directly, the nodes' through the relay, so a budget holds team-wide.
        self.team = Team(
            {a: full.agents[a] for a in mine},
            full.outbox,
            full.provider,
            budgets=full.budgets,
            rate_limiter=full.rate_limiter,
            tally=_tally(full),
            remote_input=self.inputs if self.inputs.observers else None,
        )
        #: The nodes' dead letters, for the driver's Monitors and those of the nodes
        #: (``monitored``) that host one: a Monitor watches the whole team.
        self.dead_letters = TeamDeadLetters()
        self.dead_letters.serve(self.team)
        self.monitored = monitor_nodes(self.placement.nodes, full)
        guarded = {name: a.budget for name, a in full.agents.items() if name not in mine}
        # So is the rate limiter: the model server meters the team's key, not a process.
        self.budgets = BudgetRelay(
            {name: guard for name, guard in guarded.items() if guard is not None},
            self.placement.nodes,
            full.rate_limiter,
        )

    def _from_stream(self, node: str, data: bytes) -> None:
        """A node's shipment read from a NATS run's stream: counted as its node's, as one
        that came on its control link is (``_Child._journal``), then ingested."""
        child = self.nodes.get(node)
        if child is not None:
            child.shipments += 1
        assert self.journal is not None
        self.journal(node, data)

    async def spawn(self) -> None:
        sid = self.bus.session_id
        for name, agents in self.placement.nodes.items():
            outbox = self.outbox_dir / f"{sid or 'run'}.{name}.jsonl" if self.outbox_dir else None
            run = _RUNS.get(id(self.bus.transport))
            keys = run.keys if run is not None else None
            command = _node_command(
                self.source, name, self.endpoint, self.seed, sid, outbox, keys,
                journal=self.journal is not None,
            )  # fmt: skip
            child = await _Child.spawn(name, agents, command, f"node {name!r}")
            child.on_journal = self.journal
            child.handlers[APPROVAL_EVENT] = self.approvals.on_request(name, child.send)
            child.handlers[BUDGET_EVENT] = self.budgets.on_event(name, child.send)
            child.handlers[LIVE_EVENT] = functools.partial(self._live_part, name)
            child.handlers[REDRIVEN_EVENT] = self._redriven
            child.handlers[INPUT_ENDED_EVENT] = functools.partial(self._input_ended, name)
            child.handlers["eof"] = _both(
                _both(self.approvals.on_lost(name), self.budgets.on_lost(name)),
                functools.partial(self._node_gone, name),
            )
            self.nodes[name] = child
            if self.board is not None and self.board.watched:
                self._tell_watch(True, [child])  # a watcher came before this node

    def _tell(self, child: _Child, command: dict[str, Any]) -> None:
        """Send ``command`` to ``child`` without waiting (from a callback: a watcher that
        came, a signal): a command no :meth:`_Child.call` waits an answer to."""
        task = asyncio.get_running_loop().create_task(child.send(command))
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    def _tell_watch(self, watched: bool, nodes: Iterable[_Child] | None = None) -> None:
        """Tell the nodes (all, or ``nodes``) whether anyone watches the live feed."""
        for child in self.nodes.values() if nodes is None else nodes:
            self._tell(child, {"cmd": WATCH_COMMAND, "on": watched})

    @staticmethod
    def _input_ended(node: str, event: Mapping[str, Any]) -> None:
        """A node's answer to ``end_input``: the Observers it stopped (none if its input
        had ended already); the run sees them finish in their node's status."""
        log.info("node ended its input", node=node, observers=event.get("observers"))

    def _live_part(self, node: str, event: Mapping[str, Any]) -> None:
        if self.board is not None:
            self.board.take(node, event.get("data"))

    def _redriven(self, event: Mapping[str, Any]) -> None:
        asked = self._redrives.get(event.get("id"))  # type: ignore[arg-type]
        if asked is not None and not asked[1].done():
            asked[1].set_result(dict(event))

    def _node_gone(self, node: str, _event: Mapping[str, Any]) -> None:
        """A node's output ended: its redrives will not be answered."""
        for name, future in self._redrives.values():
            if name == node and not future.done():
                future.set_result({"ok": False, "detail": "the node is gone"})

    async def redrive_on(self, node: str, entry_id: int) -> tuple[bool, str]:
        """Ask ``node`` to redrive its own dead letter ``entry_id`` (a watcher's redrive in
        the driver's live feed): (taken, what happened)."""
        child = self.nodes.get(node)
        if child is None or not child.alive:
            return False, "the node is gone"
        self._next_redrive += 1
        rid = self._next_redrive
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._redrives[rid] = (node, future)
        try:
            if not await child.send({"cmd": REDRIVE_COMMAND, "id": rid, "entry": entry_id}):
                return False, "the node is gone"
            async with asyncio.timeout(_REDRIVE_TIMEOUT):
                answer = await future
        except TimeoutError:
            return False, f"no answer within {_REDRIVE_TIMEOUT:g} s"
        finally:
            self._redrives.pop(rid, None)
        return bool(answer.get("ok")), str(answer.get("detail", ""))

    def _live(self) -> list[_Child]:
        return [n for n in self.nodes.values() if n.alive]

    async def _poll(self) -> list[dict[str, Any]]:
        """One status from each live process, the driver's own first."""
        mine = bus_status(self.bus, self.team)
        nodes = self._live()
        answers = await asyncio.gather(*(n.call("status", "status", 30.0) for n in nodes))
        out = [mine]
        for node, answer in zip(nodes, answers, strict=True):
            if answer is not None:
                node.last_status = answer
                out.append(answer)
                if answer.get("inputs_done"):
                    self.inputs.ended(node.name)
        last = {n.name: n.last_status for n in self.nodes.values()}
        for name, count in self.dead_letters.polled(mine, last, self.monitored).items():
            await self.nodes[name].send({"cmd": TEAM_DEAD_LETTERS_COMMAND, "dead_letters": count})
        return out

    async def _wait_inputs(self, on_progress: Callable[[int, int | None], None] | None) -> None:
        total = count_inputs(self.scenario)
        while True:
            statuses = await self._poll()
            if on_progress is not None:
                on_progress(sum(s["inputs"] for s in statuses), total)
            if all(s["inputs_done"] for s in statuses):
                return
            await asyncio.sleep(0.05)

    async def _quiesce(self, timeout: float) -> None:
        """Wait until no message moves anywhere (see the module docstring)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        previous: tuple[int, ...] | None = None
        while True:
            with contextlib.suppress(TimeoutError):
                await self.bus.drain(timeout=max(0.0, deadline - loop.time()))
            statuses = await self._poll()
            counts = tuple(s["published"] for s in statuses)
            if all(_quiet(s) for s in statuses):
                if counts == previous:
                    return
                previous = counts
            else:
                previous = None
            if loop.time() >= deadline:
                busy = {
                    name: s
                    for name, s in zip(
                        [DRIVER_NODE, *(n.name for n in self._live())], statuses, strict=False
                    )
                    if not _quiet(s)
                }
                raise ClusterError(f"the cluster did not go quiet within {timeout:g} s: {busy}")
            await asyncio.sleep(_POLL)

    async def run(
        self,
        attach: Callable[[Bus], Any] | None,
        on_progress: Callable[[int, int | None], None] | None,
    ) -> RunSummary:
        loop = asyncio.get_running_loop()
        if self.bus.context is None:
            self.bus.context = LiveEffects(self.seed)
        count_own_topics(self.bus)
        keys = _takeover.input_keys(self.bus, self.scenario)
        spawned = time.perf_counter()
        await self.spawn()
        await _connect(self.bus, self.endpoint, DEFAULT_CONNECT_TIMEOUT)
        self.leftovers = await self._leftovers()
        follower = None
        sid = self.bus.session_id
        if (
            self.journal is not None
            and sid is not None
            and hasattr(self.bus.transport, "journal_reader")
        ):
            from pantheon.runner._node_journal import JournalFollower

            follower = self._follower = JournalFollower(self.bus.transport, sid, self._from_stream)
        await self.team.attach(self.bus)
        if attach is not None:
            await attach(self.bus)
        await _subscribed(self.bus, self.start_timeout)
        await asyncio.gather(*(n.wait_ready(self.start_timeout) for n in self.nodes.values()))
        await _await_routes(
            self.bus, self.placement.probes(DRIVER_NODE), self.start_timeout, self.endpoint
        )
        # Elapsed time (and so throughput) counts from here, as for an in-process run; the
        # processes' start-up is reported on its own.
        started = time.perf_counter()
        self.startup_s = started - spawned
        await self.team.start()
        inputs_started = loop.time()
        faults = self.scenario.faults
        chores: list[asyncio.Task[Any]] = []
        if faults.flood is not None:
            f = faults.flood
            flood = run_flood(self.bus, f.topic, f.rate, f.count, Priority[f.priority.upper()])
            chores.append(loop.create_task(flood))
        if faults.kill_node is not None:
            k = faults.kill_node
            chores.append(loop.create_task(self._kill_later(k.node, k.at, inputs_started)))
        await self._wait_inputs(on_progress)
        await asyncio.gather(*chores)
        await self._quiesce(self.drain_timeout)
        self.stream = await self._after_kill(keys, started)
        await self.team.stop()
        await asyncio.gather(*(n.call("stop", "stopped", self.drain_timeout) for n in self._live()))
        await self._quiesce(self.drain_timeout)
        elapsed = time.perf_counter() - started
        reports = [local_report(self.bus, self.team) | {"transport": _transport_stats(self.bus)}]
        run = _RUNS.get(id(self.bus.transport))
        if run is not None:
            self.curve = run.keys is not None
            answer = await run.broker.call("stats", "stats", 30.0)
            self.broker_stats = (answer or {}).get("stats", {})
        for node in self._live():
            answer = await node.call("leave", "report", 30.0)
            if answer is not None:
                node.report = answer["report"]
                reports.append(node.report)
            await node._exited()
        if follower is not None:
            # A node reports once its journal is on the stream: read up to its end mark.
            left = {name for name, node in self.nodes.items() if node.report is not None}
            missing = await follower.finish(left, self.drain_timeout)
            if missing:
                log.error("journal end marks not read", nodes=sorted(missing))
        return self._summary(reports, elapsed, started)

    async def _leftovers(self) -> dict[str, int]:
        """What other sessions of the team left unacknowledged in a NATS stream (a run whose
        processes died), each said in the log: this run's consumers never see it, since
        each session's filter its own subjects, and it stays there for ``pantheon resume``.
        Nothing for a ZeroMQ run (its broker is the run's own)."""
        if self.scenario.transport.kind != "nats":
            return {}
        transport: Any = self.bus.transport
        found: dict[str, int] = await transport.leftovers()
        for session, messages in found.items():
            log.warning(
                "another session's messages wait in the team's stream: left for it, not "
                "handled by this run",
                other_session=session,
                messages=messages,
                stream=transport.stream,
                finish_it=f"pantheon resume {session}",
            )
        return found

    async def _after_kill(self, keys: _takeover.InputKeys, started: float) -> dict[str, Any]:
        """A NATS run in which a node died: wait until its standbys finished what it left,
        then say what waits in the stream for its agents with no live member (see
        :mod:`pantheon.runner._takeover`). Nothing to say for any other run.

        Killed by the scenario (``faults.kill_node``) or not (the OOM killer, a SIGKILL from
        outside): the stream holds the same either way, and no node has been asked to leave
        yet, so one whose output ended here is dead. Counting only the scenario's kills left
        an unplanned death's waiting items unnamed and ``zero lost`` "unknown"."""
        killed = [n for n, c in self.nodes.items() if c.killed_at is not None or not c.alive]
        if not killed or self.scenario.transport.kind != "nats":
            return {}
        ack_wait = _nats_config(self.scenario).ack_wait
        subs = self.placement.subscriptions
        live = [DRIVER_NODE, *(n for n, c in self.nodes.items() if n not in killed and c.alive)]
        try:
            await _takeover.settle(
                self.bus.transport,
                _takeover.groups_of(subs, live),
                lambda: self._quiesce(self.drain_timeout),
                ack_wait + self.drain_timeout,
            )
        except TimeoutError:
            raise ClusterError(
                f"the standbys of {', '.join(map(repr, killed))} did not finish what it left "
                f"within {ack_wait + self.drain_timeout:g} s (ack_wait + drain timeout)"
            ) from None
        quiet_s = time.perf_counter() - started
        stream = await _takeover.inspect(
            self.bus.transport, subs, killed, live, keys, ack_wait + DEFAULT_CONNECT_TIMEOUT
        )
        # Whether ``pantheon resume`` can finish what waits: it reads back what the dead
        # node published last, which a throwaway server takes with it.
        throwaway = _nats_config(self.scenario).server == "auto"
        return stream | {"quiet_at_s": round(quiet_s, 3), "throwaway": throwaway}

    async def _kill_later(self, name: str, at: float, since: float) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, since + at - loop.time()))
        node = self.nodes[name]
        node.killed_at = time.perf_counter()
        node.kill()
        await node._exited()

    def _summary(self, reports: list[dict[str, Any]], elapsed: float, started: float) -> RunSummary:
        messages = sum(r["published"] - _received(r.get("transport", {})) for r in reports)
        silent = [name for name, node in self.nodes.items() if node.report is None]
        summary = summarize(
            self.scenario,
            reports,
            seed=self.seed,
            elapsed=elapsed,
            session_id=self.bus.session_id,
            messages=messages,
            unverified={name: _settled_by(reports, name) for name in silent},
            stream=self.stream,
        )
        summary.leftovers = self.leftovers
        driver_t = reports[0].get("transport", {})
        summary.nodes = {
            DRIVER_NODE: {
                "pid": os.getpid(),
                "agents": list(self.team.agents),
                "status": "ok",
                "exit_code": None,
                "killed_at_s": None,
                "startup_s": round(self.startup_s, 3),
                "clock_offset_us": _clock_us(driver_t, None),
                "broker": {"endpoint": self.endpoint, "curve": self.curve, **self.broker_stats},
                # Publishers redeliver or dead-letter what a lost node held: summed over
                # every process that reported (a killed node's own counts die with it).
                "links": {
                    key: sum(r.get("transport", {}).get(key, 0) for r in reports)
                    for key in _LINK_COUNTS
                },
                "transport": driver_t,
            },
            **{name: node.describe(started) for name, node in self.nodes.items()},
        }
        died = [n for n, d in summary.nodes.items() if d["status"] == "died"]
        summary.expectations.append(
            {
                "name": "every node ran to the end (or was killed by the scenario)",
                "passed": not died,
                "expected": [],
                "actual": died,
                "state": "failed" if died else "passed",
            }
        )
        return summary

    async def close(self) -> None:
        if self.board is not None:  # the feed outlives the run: nobody to ask any more
            self.board.redrive = self.board.on_watch = None
        for chore in self._chores:
            chore.cancel()
        await asyncio.gather(*self._chores, return_exceptions=True)
        if self._follower is not None:  # a run that failed before reading every journal
            await self._follower.abandon()
        await asyncio.gather(*(n.close() for n in self.nodes.values()))
        await self.approvals.aclose()  # after the nodes: their pending requests cancelled
        await self.budgets.aclose()
        await self.team.aclose()


@dataclass(frozen=True, slots=True)
class _Run:
    """What cluster_transport() started for one run: the broker, and the run's CURVE key
    directory (``NAME.key_secret`` per process, ``broker.key``) when ``curve`` is on."""

    broker: _Child
    keys: Path | None


#: The run behind each transport cluster_transport() made, by id(transport).
_RUNS: dict[int, _Run] = {}


def _make_keys(directory: Path, names: Iterable[str]) -> Path:
    """A key pair per process of the run, and ``allowed/`` with every public key but the
    broker's, the broker's allow-list. Returns the allow-list directory."""
    keys = _zmq().CurveKeys
    allowed = directory / "allowed"
    for name in ("broker", *names):
        public, _ = keys.generate().save(directory / name)
        if name != "broker":
            allowed.mkdir(exist_ok=True)
            (allowed / public.name).write_bytes(public.read_bytes())
    return allowed


@asynccontextmanager
async def cluster_transport(scenario: Scenario) -> AsyncIterator[Transport | None]:
    """For a ZeroMQ scenario, start its broker (``pantheon broker`` in a process of its own,
    stopped on exit) and yield the driver's transport to it; for any other scenario, yield
    None and import nothing.

    With ``transport.curve`` every process of the run gets a key pair made for it (in a
    temporary directory, removed afterwards) and the broker admits only those keys.
    ``pantheon run`` builds the run's bus on this transport, so the recorder and the live
    feed hook the driver's bus exactly as they hook an in-process one."""
    if scenario.transport.kind == "nats":
        async with _nats_run(scenario) as transport:
            yield transport
        return
    if scenario.transport.kind != "zmq":
        yield None
        return
    zmq = _zmq()
    cfg = scenario.transport
    command = [
        sys.executable, "-m", "pantheon.cli", "broker", "--bind", cfg.broker,
        "--heartbeat", str(cfg.heartbeat), "--liveness", str(cfg.liveness), "--control",
    ]  # fmt: skip
    with contextlib.ExitStack() as cleanup:
        keys: Path | None = None
        curve: dict[str, Any] = {}
        if cfg.insecure:
            command.append("--insecure")
        if cfg.curve:
            keys = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="pantheon-")))
            allowed = _make_keys(keys, scenario.hosts())
            command += ["--curve-secret", str(keys / "broker.key_secret"), "--allow", str(allowed)]
            curve = {
                "curve": zmq.CurveKeys.load(keys / f"{DRIVER_NODE}.key_secret"),
                "server_key": zmq.load_public_keys(keys / "broker.key")[0],
            }
        broker = await _Child.spawn("broker", (), command, f"the broker ({cfg.broker})")
        try:
            await broker.wait_ready(DEFAULT_START_TIMEOUT)
            assert broker.ready is not None
            transport = zmq.ZmqTransport(
                broker.ready["endpoint"],
                node=DRIVER_NODE,
                heartbeat=cfg.heartbeat,
                liveness=cfg.liveness,
                **curve,
            )
            _RUNS[id(transport)] = _Run(broker, keys)
            try:
                yield transport
            finally:
                del _RUNS[id(transport)]
        finally:
            with contextlib.suppress(ClusterError, TimeoutError):
                await broker.call("leave", "report", 10.0)
            await broker.close()


@asynccontextmanager
async def _nats_run(scenario: Scenario) -> AsyncIterator[Transport]:
    """The driver's NATS transport: to ``transport.url``, or with ``server: auto`` to a
    throwaway ``nats-server -js`` on a free loopback port with a temporary store, stopped
    (and its store removed) when the run ends."""
    cfg = _nats_config(scenario)
    if cfg.server != "auto":
        transport = _nats_transport(scenario, cfg.url, DRIVER_NODE, DEFAULT_CONNECT_TIMEOUT)
        try:  # before a session is recorded or a node started (each would fail on it)
            await transport.probe()
        except BusError as exc:
            raise TransportUnreachable(str(exc)) from None
        yield transport
        return
    from bus.backends.nats import NatsServer, NatsServerError

    creds = cfg.credentials or _NO_CREDENTIALS
    users = [] if creds.user is None else [(creds.user, creds.password or "")]
    try:
        nkeys = [] if creds.nkey_seed is None else [_nkey_public(creds.nkey_seed)]
        server = NatsServer(users=users, nkeys=nkeys)
        await asyncio.to_thread(server.start)
    except (NatsServerError, OSError, ValueError) as exc:
        raise ClusterError(f"transport.server: auto: {exc}") from None
    try:
        yield _nats_transport(scenario, server.url, DRIVER_NODE, DEFAULT_CONNECT_TIMEOUT)
    finally:
        await asyncio.to_thread(server.stop)


def _nkey_public(seed_file: str) -> str:
    """The public user key of the nkey seed in ``seed_file``, which the run's own server
    admits (the seed stays with the clients)."""
    import nkeys

    try:
        seed = Path(seed_file).read_bytes().strip()
        return str(nkeys.from_seed(bytearray(seed)).public_key.decode())
    except nkeys.NkeysError as exc:
        raise ValueError(
            f"transport.credentials.nkey_seed {seed_file}: not a user seed ({exc})"
        ) from None


async def run_cluster(
    scenario: Scenario,
    *,
    seed: int | None = None,
    outbox_dir: Path | None = None,
    on_progress: Callable[[int, int | None], None] | None = None,
    bus: Bus | None = None,
    attach: Callable[[Bus], Awaitable[Any]] | None = None,
    drain_timeout: float = 60.0,
    start_timeout: float = DEFAULT_START_TIMEOUT,
    on_team: Callable[[Team], None] | None = None,
    desk: StoreDesk | None = None,
    journal: Callable[[str, bytes], None] | None = None,
    board: PartsBoard | None = None,
) -> RunSummary:
    """Run a ZeroMQ scenario as local processes and return its merged summary.

    ``bus`` must be a fresh bus on a :func:`cluster_transport`; without one, the broker is
    started here. The parameters are those of :func:`~pantheon.runner._runtime.run_scenario`,
    which calls this for a ZeroMQ scenario. ``journal(node, shipment)`` receives every
    node's journal shipments (the run's recorder's ``ingest``); without it the nodes do not
    record. The nodes' agents ask ``desk`` for approval through the driver
    (:mod:`pantheon.approvals._relay`). Recording nodes send their live parts to ``board``
    (the driver's live feed, :mod:`pantheon.live._parts`). Every process started is stopped
    on return, also when the run fails."""
    if bus is None:
        async with cluster_transport(scenario) as transport:
            return await run_cluster(
                scenario,
                seed=seed,
                outbox_dir=outbox_dir,
                on_progress=on_progress,
                bus=Bus(transport=transport),
                attach=attach,
                drain_timeout=drain_timeout,
                start_timeout=start_timeout,
                on_team=on_team,
                desk=desk,
                journal=journal,
                board=board,
            )
    endpoint = getattr(bus.transport, "endpoint", None)
    if scenario.transport.kind not in ("zmq", "nats") or not isinstance(endpoint, str):
        raise ClusterError(
            f"scenario {scenario.name!r} needs a bus on its ZeroMQ broker or NATS server "
            "(pantheon.runner._multiprocess.cluster_transport), not one with "
            f"{type(bus.transport).__name__}"
        )
    driver = _Driver(
        scenario,
        endpoint,
        bus,
        seed=scenario.seed if seed is None else seed,
        outbox_dir=outbox_dir,
        start_timeout=start_timeout,
        drain_timeout=drain_timeout,
        desk=desk,
        journal=journal,
        board=board,
    )
    if on_team is not None:
        on_team(driver.team)  # the driver's agents: the others' calls are on their nodes
    if desk is not None:
        desk.serve(driver.team)
    try:
        return await driver.run(attach, on_progress)
    except (asyncio.CancelledError, KeyboardInterrupt):
        # Cut short (a second Ctrl-C): close() ends nodes that did not die, and a request
        # they wait on is nobody's decision, left pending for a person or a resume.
        driver.approvals.interrupted()
        raise
    finally:
        await driver.close()
        await bus.aclose(drain=False)
        cfg = scenario.transport
        if (
            isinstance(cfg, NatsTransportConfig)
            and cfg.server != "auto"
            and bus.session_id
            # A driver that never got through its start left no consumer group to delete.
            and getattr(bus.transport, "started", False)
        ):
            # The run is over (a driver that dies never gets here, and its session is the
            # one ``pantheon resume`` takes): its consumer groups hold nothing anyone needs.
            await discard_consumers(scenario, endpoint, bus.session_id)


def install_stop_signals(stop: asyncio.Event) -> None:
    """SIGINT and SIGTERM set ``stop`` instead of killing the process mid-message."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)


async def import_from_stream(
    store: SessionStore,
    info: SessionInfo,
    scenario: Scenario,
    origins: Sequence[str] = (DRIVER_NODE,),
) -> int:
    """Read from a NATS run's stream the node shipments session ``info`` does not hold yet
    (its driver died before storing them) and add them to it; returns how many. Then the
    messages the dead processes ``origins`` published (the driver, or the nodes that died
    in a run whose driver lived) that the record lacks: their last records died with them.

    A run on a throwaway server (``server: auto``) took its stream with it when its driver
    died: that is a :class:`SessionError`, since resuming without the nodes' records would
    do again what they did. So is a server that cannot be read now (down, refusing us),
    saying so, rather than a transport's traceback."""
    cfg = _nats_config(scenario)
    if cfg.server == "auto":
        raise SessionError(
            f"session {info.id} ran on its own throwaway NATS server (transport.server: auto), "
            "which stopped with its driver: the nodes' records went with it, so resuming "
            "would do again what they did. Resume needs a server that outlives the run "
            "(transport.url)."
        )
    done = {n: j.shipments for n, j in store.node_journals(info.id).items()}
    shipments: list[tuple[str, bytes]] = []
    transport = _nats_transport(scenario, cfg.url, f"resume-{os.getpid()}", 10.0)
    try:
        async with Bus(transport=transport):
            reader = transport.journal_reader(
                info.id, lambda node, _seq, data, _end: shipments.append((node, data)), done
            )
            await reader.drain()
            # A dead process's last records died with it, but what it published (the
            # driver's inputs above all; a node's outputs) is on the stream: without them,
            # the other processes' work on those messages would have no cause in the
            # record and be done again.
            sent = {origin: await transport.published(origin, info.id) for origin in origins}
    except BusError as exc:
        raise SessionError(
            f"session {info.id}: cannot read the team's stream on the NATS server at "
            f"{cfg.url} ({type(exc).__name__}: {exc}). Resuming needs what the run's dead "
            f"{'processes' if len(origins) > 1 else 'process'} ({', '.join(origins)}) left "
            "there, or it would do that work again: start the server again (with its store) "
            "and resume"
        ) from None
    nodes = scenario.nodes()
    applied = await asyncio.to_thread(import_shipments, store, info.id, nodes, shipments)
    for origin, envelopes in sent.items():
        node = None if origin == DRIVER_NODE else origin
        await asyncio.to_thread(import_envelopes, store, info.id, envelopes, node)
    return applied


async def discard_consumers(scenario: Scenario, url: str, session: str) -> None:
    """Delete ``session``'s consumer groups from the NATS server at ``url`` (a run that is
    over: it ended, or was resumed), so no later run lists it as having left work; the
    stream keeps every message. A failure is logged, not raised: the run's outcome stands,
    and the server deletes idle consumers of a session itself after a day."""
    transport = _nats_transport(scenario, url, f"cleanup-{os.getpid()}", DEFAULT_CONNECT_TIMEOUT)
    try:
        async with Bus(transport=transport):
            gone = await transport.discard(session)
    except BusError as exc:  # not connected, or the server refused (TransportError)
        log.warning(
            "could not delete the session's consumer groups from the NATS server: the "
            "server deletes them after a day idle",
            other_session=session,
            url=url,
            error=f"{type(exc).__name__}: {exc}",
        )
        return
    log.info("session's consumer groups deleted", other_session=session, consumers=gone)
