"""The approval desk of one run: where its agents' ``approve()`` requests wait for a person.

A :class:`StoreDesk` writes each request into the session store as ``pending``
(:class:`pantheon.sessions.ApprovalBook`), then waits until the row is decided: by a person
in another process (``pantheon approve``, the monitor, the web dashboard), by the
scenario's scripted person (``approvals.auto``), or by the timeout, whose default decision
keeps an unattended run finite. One watcher task looks at every waiting row each
``approvals.poll`` seconds while anything waits (see ``pantheon.sessions._approvals`` for
why the store rather than the live feed's socket carries decisions).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import getpass
import hashlib
import json
import logging
import os
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pantheon.approvals._relay import LOST_BY
from pantheon.scenario import ApprovalsConfig, Scenario, recorded_scenario
from pantheon.sessions import (
    AlreadyDecided,
    Approval,
    ApprovalBook,
    ApprovalError,
    DeskFactory,
    SessionInfo,
    SessionStore,
)

if TYPE_CHECKING:
    from pantheon.runner import Team

__all__ = [
    "NOTICE_AFTER",
    "OnWaiting",
    "StoreDesk",
    "approval_desk",
    "request_key",
    "who",
]

log = logging.getLogger("pantheon.approvals")

#: Seconds a request waits before the desk says a person is needed (``on_waiting``): a
#: decision that comes sooner (the scripted person, a watcher quick on the monitor) is
#: not news; one that does not means the run stands still until somebody acts.
NOTICE_AFTER = 1.0

#: What a desk calls with the requests that have waited :data:`NOTICE_AFTER` seconds or more
#: and are still undecided, oldest first: once when the first do, again whenever more join.
OnWaiting = Callable[[Sequence[Approval]], None]


def who() -> str:
    """The person deciding, by default: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def request_key(agent: str, request: Mapping[str, Any], occurrence: int) -> str:
    """What identifies a request across a crash: the agent, the request's content, and how
    many identical requests that agent asked before it in the run. A resumed run asks the
    same requests in the same order, so it finds its rows again."""
    text = json.dumps([agent, dict(request)], sort_keys=True, default=repr)
    return f"{hashlib.sha256(text.encode()).hexdigest()[:32]}#{occurrence}"


@dataclass
class _Waiting:
    approval: Approval
    future: asyncio.Future[Approval]


