"""Approvals from any node: an agent on a node process asks, the driver's desk decides.

In a multi-process run (``transport.kind: zmq`` or ``nats``) only the driver owns the
session store, so an agent on a node cannot write its request there itself. Its
``approve()`` goes to a :class:`NodeDesk`, which sends the request to the driver over the
node's control channel (the JSON lines of ``pantheon node --control``, see
``pantheon.runner._multiprocess``) and waits; the driver's :class:`DeskRelay` hands it to
the run's own :class:`~pantheon.approvals._desk.StoreDesk`, exactly as if a driver agent
had asked: the row lands in the store's approvals table with ``node`` naming the asker,
and every policy (``approvals.auto``, the timeout and its default, a person with
``pantheon approve``, the monitor or the web dashboard) decides it unchanged. The decision
goes back on the node's stdin, and the asking agent's ``human.approval`` effect records it
on the node, as it would in one process (so a replay serves it from the node's journal and
asks nobody).

Why the control channel and not the bus: the bus is what a scenario's faults break, and a
person's decision must still reach the node then; the channel is also already ordered,
per node, and closed when either end dies, which is how both ends learn of the other's
death:

* **the driver dies** (the node's stdin closes): every request the node still waits for
  fails with :class:`agents.ApprovalUnavailable`, and so does any asked afterwards; the
  asking handler fails like any failed effect (retries, then the dead letter queue). Their
  rows stay ``pending`` in the store: nobody decided them, and ``pantheon approvals``
  shows them so.
* **the driver loses a node** (its stdout closes: killed, crashed or gone): each of that
  node's requests still pending is decided ``rejected`` by ``node-lost`` with a note naming
  the node, since the handler that would act on the decision is gone. Why rejected and not
  a status of its own: a reader of the row (a person, a dashboard, an audit) must see that
  nothing was approved in that run, and every reader already knows ``rejected``. A message
  the lost node held and the transport redelivers to another member is asked again there
  as a new request (the desk numbers identical requests by occurrence). It is a
  cancellation, not anyone's answer: a run that asks the same request again later
  (``pantheon resume``) reopens the row and waits for a decision
  (:meth:`~pantheon.approvals._desk.StoreDesk.put`).
* **the driver stops its nodes because the run was interrupted** (a second Ctrl-C, a
  cancelled run: :meth:`DeskRelay.interrupted`): no node died, and nobody decided their
  requests, so their rows stay ``pending``, as those of a run in one process do and those
  of a run whose driver was killed: a person may decide them meanwhile, and
  ``pantheon resume`` asks them again (answered at once where someone decided).

The wire, one JSON object per line:

* node -> driver: ``{"event": "approval", "id": N, "agent": NAME, "request": {...}}``
  (``id`` counts the node's requests from 1; an event without one cannot be answered, and
  is logged and dropped);
* driver -> node: ``{"cmd": "decided", "id": N, "decision": {...}}`` with
  :meth:`agents.Decision.to_dict`, or ``{"cmd": "decided", "id": N, "error": "..."}`` when
  the request cannot be asked (then ``approve()`` raises :class:`agents.ApprovalUnavailable`
  with it). Each request is answered once; a second answer, or one for a request nobody
  waits for any more, is logged and ignored.

How many requests are outstanding is bounded by the agents themselves: each waiting
``approve()`` holds one of its agent's ``concurrency`` slots.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from agents import ApprovalUnavailable, Decision, check_approval_request
from pantheon._errors import DriverGone
from pantheon.sessions import Approval, SessionError

if TYPE_CHECKING:
    from pantheon.approvals._desk import StoreDesk

__all__ = [
    "APPROVAL_EVENT",
    "DECIDED_COMMAND",
    "LOST_BY",
    "MAX_REQUEST",
    "ApprovalDriverGone",
    "DeskRelay",
    "NodeDesk",
]

log = logging.getLogger("pantheon.approvals")


class ApprovalDriverGone(ApprovalUnavailable, DriverGone):
    """A node's agent asked for approval after its driver died (or was waiting then)."""


#: The node's event carrying a request, and the driver's command carrying its decision.
APPROVAL_EVENT = "approval"
DECIDED_COMMAND = "decided"
#: Who "decided" the pending requests of a node the driver lost.
LOST_BY = "node-lost"
#: Characters at most in a request as JSON. A control line longer than the driver reads
#: (64 MiB, sized for journal shipments) would end its reading of that node; a request is
#: kept far under that, and one of a mebibyte is no longer something a person reads. A
#: longer one is refused on the node, with its size.
MAX_REQUEST = 1 << 20


