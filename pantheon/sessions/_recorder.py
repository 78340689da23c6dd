"""The recorder: hooks a bus's listeners and writes the run into the session store.

Where the cost goes, and why it is arranged this way (measured with
``tests/pantheon/sessions_bench.py``):

* Per message, the bus thread encodes: the publish listener, the delivery listener and the
  effects sink each write one msgpack row, in C, into the open journal chunk of their kind
  (``_journal.EnvelopeRows``...), and keep nothing else: the envelope and its payload are
  freed when their handlings end, as they are without a recorder. A payload is recorded as
  it was published, whatever a handler does to it afterwards.
* Every ``commit_interval`` the recorder's ticker (a task on the bus's loop) takes the
  chunks written so far and hands them to the writer thread, which group-commits them with
  the rare rows (dead letters, breaker transitions, metrics) in one transaction (see
  ``_journal``); SQLite releases the GIL for most of that.

The commit cadence therefore follows the loop: a publisher that never yields to the loop
(no ``await`` that suspends) for a stretch also commits nothing during that stretch; it
does not lose anything unless the process dies inside it. Bus workers yield every 128
messages, so a running team ticks on time.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from bus import (
    BreakerEvent,
    Bus,
    DeadLetter,
    Envelope,
    InProcessTransport,
    ObserverHandle,
    beside_the_loop,
)
from pantheon.sessions._codec import safe_repr
from pantheon.sessions._effects import EffectsContext, EffectSink, RecordingEffects
from pantheon.sessions._errors import RecordingError
from pantheon.sessions._journal import (
    Chunk,
    DeliveryRows,
    EffectRows,
    EnvelopeRows,
    Materializer,
    insert_rows,
)
from pantheon.sessions._shipping import (
    MAX_SHIPMENT_BYTES,
    Shipment,
    decode_shipment,
    encode_shipment,
)
from pantheon.sessions._store import (
    SessionStore,
    Status,
    connect,
    to_db,
)
from pantheon.telemetry import get_logger

R = TypeVar("R", bound=RecordingEffects)
#: Where a node's writer hands each shipment: (its number, its bytes, whether it is the end
#: mark), on the writer thread, in order.
Ship = Callable[[int, bytes, bool], None]

__all__ = [
    "DEFAULT_COMMIT_INTERVAL",
    "DEFAULT_COMMIT_ROWS",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_METRICS_INTERVAL",
    "Recorder",
    "ShippingRecorder",
    "import_envelopes",
    "import_shipments",
]

log = get_logger("pantheon.sessions")

#: Seconds between group commits. A SIGKILL loses at most what was published in the last
#: interval, plus one ticker period (10 ms) and the commit in flight.
DEFAULT_COMMIT_INTERVAL = 0.05
#: A batch is handed to the writer early once this many rows wait, so a burst does not
#: build one huge transaction.
DEFAULT_COMMIT_ROWS = 20_000
#: Rows handed to the writer and not yet committed (envelopes, deliveries, and the rare rows:
#: effects, dead letters, breaker transitions, metrics), past which the recorder pauses the
#: event loop until the writer is down to half. Recording never drops a row: when the disk cannot
#: keep up it slows the run instead, and the pause shows in the run's latencies.
DEFAULT_MAX_PENDING = 200_000
#: Seconds between ``bus.stats()`` snapshots.
DEFAULT_METRICS_INTERVAL = 1.0
#: While the loop is busy, the row tables still advance by one journal chunk this often (s).
_MAX_LAG = 1.0
#: Longest stretch (s) the writer materializes before looking at the loop and its queue again.
_MATERIALIZE_SLICE = 0.02
_TICK = 0.01
#: A ticker wake-up later than this (s) means the loop had work waiting (or no core): the
#: writer does not materialize in that window.
_LATE = 0.005
#: A loop thread using less than this share of a core is idle, however late its ticker.
_IDLE_SHARE = 0.1
#: The driver of a multi-process run materializes during the run only while the machine
#: leaves at least this many cores idle (see ``_Writer._loop_idle``).
_SPARE_CORES = 0.5
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_idle_s() -> float | None:
    """CPU seconds the whole machine has left idle (all cores, since boot; Linux's
    ``/proc/stat``), or None where that cannot be read."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
        return (int(fields[4]) + int(fields[5])) / _CLOCK_TICKS  # idle + iowait
    except (OSError, IndexError, ValueError):
        return None