class StoreDesk:
    """The :class:`agents.ApprovalDesk` of a run recorded as ``session_id`` in ``store``
    (requests numbered under ``origin``: the session itself, or the one a resumed run
    resumes). Agents get it through :meth:`serve`; :meth:`aclose` stops the watcher.

    ``on_waiting`` hears of requests nobody has decided for :data:`NOTICE_AFTER` seconds
    (see :data:`OnWaiting`): what ``pantheon run`` turns into the line saying who must act
    and how, since the run shows no other sign of waiting."""

    def __init__(
        self,
        store: Path,
        session_id: str,
        config: ApprovalsConfig,
        *,
        origin: str | None = None,
        on_waiting: OnWaiting | None = None,
    ) -> None:
        self.store_path = store
        self.session_id = session_id
        self.origin = origin or session_id
        self.config = config
        self.on_waiting = on_waiting
        self._noticed: set[int] = set()
        self._book: ApprovalBook | None = None
        self._store: SessionStore | None = None
        self._waiting: dict[int, _Waiting] = {}
        self._asked: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._opening = threading.Lock()
        #: Requests asked through this desk, and how many the timeout decided.
        self.asked = 0
        self.timed_out = 0

    def serve(self, team: Team) -> None:
        """Give every agent of ``team`` this desk (what ``run_scenario(desk=...)`` does)."""
        for agent in team.agents.values():
            agent.desk = self

    def count(self, agent: str, request: Mapping[str, Any]) -> None:
        """Count a request answered without asking (a resumed run serving a decision its
        recording holds), so the requests after it keep their keys."""
        self._asked[request_key(agent, request, 0)] += 1

    def count_key(self, key: str) -> None:
        """:meth:`count` for a request known by its recorded key only (one asked inside
        another effect, whose request a re-run never sees)."""
        self._asked[key.partition("#")[0] + "#0"] += 1

    def _open(self) -> ApprovalBook:
        # Called from worker threads: two first asks at once must not open two stores.
        with self._opening:
            if self._book is None:
                self._store = SessionStore(self.store_path)
                self._book = ApprovalBook(self._store)
            return self._book

    async def ask(
        self, agent: str, request: Mapping[str, Any], *, node: str | None = None
    ) -> Mapping[str, Any]:
        """Put the request in the store (or find it there, asked before a crash) and wait
        for its decision; returns :meth:`agents.Decision.to_dict`. ``node`` names the
        process of a multi-process run whose agent asks (None: this one)."""
        return await self.wait(await self.put(agent, request, node=node))

    async def put(
        self, agent: str, request: Mapping[str, Any], *, node: str | None = None
    ) -> Approval:
        """The first half of :meth:`ask`: the request's row, written (or found), not waited
        for. A caller that must act between the two (the driver of a multi-process run,
        which cancels the requests of a node it lost) calls this, then :meth:`wait`."""
        base = request_key(agent, request, 0)
        n = self._asked[base]
        self._asked[base] += 1
        cfg = self.config
        approval = await asyncio.to_thread(
            lambda: self._open().ask(
                origin=self.origin,
                session=self.session_id,
                agent=agent,
                key=request_key(agent, request, n),
                request=request,
                timeout=cfg.timeout,
                default_approve=cfg.default == "approve",
                node=node,
                # A lost node's cancellation said nobody in that run acts on the answer;
                # it answered nothing, so a run asking again (a resume) asks a person.
                reopen=(LOST_BY,),
            )
        )
        self.asked += 1
        return approval

    async def wait(self, approval: Approval) -> Mapping[str, Any]:
        """The second half of :meth:`ask`: wait until the row :meth:`put` returned is
        decided; returns :meth:`agents.Decision.to_dict`."""
        if not approval.pending:
            return approval.decision().to_dict()
        log.info("approval %d waits for a person: %s", approval.id, approval.summary)
        future: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        self._waiting[approval.id] = _Waiting(approval, future)
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        self._wake.set()
        try:
            decided = await future
        finally:
            self._waiting.pop(approval.id, None)
        return decided.decision().to_dict()

    async def cancel(self, approval: Approval, *, by: str, note: str) -> Approval:
        """Decide a pending request ``rejected`` (``by``, ``note``) because nobody can act
        on its decision any more: the process that asked is gone. A decision made before
        stands. Whoever waits for it (:meth:`wait`) gets the decision at once. No person's
        answer: a later run asking the same request again (``pantheon resume``) reopens a
        request cancelled by :data:`~pantheon.approvals._relay.LOST_BY` (:meth:`put`)."""
        decided = await asyncio.to_thread(
            lambda: self._decide(self._open(), approval, False, note, by)
        )
        w = self._waiting.get(decided.id)
        if w is not None and not decided.pending:
            _resolve(w.future, decided)
        return decided

    async def _watch(self) -> None:
        """While anything waits: read the waiting rows, resolve the decided ones, decide
        the ones past their deadline (or due for the scripted person)."""
        while True:
            if not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            # Copied here, on the loop's thread: ask() adds to it while the poll runs.
            waiting = dict(self._waiting)
            try:
                await asyncio.to_thread(self._poll_once, waiting)
            except Exception as exc:
                # The store went away under us (disk, permissions): every waiter fails with
                # the reason, as its effect, rather than waiting for ever.
                log.error("approvals: cannot read the session store: %s", exc)
                for w in list(self._waiting.values()):
                    if not w.future.done():
                        w.future.set_exception(exc)
                self._waiting.clear()
                continue
            self._notice()
            await asyncio.sleep(self.config.poll)

    def _notice(self) -> None:
        """Tell ``on_waiting`` of the requests undecided for :data:`NOTICE_AFTER` seconds,
        when any of them is new to it. On the loop's thread, after a poll: the decisions
        that poll found are resolved by then (their callbacks were queued before its
        result), so a decided request is not reported waiting."""
        if self.on_waiting is None:
            return
        due = time.time() - NOTICE_AFTER
        stale = sorted(
            (
                w.approval
                for w in self._waiting.values()
                if not w.future.done() and w.approval.asked <= due
            ),
            key=lambda a: a.id,
        )
        if {a.id for a in stale} - self._noticed:
            self._noticed.update(a.id for a in stale)
            try:
                self.on_waiting(stale)
            except Exception:
                # Only a notice: the watcher must go on, or every request would wait for
                # ever. Logged with its traceback, not swallowed.
                log.exception("approvals: the notice of %d waiting requests failed", len(stale))

    def _poll_once(self, waiting: dict[int, _Waiting]) -> None:
        book = self._open()
        now = time.time()
        auto = self.config.auto
        after = None
        if auto is not None:
            after = auto.approve_after if auto.approve_after is not None else auto.reject_after
        for approval in book.among(self.origin, waiting):
            if approval.corrupt is not None:
                # Its own waiter fails (one dead letter, naming the row); the others, and
                # the run, go on. Deciding it by the deadline would trust a damaged row.
                w = waiting.get(approval.id)
                if w is not None:
                    error = ApprovalError(approval.corrupt_message())
                    w.future.get_loop().call_soon_threadsafe(_fail, w.future, error)
                continue
            if approval.pending:
                if auto is not None and after is not None and now >= approval.asked + after:
                    approval = self._decide(
                        book, approval, auto.approve_after is not None, auto.note, auto.by
                    )
                elif now >= approval.deadline:
                    approval = self._decide(
                        book,
                        approval,
                        approval.default_approve,
                        f"no decision in {self.config.timeout:g}s: default {approval.default}",
                        "timeout",
                    )
                    self.timed_out += approval.decided_by == "timeout"
            if not approval.pending:
                w = waiting.get(approval.id)
                if w is not None:
                    w.future.get_loop().call_soon_threadsafe(_resolve, w.future, approval)

    @staticmethod
    def _decide(
        book: ApprovalBook, approval: Approval, approved: bool, note: str, by: str
    ) -> Approval:
        try:
            return book.decide(approval.origin, approval.id, approved=approved, note=note, by=by)
        except AlreadyDecided as exc:  # a person got there first: theirs stands
            return exc.approval

    async def aclose(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        if self._store is not None:
            self._store.close()
            self._store = None
            self._book = None


def _resolve(future: asyncio.Future[Approval], approval: Approval) -> None:
    if not future.done():
        future.set_result(approval)


def _fail(future: asyncio.Future[Approval], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)


@contextlib.asynccontextmanager
async def approval_desk(
    scenario: Scenario,
    store: Path | None,
    session_id: str | None,
    *,
    origin: str | None = None,
    on_waiting: OnWaiting | None = None,
) -> AsyncIterator[StoreDesk]:
    """The desk of one run. A run that is not recorded (``--no-record``) keeps its requests
    in a throwaway store: the scripted person and the timeout decide them, since nobody
    else can find them (``on_waiting`` still hears of them: the run waits all the same)."""
    with contextlib.ExitStack() as stack:
        if store is None or session_id is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pantheon-")))
            store, session_id = folder / "approvals.db", f"unrecorded-{os.getpid()}"
        desk = StoreDesk(
            store, session_id, scenario.approvals, origin=origin, on_waiting=on_waiting
        )
        try:
            yield desk
        finally:
            await desk.aclose()


def redrive_desk(
    info: SessionInfo, store: Path, *, on_waiting: OnWaiting | None = None
) -> tuple[DeskFactory | None, float]:
    """The approval desk a redrive of session ``info`` gives its team, as ``pantheon run``
    gives its own (the recorded scenario's ``approvals``, on the redrive's new session;
    ``on_waiting`` as :class:`StoreDesk` says), and how long a request may wait for its
    decision. None (nobody to ask) when the session's scenario cannot be read back (a
    ``--setup`` team on one that no longer parses): an agent that asks then fails its
    message, which the redrive reports."""
    scenario = recorded_scenario(info.scenario_text, info.scenario_dir)
    if scenario is None:
        return None, 0.0
    desk = functools.partial(approval_desk, scenario, store, on_waiting=on_waiting)
    return desk, scenario.approvals.timeout