class NodeDesk:
    """The :class:`agents.ApprovalDesk` of a node process under a driver's control.

    ``say(event, **fields)`` writes one event line to the driver (the node's stdout).
    :meth:`pump` reads the driver's lines: it resolves ``decided`` commands at once, even
    while the node's control loop is busy with another command, and passes the others on.
    """

    def __init__(self, node: str, say: Callable[..., None]) -> None:
        self.node = node
        self._say = say
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next = 0
        self._gone: str | None = None
        #: What a request fails with once ``_gone``: the driver died, or this node stopped
        #: listening to it (cancelled on its way out: no artifact of a death to ask again).
        self._gone_error: type[ApprovalUnavailable] = ApprovalDriverGone

    def serve(self, agents: Iterable[Any]) -> None:
        """Give every agent of ``agents`` (this node's) this desk."""
        for agent in agents:
            agent.desk = self

    async def ask(self, agent: str, request: Mapping[str, Any]) -> Mapping[str, Any]:
        """Send the request to the driver and wait for its decision (as plain data)."""
        if self._gone is not None:
            raise self._gone_error(self._gone_message(agent))
        size = len(json.dumps(dict(request), default=repr))
        if size > MAX_REQUEST:
            raise ApprovalUnavailable(
                f"agent {agent!r} on node {self.node!r}: an approval request is at most "
                f"{MAX_REQUEST} characters as JSON to go to the driver (this one: {size})"
            )
        self._next += 1
        rid = self._next
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = future
        try:
            try:
                self._say(APPROVAL_EVENT, id=rid, agent=agent, request=dict(request))
            except (OSError, ValueError) as exc:  # stdout closed under us: the driver is gone
                raise ApprovalDriverGone(
                    f"node {self.node!r}: agent {agent!r} cannot reach the driver to ask for "
                    f"approval ({type(exc).__name__}: {exc})"
                ) from None
            return await future
        finally:
            self._waiting.pop(rid, None)

    def decided(self, command: Mapping[str, Any]) -> None:
        """Take one ``decided`` command: resolve the request it answers."""
        rid = command.get("id")
        future = self._waiting.get(rid) if isinstance(rid, int) else None
        if future is None or future.done():
            # Answered before, or its asker stopped waiting (its handler was cancelled).
            log.warning("node %s: an answer to request %r, which nobody waits for", self.node, rid)
            return
        error = command.get("error")
        if error is not None:
            future.set_exception(
                ApprovalUnavailable(f"node {self.node!r}, approval request {rid}: {error}")
            )
            return
        try:
            decision = Decision.from_dict(command["decision"]).to_dict()
        except (KeyError, TypeError, ValueError) as exc:
            future.set_exception(
                ApprovalUnavailable(
                    f"node {self.node!r}, approval request {rid}: the driver's decision is "
                    f"malformed ({type(exc).__name__}: {exc}): {command.get('decision')!r:.200}"
                )
            )
            return
        future.set_result(decision)

    def driver_gone(self, why: str, dead: bool = True) -> None:
        """Nothing more comes from the driver: fail every waiting request, and every later
        one, saying ``why``; with :class:`ApprovalDriverGone` if the driver died (``dead``),
        else (the node stopped listening) the plain :class:`~agents.ApprovalUnavailable`."""
        self._gone = why
        self._gone_error = ApprovalDriverGone if dead else ApprovalUnavailable
        for rid, future in list(self._waiting.items()):
            if not future.done():
                log.warning("node %s: approval request %d dropped: %s", self.node, rid, self._gone)
                future.set_exception(self._gone_error(self._gone_message(None)))

    def _gone_message(self, agent: str | None) -> str:
        who = f"agent {agent!r} on node {self.node!r}" if agent else f"node {self.node!r}"
        return f"{who} cannot ask for approval: {self._gone}; nobody can decide"