class _Writer(threading.Thread):
    """The one thread that touches SQLite for a recording.

    It commits each batch it is handed in one transaction: envelopes and deliveries as
    journal chunks, with the rare rows (dead letters, breaker transitions, effects, metrics)
    that were queued by then. Between batches it materializes journal chunks into rows
    while the event loop's thread is less than half busy (measured from that thread's CPU
    clock, where the platform has one), and one chunk every ``max_lag`` seconds regardless,
    so the row tables keep moving during a saturated run without taking its GIL. Whatever
    is left is materialized on close.
    """

    def __init__(
        self,
        path: Path | None,
        synchronous: str,
        session_id: str,
        *,
        ship: Ship | None = None,
        nodes: Sequence[str] = (),
    ) -> None:
        super().__init__(name=f"pantheon-recorder-{session_id}", daemon=True)
        #: Ship mode (a node's recorder): each commit becomes a :class:`Shipment` handed to
        #: ``ship`` instead of a transaction on ``path``.
        self.ship = ship
        #: A multi-process run's nodes, in placement order: a dead letter's entry id in the
        #: store is ``own id * (len(nodes) + 1) + index`` (the driver's index 0, a node's its
        #: position + 1), so the processes' entry ids never collide and a single-process
        #: run's stay its own.
        self.node_index = {name: i + 1 for i, name in enumerate(nodes)}
        self.processes = len(nodes) + 1
        #: Shipments a node sent that could not be decoded (dropped; the node is named in
        #: the log, and its journal shows the gap).
        self.bad_shipments = 0
        self._applied: dict[str, int] = {}  # node -> shipments applied
        #: The process this writer's own chunks are recorded as (None: the recording one;
        #: :func:`import_envelopes` names a dead node whose messages it adds).
        self.own_node: str | None = None
        self.path = path
        self.synchronous = synchronous
        self.session_id = session_id
        self.max_lag = _MAX_LAG
        self.loop_clock: int | None = None
        #: Longest a ticker wake-up was late (s) since the writer last looked: written by the
        #: loop's thread, read and reset by this one (a float store; a lost update only
        #: shortens one window).
        self.loop_late = 0.0
        #: Batches of journal chunks from the bus thread.
        self.inbox: deque[list[Chunk]] = deque()
        #: Rare rows, appended by the bus thread at any time.
        self.events: deque[tuple[Any, ...]] = deque()
        self.backlog = 0  # rows handed over and not committed yet
        self.error: BaseException | None = None
        self.commits = 0
        self.rows = 0
        self.max_commit_s = 0.0
        self.materialized = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._submitted = 0
        self._committed = 0
        self._journal: deque[float] = deque()  # creation times of our unmaterialized chunks
        self._jseq = 0
        self._ship_seq = 0
        self._seq = {"envelopes": 0, "deliveries": 0, "breakers": 0, "effects": 0, "metrics": 0}
        self._cpu_mark: tuple[float, float, float | None] | None = None
        self._forced = 0.0

    # -- called from other threads ----------------------------------------------------------

    def submit(self, batch: list[Chunk]) -> int:
        """Queue a batch (empty: only the pending events) and return its ticket."""
        with self._cond:
            if batch:
                self.inbox.append(batch)
                self.backlog += sum(chunk[1] for chunk in batch)
            self._submitted += 1
            self._cond.notify_all()
            return self._submitted

    def wait(self, ticket: int, timeout: float | None = None) -> None:
        """Block until batch ``ticket`` and everything before it is committed (or failed)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._committed >= ticket or self.error is not None or not self.is_alive(),
                timeout,
            )

    def pending(self) -> int:
        """Rows handed over and waiting: the batches' and the rare ones."""
        return self.backlog + len(self.events)

    def wait_below(self, rows: int, timeout: float = 60.0) -> None:
        """Block until at most ``rows`` rows wait (backpressure from the bus thread)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self.pending() <= rows or self.error is not None or not self.is_alive(),
                timeout,
            )

    def close(self, timeout: float | None = None) -> None:
        """Commit what is queued, materialize the journal, stop the thread and wait."""
        if not self.is_alive():
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self.join(timeout)

    # -- the thread -------------------------------------------------------------------------

    def run(self) -> None:
        # Its waits for a CPU holding the GIL are the machine's, not the handlers' (bus._sched).
        with beside_the_loop():
            self._run()

    def _run(self) -> None:
        conn: Any = None
        try:
            if self.ship is None:
                assert self.path is not None
                conn = connect(self.path, self.synchronous)
        except BaseException as exc:
            self._fail(exc)
            return
        try:
            materializer = None if conn is None else Materializer(conn, self.session_id, fresh=True)
            while True:
                with self._cond:
                    if not self._stopping and self._committed == self._submitted:
                        # Sleep until handed work; wake on a timer only while journal chunks
                        # wait to be materialized. Every wake-up is a GIL handoff that a
                        # busy loop pays for, so there is no idle polling.
                        self._cond.wait(0.05 if self._journal else None)
                    stopping = self._stopping
                    target = self._submitted
                if target != self._committed or (stopping and (self.inbox or self.events)):
                    batches = []
                    while self.inbox:
                        batches.append(self.inbox.popleft())
                    self._commit(conn, batches)
                    with self._cond:
                        self.backlog -= sum(chunk[1] for batch in batches for chunk in batch)
                        self._committed = target
                        self._cond.notify_all()
                if self._journal and materializer is not None:
                    self._materialize(materializer, time.monotonic(), everything=stopping)
                if stopping and not self.inbox and not self.events and not self._journal:
                    break
            if self.ship is not None:
                self.ship(self._ship_seq, encode_shipment(Shipment(self._ship_seq, end=True)), True)
        except BaseException as exc:
            self._fail(exc)
        finally:
            if conn is not None:
                conn.close()
            with self._cond:
                self._cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        log.error("recording stopped", session=self.session_id, error=repr(exc))
        with self._cond:
            self._cond.notify_all()

    def _loop_idle(self, now: float) -> bool:
        """Was the event loop's thread less than half busy over the last window, and did its
        ticker wake on time (within ``_LATE``) throughout, or nearly idle?

        A window is at least 50 ms during which this thread did not materialize: while it
        materializes it holds the GIL, and the loop thread's CPU time would then understate
        how busy the loop wants to be. CPU time alone also reads a loop the kernel keeps
        waiting for a core as idle: on a loaded 2-vCPU machine (load 5) the writer took that
        for idleness and materialized 60-67 chunks (0.5 s of GIL) inside a 3,000-email
        pipeline run, against 1-3 on a quiet one. A late ticker is a loop with work waiting,
        unless the loop used under ``_IDLE_SHARE`` of a core: a loaded machine delays an idle
        loop's ticks too, and the journal must keep moving for readers of a long run.

        The driver of a multi-process run also needs a spare core on the machine
        (``_SPARE_CORES``, where the platform says): its loop idles while its nodes work,
        and on one machine its materializing took their cores. In a 3,000-email NATS run on
        a 2-vCPU VM it materialized ~200 chunks (~0.4 s of CPU) inside the run, against 3-5
        with this check; the rest waits for a spare core or for ``finish``."""
        if self.loop_clock is None:
            return False
        try:
            cpu = time.clock_gettime(self.loop_clock)
        except OSError:  # that thread is gone: nothing to compete with
            self.loop_clock = None
            return True
        spare = _machine_idle_s() if self.node_index else None
        mark = self._cpu_mark
        if mark is None or now - mark[0] < 0.05:
            if mark is None:
                self._cpu_mark = (now, cpu, spare)
                self.loop_late = 0.0
            return False
        share = (cpu - mark[1]) / (now - mark[0])
        idle = share < _IDLE_SHARE or (share < 0.5 and self.loop_late < _LATE)
        if idle and spare is not None and mark[2] is not None:
            idle = (spare - mark[2]) / (now - mark[0]) >= _SPARE_CORES
        self._cpu_mark = None if idle else (now, cpu, spare)
        self.loop_late = 0.0
        return idle

    def _materialize(self, materializer: Materializer, now: float, everything: bool) -> None:
        journal = self._journal
        if everything:
            while journal and materializer.step():
                journal.popleft()
                self.materialized += 1
            journal.clear()
            return
        if self._loop_idle(now):
            deadline = time.monotonic() + _MATERIALIZE_SLICE
            while journal and not self.inbox and time.monotonic() < deadline:
                if not materializer.step():
                    journal.clear()
                    break
                journal.popleft()
                self.materialized += 1
        elif now - journal[0] > self.max_lag and now - self._forced > self.max_lag:
            # Busy for long: keep the row tables moving at a trickle (one chunk per max_lag).
            self._forced = now
            if materializer.step():
                journal.popleft()
                self.materialized += 1

    def _commit(self, conn: Any, batches: list[list[Chunk]]) -> None:
        started = time.perf_counter()
        # Events are taken after the batches were handed over: a failed delivery's dead
        # letter is appended before the delivery itself, so it lands in this transaction or
        # an earlier one (materializing the delivery looks its error up there).
        events = self.events
        batch_events = [events.popleft() for _ in range(len(events))]
        sid = self.session_id
        seq = self._seq
        wall = time.time()

        dlq_rows, breaker_rows, metric_rows, shipments = [], [], [], []
        for ev in batch_events:
            kind = ev[0]
            if kind == "dlq":
                d: DeadLetter = ev[1]
                env = d.envelope
                dlq_rows.append(
                    (sid, d.entry_id * self.processes, to_db(env.id), env.topic, d.subscriber,
                     d.reason, d.error_type, d.error, d.traceback, d.attempts, d.time, 0, None,
                     None)
                )  # fmt: skip
            elif kind == "breaker":
                breaker_rows.append((sid, seq["breakers"], *ev[1:], None))
                seq["breakers"] += 1
            elif kind == "metrics":
                metric_rows.append(
                    (sid, seq["metrics"], ev[1], json.dumps(ev[2], default=safe_repr))
                )
                seq["metrics"] += 1
            elif kind == "ingest":
                shipments.append(ev)
        del batch_events

        journal_rows: list[tuple[Any, ...]] = []
        n_rows = 0
        # One journal row per chunk of up to 2,048 rows, encoded already (``_journal``).
        for batch in batches:
            for kind, count, blob in batch:
                journal_rows.append(
                    (sid, self._jseq, kind, seq[kind], count, wall, blob, self.own_node)
                )
                self._jseq += 1
                seq[kind] += count
                n_rows += count

        if self.ship is not None:
            self._ship(journal_rows, dlq_rows, breaker_rows)
            self.commits += 1
            self.rows += n_rows + len(dlq_rows) + len(breaker_rows)
            self.max_commit_s = max(self.max_commit_s, time.perf_counter() - started)
            return
        node_rows = [
            row
            for ev in shipments
            if (row := self._ingest(ev[1], ev[2], journal_rows, dlq_rows, breaker_rows))
        ]
        n_rows += sum(row[3] for row in node_rows)

        if not (dlq_rows or breaker_rows or metric_rows or node_rows):
            # The common case: one statement, its own transaction, one GIL handoff.
            insert_rows(conn, "journal", journal_rows)
        else:
            conn.execute("BEGIN")
            try:
                insert_rows(conn, "journal", journal_rows)
                insert_rows(conn, "dead_letters", dlq_rows, "INSERT OR REPLACE")
                insert_rows(conn, "breaker_transitions", breaker_rows)
                insert_rows(conn, "metrics", metric_rows)
                for row in node_rows:
                    conn.execute(
                        "INSERT INTO session_nodes VALUES (?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT (session, node) DO UPDATE SET batches = excluded.batches, "
                        "records = records + excluded.records, ended = excluded.ended, "
                        "last = excluded.last",
                        row,
                    )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        created = time.monotonic()
        self._journal.extend(created for _ in journal_rows)
        self.commits += 1
        self.rows += n_rows + len(dlq_rows) + len(breaker_rows) + len(metric_rows)
        self.max_commit_s = max(self.max_commit_s, time.perf_counter() - started)

    def continue_from(self, conn: Any) -> None:
        """Take up an existing session's positions (rows and journal chunks already stored,
        shipments applied per node), so what this writer adds goes after them."""
        sid = self.session_id
        for kind in ("envelopes", "deliveries", "effects"):
            (rows,) = conn.execute(
                f"SELECT max(seq) FROM {kind} WHERE session = ?", (sid,)
            ).fetchone()
            (chunks,) = conn.execute(
                "SELECT max(first + count - 1) FROM journal WHERE session = ? AND kind = ?",
                (sid, kind),
            ).fetchone()
            self._seq[kind] = (
                max(-1 if rows is None else rows, -1 if chunks is None else chunks) + 1
            )
        (jseq,) = conn.execute("SELECT max(seq) FROM journal WHERE session = ?", (sid,)).fetchone()
        self._jseq = 0 if jseq is None else jseq + 1
        (bseq,) = conn.execute(
            "SELECT max(seq) FROM breaker_transitions WHERE session = ?", (sid,)
        ).fetchone()
        self._seq["breakers"] = 0 if bseq is None else bseq + 1
        for node, batches in conn.execute(
            "SELECT node, batches FROM session_nodes WHERE session = ?", (sid,)
        ):
            self._applied[node] = batches

    def _ship(
        self,
        journal_rows: list[tuple[Any, ...]],
        dlq_rows: list[tuple[Any, ...]],
        breaker_rows: list[tuple[Any, ...]],
    ) -> None:
        """Ship mode: this commit's chunks and rare rows as shipments (``_shipping``), in
        order, numbered by ``_ship_seq``. Chunks keep the node's own positions; the driver
        gives them the session's."""
        chunks = [(r[2], r[4], r[5], r[6]) for r in journal_rows]
        dead = [r[1:11] for r in dlq_rows]
        breakers = [r[2:7] for r in breaker_rows]
        while True:
            take, size = 0, 0
            while take < len(chunks) and (
                take == 0 or size + len(chunks[take][3]) <= MAX_SHIPMENT_BYTES
            ):
                size += len(chunks[take][3])
                take += 1
            last = take == len(chunks)
            part = Shipment(
                self._ship_seq,
                chunks[:take],
                dead if last else [],
                breakers if last else [],
            )
            chunks = chunks[take:]
            if part.records:
                assert self.ship is not None
                self.ship(part.seq, encode_shipment(part), False)
                self._ship_seq += 1
            if last:
                return

    def _ingest(
        self,
        node: str,
        data: bytes,
        journal_rows: list[tuple[Any, ...]],
        dlq_rows: list[tuple[Any, ...]],
        breaker_rows: list[tuple[Any, ...]],
    ) -> tuple[Any, ...] | None:
        """Add one node's shipment to this commit's rows, at the session's next positions;
        returns its ``session_nodes`` row (None for a duplicate or undecodable one)."""
        try:
            shipment = decode_shipment(data)
        except ValueError as exc:
            self.bad_shipments += 1
            log.error("undecodable journal shipment dropped", node=node, error=str(exc))
            return None
        index = self.node_index.get(node)
        if index is None:
            # Only the placement's nodes are linked to the driver; anything else is a bug
            # or a forged line, and must not take another process's entry ids.
            self.bad_shipments += 1
            log.error("journal shipment from a node the run does not place dropped", node=node)
            return None
        applied = self._applied.get(node, 0)
        if shipment.seq < applied:
            return None  # delivered twice: applied already
        self._applied[node] = shipment.seq + 1
        sid = self.session_id
        seq = self._seq
        for kind, count, wall, blob in shipment.chunks:
            if kind not in ("envelopes", "deliveries", "effects"):
                self.bad_shipments += 1
                log.error("journal chunk of unknown kind dropped", node=node, kind=kind)
                continue
            journal_rows.append((sid, self._jseq, kind, seq[kind], count, wall, blob, node))
            self._jseq += 1
            seq[kind] += count
        for entry_id, *rest in shipment.dead_letters:
            dlq_rows.append((sid, entry_id * self.processes + index, *rest, 0, None, node))
        for breaker in shipment.breakers:
            breaker_rows.append((sid, seq["breakers"], *breaker, node))
            seq["breakers"] += 1
        return (sid, node, shipment.seq + 1, shipment.records, int(shipment.end), time.time())


class Recorder:
    """Records one bus run as a session: every envelope, delivery, dead letter, breaker
    transition, effect and (each second) a metrics snapshot.

    ``Recorder(store, session_id)`` creates the session row (``running``, owned by this
    process; a new id when ``session_id`` is None) and starts the writer thread.
    :meth:`attach` hooks a bus (inside its running event loop); :meth:`finish` commits
    everything and closes the session. ``async with Recorder(...) as rec`` finishes it on
    exit, ``completed`` or ``failed`` by whether the block raised.

    Writes are group-committed every ``commit_interval`` seconds (sooner once
    ``commit_rows`` rows wait). Rows handed to the writer and not committed, effects and the
    other rare rows included, are bounded by ``max_pending``: past it the ticker blocks the
    event loop until the writer is down to half, so a run that outpaces the disk slows down
    rather than losing records or growing without bound. If the writer fails (disk full...),
    recording stops, the run goes on untouched, and :meth:`finish` raises :class:`RecordingError`.
    """

    def __init__(
        self,
        store: SessionStore,
        session_id: str | None = None,
        *,
        scenario: str | None = None,
        scenario_text: str | None = None,
        seed: int | None = None,
        replay_of: str | None = None,
        kind: str = "run",
        scenario_dir: str | None = None,
        forked_from: str | None = None,
        commit_interval: float = DEFAULT_COMMIT_INTERVAL,
        commit_rows: int = DEFAULT_COMMIT_ROWS,
        max_pending: int = DEFAULT_MAX_PENDING,
        metrics_interval: float = DEFAULT_METRICS_INTERVAL,
        nodes: Sequence[str] = (),
    ) -> None:
        self._check(commit_interval, commit_rows, max_pending)
        self.store: SessionStore | None = store
        self.session_id = store.begin_session(
            session_id,
            scenario=scenario,
            scenario_text=scenario_text,
            seed=seed,
            replay_of=replay_of,
            kind=kind,
            scenario_dir=scenario_dir,
            forked_from=forked_from,
        )
        self._setup(
            _Writer(store.path, store.synchronous, self.session_id, nodes=nodes),
            seed,
            commit_interval,
            commit_rows,
            max_pending,
            metrics_interval,
        )

    @staticmethod
    def _check(commit_interval: float, commit_rows: int, max_pending: int) -> None:
        if commit_interval <= 0 or commit_rows < 1 or max_pending < 2:
            raise ValueError("commit_interval, commit_rows and max_pending must be positive")

    def _setup(
        self,
        writer: _Writer,
        seed: int | None,
        commit_interval: float,
        commit_rows: int,
        max_pending: int,
        metrics_interval: float,
    ) -> None:
        self.seed = seed
        self.commit_interval = commit_interval
        self.commit_rows = commit_rows
        self.max_pending = max_pending
        self.metrics_interval = metrics_interval
        self._writer = writer
        self._writer.start()
        # What the loop thread writes into as things happen (see ``_journal``).
        self._envelopes = EnvelopeRows(time.time(), time.monotonic_ns())
        self._deliveries = DeliveryRows()
        self._effect_rows = EffectRows()
        self._effects = EffectsContext.wrap(RecordingEffects(self._effect_rows.add, seed))
        self._bus: Bus | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._finished = False
        self._prev_context: Any = None
        self._handle: ObserverHandle | None = None
        self._last_swap = time.monotonic()
        self._waits = 0
        atexit.register(self._atexit)

    def __repr__(self) -> str:
        where = "shipped" if self.store is None else repr(str(self.store.path))
        return f"{type(self).__name__}({self.session_id!r}, store={where})"

    def ingest(self, node: str, shipment: bytes) -> None:
        """Add a shipment of node ``node``'s journal (``_shipping``) to this session: it is
        committed with this recorder's next commit. Any thread; the driver of a multi-process
        run calls it for every shipment its nodes send."""
        self._writer.events.append(("ingest", node, shipment))

    async def __aenter__(self) -> Recorder:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._finished:
            await self.finish("completed" if exc_type is None else "failed")

    @property
    def effects(self) -> EffectsContext:
        """The :class:`agents.Effects` of this session, also ``bus.context`` once attached;
        ``.runner`` is the recording (or replaying) runner behind it."""
        return self._effects

    def use_effects(self, make: Callable[[EffectSink], R]) -> R:
        """Put the runner ``make(sink)`` builds behind :attr:`effects`, in place of the
        recording one: a re-run (``pantheon.rerun``) serves effects from another session.
        ``sink`` is where the runner writes its effect rows (this session's journal).
        Before :meth:`attach` only: the bus carries the runner from then on."""
        if self._bus is not None:
            raise RuntimeError(f"{self!r} is attached already: choose its effects before")
        runner = make(self._effect_rows.add)
        self._effects = EffectsContext.wrap(runner)
        return runner

    @property
    def attached(self) -> bool:
        return self._bus is not None

    def statistics(self) -> dict[str, Any]:
        """Writer counters: rows committed, commits, rows waiting, times the loop was paused
        for ``max_pending``, slowest commit (s), journal chunks materialized."""
        w = self._writer
        return {
            "rows": w.rows,
            "commits": w.commits,
            "pending": w.pending() + self._rows(),
            "backpressure_waits": self._waits,
            "max_commit_s": w.max_commit_s,
            "materialized_chunks": w.materialized,
            "error": None if w.error is None else repr(w.error),
        }

    def attach(self, bus: Bus) -> None:
        """Start recording ``bus``: sets ``bus.session_id`` and ``bus.context`` (the effects
        runner) and hooks its publish, delivery, dead-letter and breaker listeners. Call it
        from inside the running event loop, before the team starts emitting."""
        if self._finished:
            raise RuntimeError(f"session {self.session_id} is finished")
        if self._bus is not None:
            raise RuntimeError(f"{self!r} is already attached to a bus")
        loop = asyncio.get_running_loop()
        self._bus = bus
        bus.session_id = self.session_id
        self._prev_context = bus.context
        bus.context = self._effects
        envelopes = self._envelopes
        self._handle = bus.observe(
            SimpleNamespace(
                # A bus with peers journals only its own envelopes (see ``_shipping``).
                on_publish=envelopes.add_envelope
                if type(bus.transport) is InProcessTransport
                else envelopes.add_own_envelope,
                on_delivery=self._deliveries.add_delivery,
                on_dead_letter=self._on_dead_letter,
                on_breaker=self._on_breaker,
            )
        )
        if hasattr(time, "pthread_getcpuclockid"):
            with contextlib.suppress(OSError):
                self._writer.loop_clock = time.pthread_getcpuclockid(threading.get_ident())
        self._ticker = loop.create_task(self._tick(), name=f"pantheon-recorder:{self.session_id}")

    def _on_dead_letter(self, entry: DeadLetter) -> None:
        self._writer.events.append(("dlq", entry))

    def _on_breaker(self, ev: BreakerEvent) -> None:
        self._writer.events.append(("breaker", ev.time, ev.breaker, ev.old, ev.new, ev.reason))

    def snapshot(self) -> None:
        """Queue a ``bus.stats()`` snapshot now (the ticker takes one every second)."""
        if self._bus is not None and self.store is not None:
            self._writer.events.append(("metrics", time.time(), self._bus.stats().to_dict()))

    def _rows(self) -> int:
        """Rows written on the loop thread and not handed to the writer yet."""
        return self._envelopes.rows() + self._deliveries.rows() + self._effect_rows.rows()

    def _swap(self) -> int:
        """Hand what was written to the writer (bus thread only); returns the ticket."""
        self._last_swap = time.monotonic()
        return self._writer.submit(
            self._envelopes.take() + self._deliveries.take() + self._effect_rows.take()
        )

    def _detach(self) -> None:
        bus = self._bus
        if bus is None:
            return
        self._bus = None
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if bus.context is self._effects:
            bus.context = self._prev_context

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        writer = self._writer
        next_metrics = loop.time() + self.metrics_interval
        while True:
            asleep = time.monotonic()
            await asyncio.sleep(_TICK)
            if writer.error is not None or not writer.is_alive():
                # The run goes on unrecorded; finish() reports why.
                self._detach()
                return
            now = time.monotonic()
            late = now - asleep - _TICK
            if late > writer.loop_late:
                writer.loop_late = late
            rows = self._rows()
            if (rows or writer.events) and (
                now - self._last_swap >= self.commit_interval
                or rows >= self.commit_rows
                or rows + writer.pending() > self.max_pending
            ):
                self._swap()
            if writer.pending() > self.max_pending:
                self._waits += 1
                # Deliberately blocks the loop: the only backpressure a synchronous listener
                # can apply. Waiting releases the GIL, so the writer runs flat out meanwhile.
                writer.wait_below(self.max_pending // 2)
            if loop.time() >= next_metrics:
                self.snapshot()
                next_metrics += self.metrics_interval

    async def flush(self) -> None:
        """Wait until everything recorded so far is committed (readers can see it)."""
        ticket = self._swap()
        await asyncio.to_thread(self._writer.wait, ticket)
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._writer.error is not None:
            where = "the driver" if self.store is None else self.store.path
            raise RecordingError(
                f"session {self.session_id}: recording to {where} failed: {self._writer.error!r}"
            ) from self._writer.error

    async def finish(
        self, status: Status = "completed", summary: dict[str, Any] | None = None
    ) -> None:
        """Stop recording, commit everything and close the session with ``status``
        (``completed``, ``failed`` or ``aborted``) and ``summary`` (stored as JSON).

        Raises :class:`RecordingError` if the writer failed at any point; the session is
        still closed (its summary says so)."""
        if self._finished:
            return
        if status not in ("completed", "failed", "aborted"):
            raise ValueError(f"status must be completed, failed or aborted, not {status!r}")
        self._finished = True
        atexit.unregister(self._atexit)
        self.snapshot()
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        self._swap()
        self._detach()
        await asyncio.to_thread(self._writer.close)
        if self.store is not None:
            summary = dict(summary or {})
            if self._writer.error is not None:
                summary["recording_error"] = repr(self._writer.error)
            await asyncio.to_thread(self.store.end_session, self.session_id, status, summary)
        self._raise_if_failed()

    def _atexit(self) -> None:
        # Interpreter exit without finish(): commit what is buffered; the session stays
        # 'running' and the next open of the store marks it aborted.
        with contextlib.suppress(Exception):
            self._swap()
        self._writer.close(timeout=10.0)


def import_shipments(
    store: SessionStore,
    session_id: str,
    nodes: Sequence[str],
    shipments: Sequence[tuple[str, bytes]],
) -> int:
    """Add nodes' journal shipments (``(node, bytes)``, each node's in order) to a session
    no process is recording any more, after what it holds, and materialize them; returns
    how many were applied (shipments the session has already are skipped). ``pantheon
    resume`` of a NATS run reads from the stream what its dead driver had not stored."""
    writer = _Writer(store.path, store.synchronous, session_id, nodes=nodes)
    conn = connect(store.path, store.synchronous)
    try:
        writer.continue_from(conn)
        before = sum(writer._applied.values())
        for node, data in shipments:
            writer.events.append(("ingest", node, data))
        writer._commit(conn, [])
        Materializer(conn, session_id).run()
    finally:
        conn.close()
    if writer.bad_shipments:
        log.error(
            "journal shipments dropped on import", session=session_id, count=writer.bad_shipments
        )
    return sum(writer._applied.values()) - before


def import_envelopes(
    store: SessionStore,
    session_id: str,
    envelopes: Sequence[Envelope],
    node: str | None = None,
) -> int:
    """Add envelopes a process published and never stored (it died first) to its session,
    after what the session holds: the recording process's own (``node`` None), or those of
    node ``node``, whose journal stops where it died (so a replay knows the handlings they
    came from as that node's, cut short). Those the session has already are skipped, and
    ``created`` is taken as wall-clock ns. Returns how many were added. ``pantheon resume``
    of a NATS run reads them back from the team's stream.

    Of a dead node, only the messages the rest of the record hangs on are added: the cause
    of a recorded message or the message of a recorded effect (and their causes in turn).
    Its other messages include requests its effects made (a Reasoner's Memory lookup),
    which alignment leaves out by the effect's recorded time window; those effects died
    with the node, so such a request would pass for its handler's first output and take
    the place of the real one (``pantheon.sessions._align.Mapper``)."""
    stored = store.envelopes(session_id)
    have = {e.id for e in stored}
    missing = [e for e in envelopes if e.id not in have]
    if node is not None:
        needed = {e.causation_id for e in stored}
        needed.update(f.envelope_id for f in store.effects(session_id))
        by_id = {e.id: e for e in missing}
        wanted = [i for i in needed if i in by_id]
        while wanted:  # a chain inside the dead node: what it published in its memory
            cause = by_id[wanted.pop()].causation_id
            if cause not in needed and cause in by_id:
                wanted.append(cause)
            needed.add(cause)
        missing = [e for e in missing if e.id in needed]
    if not missing:
        return 0
    # Bases 0: ``created`` is wall-clock ns already, so the chunk's wall times come out right.
    rows = EnvelopeRows(0.0, 0)
    for env in missing:
        rows.add_envelope(env)
    writer = _Writer(store.path, store.synchronous, session_id)
    writer.own_node = node
    conn = connect(store.path, store.synchronous)
    try:
        writer.continue_from(conn)
        writer._commit(conn, [rows.take()])
        Materializer(conn, session_id).run()
    finally:
        conn.close()
    return len(missing)


class ShippingRecorder(Recorder):
    """A node's recorder in a multi-process run: records its bus exactly as :class:`Recorder`
    does, but its writer ships every commit to the driver (``ship(seq, bytes, end)``, called
    on the writer thread, in order, ``end`` on the last; see ``_shipping``) instead of
    writing a store. The driver
    passes each one to its own recorder's :meth:`Recorder.ingest`. ``finish`` ships the last
    records and an end mark; the session's status and summary are the driver's."""

    def __init__(
        self,
        session_id: str,
        ship: Ship,
        *,
        seed: int | None = None,
        commit_interval: float = DEFAULT_COMMIT_INTERVAL,
        commit_rows: int = DEFAULT_COMMIT_ROWS,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self._check(commit_interval, commit_rows, max_pending)
        self.store = None
        self.session_id = session_id
        self._setup(
            _Writer(None, "", session_id, ship=ship),
            seed,
            commit_interval,
            commit_rows,
            max_pending,
            DEFAULT_METRICS_INTERVAL,
        )