class DeskRelay:
    """The driver's end: asks the run's desk what the nodes' agents ask, answers them.

    ``desk`` is the run's :class:`~pantheon.approvals._desk.StoreDesk` (None: the run has none,
    and every request is answered with an error saying so); ``hosts`` maps each node to the
    agents it hosts, so a request naming an agent the node does not host is refused."""

    def __init__(self, desk: StoreDesk | None, hosts: Mapping[str, Iterable[str]]) -> None:
        self.desk = desk
        self.hosts = {node: frozenset(agents) for node, agents in hosts.items()}
        self._tasks: set[asyncio.Task[None]] = set()
        self._losses: set[asyncio.Task[None]] = set()
        self._rows: dict[str, dict[int, Approval]] = {}
        self._lost: set[str] = set()
        #: The run was interrupted: the nodes ending now were stopped, not lost.
        self._interrupted = False

    def on_request(
        self, node: str, send: Callable[[Mapping[str, Any]], Awaitable[bool]]
    ) -> Callable[[Mapping[str, Any]], None]:
        """The handler of ``node``'s ``approval`` events; ``send`` writes one command line to
        the node (False once it is gone)."""

        def handle(event: Mapping[str, Any]) -> None:
            rid = event.get("id")
            if not isinstance(rid, int) or isinstance(rid, bool):
                log.error("node %s sent an approval request without an id: %.200r", node, event)
                return
            self._spawn(self._forward(node, rid, event, send), self._tasks)

        return handle

    def on_lost(self, node: str) -> Callable[[Mapping[str, Any]], None]:
        """The handler of ``node``'s end of output (the process is gone or leaving)."""
        return lambda _event: self._spawn(self.lost(node), self._losses)

    @staticmethod
    def _spawn(work: Coroutine[Any, Any, None], tasks: set[asyncio.Task[None]]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _forward(
        self,
        node: str,
        rid: int,
        event: Mapping[str, Any],
        send: Callable[[Mapping[str, Any]], Awaitable[bool]],
    ) -> None:
        answer: dict[str, Any] = {"cmd": DECIDED_COMMAND, "id": rid}
        try:
            decision = await self._ask(node, event)
        except Exception as exc:
            # Answered, not raised: the node's agent waits for this request, and gets the
            # reason as its effect's error (a store that went away, a refused request).
            log.error("node %s, approval request %d: %s", node, rid, exc)
            answer["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        else:
            if decision is None:
                return  # the node is gone: nobody to answer
            answer["decision"] = dict(decision)
        await send(answer)

    async def _ask(self, node: str, event: Mapping[str, Any]) -> Mapping[str, Any] | None:
        agent = event.get("agent")
        if not isinstance(agent, str) or agent not in self.hosts.get(node, ()):
            hosted = ", ".join(sorted(self.hosts.get(node, ()))) or "none"
            raise ApprovalUnavailable(
                f"node {node!r} asked for approval for agent {agent!r}, which it does not "
                f"host (it hosts: {hosted})"
            )
        request = check_approval_request(agent, event.get("request"))
        if self.desk is None:
            raise ApprovalUnavailable(
                f"agent {agent!r} on node {node!r} asked for approval, but the run has no "
                "approval desk"
            )
        approval = await self.desk.put(agent, request, node=node)
        # No await between the check and the registration: lost() either sees this row or
        # has already marked the node lost, never neither.
        if node in self._lost:
            await self._cancel(node, approval)
            return None
        rows = self._rows.setdefault(node, {})
        rows[approval.id] = approval
        try:
            decision = await self.desk.wait(approval)
        finally:
            rows.pop(approval.id, None)
        return None if node in self._lost else decision

    def interrupted(self) -> None:
        """The run is being cut short (its driver's task cancelled: a second Ctrl-C): the
        nodes the driver ends from now on are stopped, not lost, and their pending requests
        stay ``pending`` (nobody decided them; ``pantheon resume`` asks them again) instead
        of being cancelled by :data:`LOST_BY`."""
        self._interrupted = True

    async def lost(self, node: str) -> None:
        """``node`` is gone: decide its pending requests ``rejected`` by :data:`LOST_BY`
        (left pending once the run is :meth:`interrupted`)."""
        self._lost.add(node)
        for approval in list(self._rows.get(node, {}).values()):
            await self._cancel(node, approval)

    async def _cancel(self, node: str, approval: Approval) -> None:
        if self.desk is None or not approval.pending:
            return
        if self._interrupted:
            log.warning(
                "approval %d left pending: the run was interrupted before a decision reached "
                "node %r; nobody decided it",
                approval.id,
                node,
            )
            return
        note = f"node {node!r} ended before a decision reached it; nobody acts on this request"
        try:
            decided = await self.desk.cancel(approval, by=LOST_BY, note=note)
        except SessionError as exc:
            log.error("approval %d of lost node %s: cannot cancel it: %s", approval.id, node, exc)
            return
        if decided.decided_by == LOST_BY:
            log.warning("approval %d cancelled: %s", approval.id, note)

    async def aclose(self) -> None:
        """Finish the cancellations of lost nodes, then stop forwarding (nobody is left to
        answer)."""
        await asyncio.gather(*self._losses, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
